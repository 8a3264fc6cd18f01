"""mtt against metatrain, side by side: training throughput, accuracy, memory, fixed cost
and ASE MD speed, on the shared DFT datasets.

    python benchmarks/compare_metatrain.py [--repeats 3] [--epochs 50] [--datasets ethanol qm9 carbon]
                                           [--md-steps 200] [--md-rounds 3]

The first run creates .bench/metatrain (a virtual environment with metatrain 2026.4.1, its
soap-bpnn extra and torch 2.13.0, the same torch as mtt's). Both tools train from the same
options file (metatrain's format, which mtt reads unchanged): same data and split, same
hyperparameters (metatrain's SOAP-BPNN defaults), batch 16, the same epochs and seed, and
float32, metatrain's default precision. The tools alternate, several times; the table gives
medians with min and max, and mtt / metatrain ratios. Run it with nothing else on the machine.
After each training of ethanol and carbon, the two exported models run ASE MD in turn,
``--md-rounds`` times each (an ethanol molecule, and the carbon cell repeated to 100 atoms),
and so does a model that computes next to nothing: its rate is the calculator's own
ceiling, the most any model's MD could reach in the same ASE calculator.

Run r uses the seed 42 + r for both tools. The timings do not depend on it; the test errors
do (each tool draws its own split and initial weights from it), so their min and max show
how far accuracy moves from seed to seed with only 10 test structures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from harness import (
    BENCH,
    DATA,
    TORCH,
    alternate,
    ase_md_rates,
    epoch_times,
    in_mev,
    mtt_train,
    run_folder,
    spread,
    test_errors,
    test_line,
    timed_run,
    tool_venv,
)

VENV = BENCH / "metatrain"
METATRAIN = "metatrain[soap-bpnn]==2026.4.1"


DATASETS = {
    "ethanol": ("ethanol_reduced_100.xyz", "kcal/mol", "forces: {key: forces}"),
    "qm9": ("qm9_reduced_100.xyz", "Hartree", "forces: off"),
    "carbon": ("carbon_reduced_100.xyz", "eV", "forces: {key: force}\n      virial: {key: virial}"),
}
OPTIONS = """
seed: {seed}
base_precision: 32
architecture:
  name: soap_bpnn
  model:
    soap: {{max_angular: 6, max_radial: 7, cutoff: {{radius: 5.0, width: 0.5}}}}
    bpnn: {{num_hidden_layers: 2, num_neurons_per_layer: 32, layernorm: true}}
  training:
    batch_size: 16
    num_epochs: {epochs}
    learning_rate: 0.001
    log_interval: 1
    checkpoint_interval: 1000
training_set:
  systems: {{read_from: {file}, length_unit: angstrom}}
  targets:
    energy:
      key: {key}
      unit: {unit}
      {derivatives}
validation_set: 0.1
test_set: 0.1
"""

# metatrain's own command, with log times to the millisecond instead of the second (a QM9
# run of 50 epochs lasts about 5 s, so whole seconds would leave its epoch time 20 % off)
METATRAIN_MS = (
    "import logging, sys; from metatrain.__main__ import main; "
    "stamp = logging.Formatter.formatTime; "
    "logging.Formatter.formatTime = lambda self, record, datefmt=None: "
    "stamp(self, record, datefmt) + '.%03d' % record.msecs; "
    "sys.argv[0] = 'mtt'; sys.exit(main())"
)

# the MD of one exported model (harness.MD_RATE): the first frame of the structure, repeated
MD = """
{preamble}
from metatomic_ase import MetatomicCalculator
def systems():
    atoms = ase.io.read({structure!r}, "0")
    atoms = atoms.repeat({repeat})
    atoms.calc = MetatomicCalculator("model.pt", extensions_directory="extensions")
    yield atoms, {steps}
"""


# The floor of an MD step: a metatomic model that computes next to nothing (a sum over the
# same half neighbour list as mtt's) in the same calculator. What is left of a step is the
# calculator's (neighbour list, unit conversions, ASE): no model can be faster than that.
FLOOR_MODEL = """
from typing import Dict, List, Optional
import torch
from metatensor.torch import Labels, TensorBlock, TensorMap
from metatomic.torch import AtomisticModel, ModelCapabilities, ModelMetadata, ModelOutput, NeighborListOptions, System

class PairSum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.neighbors = NeighborListOptions(cutoff=5.0, full_list=False, strict=True)

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return [self.neighbors]

    def forward(self, systems: List[System], outputs: Dict[str, ModelOutput],
                selected_atoms: Optional[Labels] = None) -> Dict[str, TensorMap]:
        energies = [(s.get_neighbor_list(self.neighbors).values ** 2).sum().reshape(1, 1) for s in systems]
        samples = Labels("system", torch.arange(len(systems), dtype=torch.int32).reshape(-1, 1))
        properties = Labels("energy", torch.zeros((1, 1), dtype=torch.int32))
        block = TensorBlock(1e-3 * torch.cat(energies), samples, [], properties)
        return {"energy": TensorMap(Labels("_", torch.zeros((1, 1), dtype=torch.int32)), [block])}

capabilities = ModelCapabilities(
    outputs={"energy": ModelOutput(quantity="energy", unit="eV", sample_kind="system")},
    atomic_types=list(range(1, 119)), interaction_range=5.0, length_unit="angstrom",
    supported_devices=["cpu"], dtype="float32",
)
AtomisticModel(PairSum().eval(), ModelMetadata(), capabilities).save("model.pt")
"""


def run_tool(tool: str, dataset: str, epochs: int, seed: int, folder: Path) -> dict:
    file, unit, derivatives = DATASETS[dataset]
    key = "U0" if dataset == "qm9" else "energy"
    (folder / "options.yaml").write_text(
        OPTIONS.format(epochs=epochs, seed=seed, file=DATA / file, key=key, unit=unit, derivatives=derivatives)
    )
    if tool == "mtt":
        command = mtt_train()
    else:
        command = [str(VENV / "bin" / "python"), "-c", METATRAIN_MS, "train", "options.yaml"]
    result, total, peak_mb = timed_run(command, folder)
    if result.returncode != 0:
        raise SystemExit(f"{tool} failed on {dataset}:\n{result.stderr[-3000:]}")
    text = result.stdout + result.stderr
    if tool == "mtt":
        run = run_folder(folder)
        # epochs 2 to N, as metatrain's figure below: the span of its epoch lines starts
        # when its first epoch is done (the first epoch's extra work counts as fixed cost)
        per_epoch = statistics.fmean(epoch_times(run)[1:])
        errors = test_errors(test_line(run))  # in meV, as mtt shows energies
        energy = errors["energy per atom rmse"][0]
        forces = errors["forces rmse"][0] if "forces rmse" in errors else None
    else:
        text += "".join(p.read_text() for p in folder.glob("outputs/*/*/train.log"))
        # the mean epoch time over the span of the epoch lines (stamped to the millisecond),
        # from the end of the first epoch to the end of the last: epochs 2 to N
        stamps = re.findall(r"^\[(\S+ \S+)\]\[INFO\] - Epoch", text, re.M)
        times = [datetime.strptime(s, "%Y-%m-%d %H:%M:%S.%f") for s in stamps]
        per_epoch = (times[-1] - times[0]).total_seconds() / (len(times) - 1)
        test = text[text.rindex("Evaluating test dataset") :]
        # metatrain prints errors in the unit it finds readable; to meV (and meV/Å)
        energy = in_mev(*re.search(r"energy RMSE \(per atom\): ([\d.e+-]+) (\S+)", test).groups())
        forces = re.search(r"(?:forces|energy_positions_gradients) RMSE: ([\d.e+-]+) (\S+)", test)
        forces = in_mev(*forces.groups()) if forces and dataset != "qm9" else None
    return {
        "s/epoch": per_epoch,
        "structures/s": 90 / per_epoch,
        "fixed s": total - per_epoch * epochs,
        "peak MB": peak_mb,
        "test E meV/atom": energy,
        "test F meV/A": forces,
    }


def md_rate(tool: str, folder: Path, structure: Path, repeat: tuple, steps: int) -> float:
    python = str(VENV / "bin" / "python") if tool == "metatrain" else sys.executable  # mtt, floor
    # metatrain's SOAP-BPNN registers its spherical-harmonics gradients from Python only
    preamble = "import sphericart.torch" if tool == "metatrain" else ""
    setup = MD.format(preamble=preamble, structure=str(structure), repeat=repeat, steps=steps)
    return ase_md_rates(setup, warmup=10, python=python, cwd=folder)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--md-steps", type=int, default=200)
    parser.add_argument(
        "--md-rounds", type=int, default=3, help="MD runs of each tool's model per training run, the tools alternating"
    )
    args = parser.parse_args()
    tool_venv(VENV, "mtt", [TORCH, METATRAIN, "metatomic-ase"])
    # MD after each training: ethanol as is, the 4-atom carbon cell repeated to 100 atoms
    md_systems = {
        "ethanol": ("MD ethanol steps/s", (1, 1, 1), args.md_steps),
        "carbon": ("MD carbon 100 atoms steps/s", (5, 5, 1), args.md_steps // 4),
    }
    results: dict[tuple, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        floor = Path(tmp) / "floor"
        floor.mkdir()
        (floor / "make_model.py").write_text(FLOOR_MODEL)  # TorchScript reads the source from a file
        subprocess.run([sys.executable, "make_model.py"], cwd=floor, check=True, capture_output=True)
        for repeat in range(args.repeats):
            for dataset in args.datasets:
                folders = {}
                for tool in ("mtt", "metatrain"):  # alternate
                    folder = folders[tool] = Path(tmp) / f"{tool}-{dataset}-{repeat}"
                    folder.mkdir()
                    measured = run_tool(tool, dataset, args.epochs, 42 + repeat, folder)
                    for name, value in measured.items():
                        results.setdefault((dataset, name, tool), []).append(value)
                    print(f"  done: {dataset} {tool} run {repeat + 1}", file=sys.stderr)
                if dataset in md_systems:
                    # short MD runs of the two models in alternation: the machine's slow
                    # phases last minutes, and would otherwise fall on one tool's run
                    name, repeat_cell, steps = md_systems[dataset]
                    folders["floor"] = floor
                    for round_ in range(args.md_rounds):
                        for tool in alternate(("mtt", "metatrain", "floor"), round_):
                            rate = md_rate(tool, folders[tool], DATA / DATASETS[dataset][0], repeat_cell, steps)
                            results.setdefault((dataset, name, tool), []).append(rate)

    print(
        f"\nmtt vs metatrain 2026.4.1, {args.epochs} epochs, {args.repeats} runs each (seeds 42 to "
        f"{41 + args.repeats}), medians [min-max]"
    )
    print(f"{'dataset':8s} {'figure':28s} {'mtt':>24s} {'metatrain':>24s} {'mtt/metatrain':>14s}")
    for dataset in args.datasets:
        names = [n for (d, n, t) in results if d == dataset and t == "mtt"]
        for name in names:
            ours, theirs = results[(dataset, name, "mtt")], results[(dataset, name, "metatrain")]
            if None in ours or None in theirs:
                continue
            cells = [spread(v, "{:.3f}".format, "-") for v in (ours, theirs)]
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"{dataset:8s} {name:28s} {cells[0]:>24s} {cells[1]:>24s} {ratio:14.2f}")
    for (dataset, name, tool), rates in results.items():
        if tool == "floor":  # what a model that costs nothing would reach
            ceiling = statistics.median(rates) / statistics.median(results[(dataset, name, "metatrain")])
            print(
                f"{dataset:8s} {name + ', floor':28s} {spread(rates, '{:.3f}'.format, '-'):>24s}{'':>25s} "
                f"{ceiling:14.2f}   (a model that computes nothing)"
            )


if __name__ == "__main__":
    main()
