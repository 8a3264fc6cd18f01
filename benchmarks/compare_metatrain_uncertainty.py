"""mtt's last-layer uncertainty (LLPR) against metatrain 2026.4.1's, side by side, on the
shared xTB ethanol: how good the uncertainties are and what they cost.

    python benchmarks/compare_metatrain_uncertainty.py [--epochs 60] [--repeats 3] [--md-rounds 2]
                                                       [--steps 300]

The data and split are those of benchmarks/uncertainty.py (``write_sets``): 300 training and
50 validation structures of ethanol_xtb_2000.xyz, 300 held-out structures of the same
trajectories, and the same structures rattled by 0.1 and 0.2 Å. Both tools train SOAP-BPNN
from one options file (metatrain's format, which mtt reads unchanged; metatrain's SOAP-BPNN
defaults written out, float32, batch 10, ``--epochs``, energies and forces in eV and eV/Å),
``--repeats`` times each with the seeds 7, 8, ..., the tools alternating.

- mtt fits its uncertainty at the end of the training run (``energy_uncertainty`` and an
  ``energy_ensemble`` of 16, the ensemble's spread calibrated on the validation forces).
  ``mtt calibrate`` fits it again from the checkpoint in a process of its own, metatrain's way,
  for its cost only (the model evaluated is the training run's).
- metatrain adds its LLPR with a second ``mtt train`` of its ``llpr`` architecture on the
  checkpoint, with the same data (LLPR_OPTIONS): metatrain's defaults (regularizer ``null``,
  the smallest that makes the covariance's Cholesky decomposition work; calibration
  ``absolute_residuals``; no gradient-based training of the ensemble, ``num_epochs: null``)
  except ``num_ensemble_members: {energy: 16}`` (by default it has no ensemble, hence no force
  uncertainty) and ``batch_size: 10``.

Both models are judged by one piece of code, in one process of the metatrain environment
(EVALUATE; metatomic-torch, metatomic-ase, vesin, ase and torch are the same versions in both
environments, which the script checks; ``import sphericart.torch`` is needed for the forces of
metatrain's SOAP-BPNN, whose spherical harmonics register their backward from Python only):
metatomic's ASE calculator asks each exported model for ``energy`` and ``energy_uncertainty``
per structure, and ``examples/ensemble_calculator.py`` gives its forces and the spread of the
16 members' forces (a structure's force uncertainty: the RMS of the spread over atoms and
components, beside its force RMSE). The figures, per training run, for the energy and the
forces: the Spearman rank correlation of |error| and uncertainty on the held-out structures,
the ROC AUC of telling the rattled structures (0.1 and 0.2 Å) from the held-out ones by
their uncertainty, and calibration: the observed RMSE in ten bins of 30 held-out structures
by predicted uncertainty, as a ratio to the bin's RMS prediction (each bin's ratio, and the
worst bin's factor, max(ratio, 1 / ratio)), and the same ratio over all 300. Tables give
medians [min, max] over the training runs, the ratio of the medians, and whether mtt's median
is at least as good as metatrain's (higher Spearman, AUC and steps/s; lower worst-bin factor,
RMSE, seconds and cost; a ratio nearer 1), saying where the two ranges overlap.

The cost: the fit's own time (mtt: its training log, 0.1 s resolution; metatrain: from
"Computing LLPR covariance matrix" to "LLPR complete!" in its log, stamped to the
millisecond), the wall time of the separate command (``mtt calibrate`` against metatrain's
``llpr`` training), and ASE MD of one ethanol molecule, each run in a fresh process of the
metatrain environment, ``--md-rounds`` rounds per training run with the order of the six
cases (two models, three calculators) reversed every other round: metatomic's calculator with
``uncertainty_threshold=None`` (energy and forces only), with ``uncertainty_threshold=1000``
(it asks for the per-atom ``energy_uncertainty`` at every step, as with its default of 0.1 eV,
but warns of none: some atoms of either model exceed 0.1 eV, and the timings would include
the warnings), and ``EnsembleCalculator`` (the forces of
the 16 members). A cost is the time per step relative to energy only, of runs of the same
round.

Every training, fit and MD process runs single-threaded (``OMP_NUM_THREADS=1``, and
``torch.set_num_threads(1)`` in the processes this script writes): all timings are of one
thread. Its files go to .bench/compare_metatrain_uncertainty/ (the tables also to its
results.md); the first run creates .bench/metatrain (see compare_metatrain.py). It takes
about 15 minutes with the defaults, most of it metatrain's trainings (about 110 s each).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
from compare_metatrain import METATRAIN, METATRAIN_MS, VENV
from harness import (
    BENCH,
    ROOT,
    TORCH,
    alternate,
    ase_md_rates,
    markdown_table,
    median_min_max,
    mtt_train,
    run_folder,
    spread,
    timed_run,
    tool_venv,
)
from uncertainty import calibration_bins, roc_auc, spearman, write_sets

WORK = BENCH / "compare_metatrain_uncertainty"
EXAMPLES = ROOT / "examples"
TOOLS = ("mtt", "metatrain")
QUANTITIES = {"energy": "meV", "forces": "meV/Å"}

DATASETS = """
training_set:
  systems: {{read_from: {train}, length_unit: angstrom}}
  targets:
    energy: {{key: energy, unit: eV, forces: {{key: forces}}}}
validation_set:
  systems: {{read_from: {validation}, length_unit: angstrom}}
  targets:
    energy: {{key: energy, unit: eV, forces: {{key: forces}}}}
test_set: 0.0
"""
# both tools read it: metatrain's SOAP-BPNN defaults, written out for mtt
OPTIONS = """
seed: {seed}
base_precision: 32
architecture:
  name: soap_bpnn
  model:
    soap: {{max_angular: 6, max_radial: 7, cutoff: {{radius: 5.0, width: 0.5}}}}
    bpnn: {{num_hidden_layers: 2, num_neurons_per_layer: 32, layernorm: true}}
  training:
    batch_size: 10
    num_epochs: {epochs}
    learning_rate: 0.001
    log_interval: 1
    checkpoint_interval: 1000
"""
# metatrain's LLPR on the checkpoint of its training: its defaults, but an ensemble of 16
LLPR_OPTIONS = """
seed: {seed}
base_precision: 32
architecture:
  name: llpr
  model:
    num_ensemble_members: {{energy: 16}}
  training:
    model_checkpoint: {checkpoint}
    batch_size: 10
"""

# one process (the metatrain environment) for both models: argv[1] is a JSON of
# {"models": {tool: model.pt}, "sets": {name: xyz}, "out": npz}
EVALUATE = """
import json, sys
from pathlib import Path
import ase.io, numpy as np, torch
import sphericart.torch  # the backward of metatrain's spherical harmonics, registered from Python
torch.set_num_threads(1)
sys.path.insert(0, {examples!r})
from ensemble_calculator import EnsembleCalculator
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

request = json.loads(sys.argv[1])
per_structure = {{name: ModelOutput(sample_kind="system") for name in ("energy", "energy_uncertainty")}}
arrays = {{}}
for tool, model in request["models"].items():
    extensions = str(Path(model).parent / "extensions")
    calculator = MetatomicCalculator(model, extensions_directory=extensions, uncertainty_threshold=None)
    ensemble = EnsembleCalculator(model, extensions_directory=extensions)
    for name, path in request["sets"].items():
        frames = ase.io.read(path, ":")
        outputs = calculator.run_model(frames, per_structure)
        values = {{k: v.block().values[:, 0].detach().double().numpy() for k, v in outputs.items()}}
        force_error, force_sigma = [], []
        for atoms in frames:
            reference = atoms.calc.results if atoms.calc is not None else {{}}
            copy = atoms.copy()
            copy.calc = ensemble
            forces = copy.get_forces()
            force_sigma.append(copy.calc.results["force_uncertainty"])
            if "forces" in reference:
                force_error.append(np.sqrt(((forces - reference["forces"]) ** 2).mean()))
        arrays[f"{{tool}}/{{name}}/energy_sigma"] = values["energy_uncertainty"]
        arrays[f"{{tool}}/{{name}}/forces_sigma"] = np.array(force_sigma)
        if "energy" in (frames[0].calc.results if frames[0].calc is not None else {{}}):
            reference = np.array([atoms.calc.results["energy"] for atoms in frames])
            arrays[f"{{tool}}/{{name}}/energy_error"] = values["energy"] - reference
            arrays[f"{{tool}}/{{name}}/forces_error"] = np.array(force_error)
np.savez(request["out"], **arrays)
"""

# the MD of one model (harness.MD_RATE): the first held-out structure
MD = """
import sys
import sphericart.torch
import torch
torch.set_num_threads(1)
sys.path.insert(0, {examples!r})
from ensemble_calculator import EnsembleCalculator
from metatomic_ase import MetatomicCalculator
def systems():
    atoms = ase.io.read({structure!r}, 0)
    atoms.calc = {calculator}({model!r}, extensions_directory={extensions!r}{extra})
    yield atoms, {steps}
"""
MD_CASES = {
    "energy only": ("MetatomicCalculator", ", uncertainty_threshold=None"),
    "with energy uncertainty": ("MetatomicCalculator", ", uncertainty_threshold=1000.0"),
    "force ensemble of 16": ("EnsembleCalculator", ""),
}
# packages that both environments must have in the same versions, the evaluation and MD
# running in metatrain's for both models
SHARED = ("torch", "metatomic-torch", "metatomic-ase", "metatensor-torch", "vesin", "ase")


def versions(python: str) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    return json.loads(subprocess.run([python, "-c", code, *SHARED], check=True, capture_output=True, text=True).stdout)


def fresh(folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def train(tool: str, folder: Path, options: str) -> dict:
    """Train SOAP-BPNN with ``tool`` in ``folder``: wall time, and for mtt the fit of its
    uncertainty (seconds, and what it found)."""
    (fresh(folder) / "options.yaml").write_text(options)
    command = (
        mtt_train() if tool == "mtt" else [str(VENV / "bin" / "python"), "-c", METATRAIN_MS, "train", "options.yaml"]
    )
    result, wall, _ = timed_run(command, folder)
    if result.returncode != 0:
        raise SystemExit(f"{tool} training failed in {folder}:\n{result.stderr[-3000:]}")
    measured = {"train wall": wall}
    if tool == "mtt":
        measured.update(_mtt_fit(run_folder(folder) / "train.log"))
    return measured


def _mtt_fit(log: Path) -> dict:
    line = next(line for line in log.read_text().splitlines() if " INFO uncertainty: " in line)
    fit = line.split(" INFO uncertainty: ", 1)[1]
    return {"fit": float(re.search(r"fitted in ([\d.]+) s", fit).group(1)), "fit text": fit}


def add_uncertainty(tool: str, folder: Path, trained: Path, options: str, datasets: str, seed: int) -> dict:
    """The separate command that fits the uncertainty of the model trained in ``trained``:
    ``mtt calibrate`` (for its cost) or metatrain's ``llpr`` training (which makes the model
    that is evaluated): its wall time and the fit's own."""
    fresh(folder)
    if tool == "mtt":
        (folder / "options.yaml").write_text(options)
        checkpoint = run_folder(trained) / "model.ckpt"
        command = [sys.executable, "-m", "mtt", "calibrate", str(checkpoint), "options.yaml", "-o", "model.pt"]
    else:
        (folder / "options.yaml").write_text(
            LLPR_OPTIONS.format(seed=seed, checkpoint=trained / "model.ckpt") + datasets
        )  # fmt: skip
        command = [str(VENV / "bin" / "python"), "-c", METATRAIN_MS, "train", "options.yaml"]
    result, wall, _ = timed_run(command, folder)
    if result.returncode != 0:
        raise SystemExit(f"{tool}: adding the uncertainty failed in {folder}:\n{result.stderr[-3000:]}")
    if tool == "mtt":
        return {
            "command wall": wall,
            **{f"calibrate {k}": v for k, v in _mtt_fit(run_folder(folder) / "calibrate.log").items()},
        }
    text = result.stdout + result.stderr
    stamps = {}
    for key, marker in (("start", "Computing LLPR covariance matrix"), ("end", "LLPR complete!")):
        stamp = re.search(rf"^\[(\S+ \S+)\]\[INFO\] - {re.escape(marker)}", text, re.M).group(1)
        stamps[key] = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")
    regularizer = re.search(r"Used regularization parameter of (\S+)", text)
    return {
        "command wall": wall,
        "fit": (stamps["end"] - stamps["start"]).total_seconds(),
        "fit text": f"regularizer {regularizer.group(1) if regularizer else '?'}",
    }


def evaluate(models: dict[str, Path], paths: dict[str, Path], out: Path) -> dict[str, np.ndarray]:
    sets = {name: str(paths[name]) for name in ("held_out", "rattled_0.1", "rattled_0.2")}
    request = json.dumps({"models": {k: str(v) for k, v in models.items()}, "sets": sets, "out": str(out)})
    script = EVALUATE.format(examples=str(EXAMPLES))
    result = subprocess.run([str(VENV / "bin" / "python"), "-c", script, request], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the evaluation failed:\n{result.stderr[-3000:]}")
    with np.load(out) as data:
        return dict(data)


def figures(arrays: dict[str, np.ndarray], tool: str) -> tuple[dict[str, float], dict[str, list]]:
    """The figures of one model (meV and meV/Å), and its calibration bins per quantity."""
    found, bins = {}, {}
    for quantity in QUANTITIES:
        sigma = arrays[f"{tool}/held_out/{quantity}_sigma"]
        error = arrays[f"{tool}/held_out/{quantity}_error"]
        found[f"{quantity} RMSE ({QUANTITIES[quantity]})"] = 1000 * float(np.sqrt((error**2).mean()))
        found[f"{quantity} Spearman |error| vs uncertainty"] = spearman(np.abs(error), sigma)
        for amplitude in ("0.1", "0.2"):
            rattled = arrays[f"{tool}/rattled_{amplitude}/{quantity}_sigma"]
            found[f"{quantity} ROC AUC rattled {amplitude} Å"] = roc_auc(sigma, rattled)
        bins[quantity] = [(1000 * p, 1000 * o, n) for p, o, n in calibration_bins(sigma, error)]
        ratios = [o / p for p, o, _ in bins[quantity]]
        found[f"{quantity} calibration, worst bin (factor)"] = max(max(r, 1 / r) for r in ratios)
        found[f"{quantity} observed / predicted, all"] = float(np.sqrt((error**2).mean() / (sigma**2).mean()))
    return found, bins


def md_rate(model: Path, case: str, structure: Path, steps: int) -> float:
    calculator, extra = MD_CASES[case]
    setup = MD.format(
        examples=str(EXAMPLES), structure=str(structure), calculator=calculator, model=str(model),
        extensions=str(model.parent / "extensions"), extra=extra, steps=steps,
    )  # fmt: skip
    return ase_md_rates(setup, warmup=30, python=str(VENV / "bin" / "python"))[-1]


def goodness(name: str) -> Callable[[float], float] | None:
    """How good a value of the figure ``name`` is (higher is better), for the verdict column."""
    if name.endswith("(steps/s)") or "Spearman" in name or "ROC AUC" in name:
        return lambda value: value
    if "observed / predicted" in name:  # calibrated: 1
        return lambda value: -abs(math.log(value))
    if "cost" in name or "RMSE" in name or "worst bin" in name or name.endswith("(s)"):
        return lambda value: -value
    return None


def verdict(name: str, ours: list[float], theirs: list[float]) -> str:
    """Whether mtt's median is at least as good as metatrain's (and whether their ranges overlap)."""
    score = goodness(name)
    if score is None:
        return "-"
    (median, low, high), (their_median, their_low, their_high) = median_min_max(ours), median_min_max(theirs)
    good = "yes" if score(median) >= score(their_median) else "no"
    return good + (" (ranges overlap)" if low <= their_high and their_low <= high else "")


def number(value: float) -> str:
    """Three significant digits, trailing zeros kept (1.00), whole numbers from 1000."""
    return f"{value:#.3g}".rstrip(".") if abs(value) < 1000 else f"{value:.0f}"


def side_by_side(results: dict[tuple[str, str], list[float]], names: list[str]) -> str:
    rows = []
    for name in names:
        ours, theirs = results[("mtt", name)], results[("metatrain", name)]
        ratio = statistics.median(ours) / statistics.median(theirs)
        write = "{:.4f}".format if "ROC AUC" in name else number  # AUCs near 1: four decimals
        rows.append((name, spread(ours, write), spread(theirs, write), f"{ratio:.3f}", verdict(name, ours, theirs)))
    return markdown_table(["figure", "mtt", "metatrain", "mtt / metatrain", "mtt at least as good"], rows, "lrrrl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="training runs of each tool (seeds 7, 8, ...)")
    parser.add_argument("--md-rounds", type=int, default=2, help="MD runs of each case per training run")
    parser.add_argument("--steps", type=int, default=300, help="MD steps per run")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # every process below: one thread
    started = datetime.now()
    tool_venv(VENV, "mtt", [TORCH, METATRAIN, "metatomic-ase"])
    ours, theirs = versions(sys.executable), versions(str(VENV / "bin" / "python"))
    if ours != theirs:
        raise SystemExit(f"the two environments differ: mtt's {ours}, metatrain's {theirs}")
    paths = write_sets(folder=WORK / "data")
    datasets = DATASETS.format(train=paths["train"], validation=paths["validation"])
    results: dict[tuple[str, str], list[float]] = {}
    bins: dict[tuple[str, str], list[list]] = {}
    notes = []

    def record(tool: str, name: str, value: float) -> None:
        results.setdefault((tool, name), []).append(value)

    for repeat in range(args.repeats):
        seed = 7 + repeat
        options = OPTIONS.format(seed=seed, epochs=args.epochs) + datasets
        run = WORK / f"run_{seed}"
        for tool in alternate(TOOLS, repeat):
            measured = train(tool, run / tool, options)
            record(tool, "training wall (s, context)", measured["train wall"])
            if tool == "mtt":
                record(tool, "fit (s)", measured["fit"])
                notes.append(f"seed {seed} mtt: {measured['fit text']}")
            print(f"  seed {seed}: {tool} trained in {measured['train wall']:.0f} s", file=sys.stderr, flush=True)
        for tool in alternate(TOOLS, repeat + 1):
            measured = add_uncertainty(tool, run / f"{tool}_uncertainty", run / tool, options, datasets, seed)
            record(tool, "separate command (s)", measured["command wall"])
            if tool == "metatrain":
                record(tool, "fit (s)", measured["fit"])
                notes.append(f"seed {seed} metatrain LLPR: {measured['fit text']}")
            else:
                notes.append(f"seed {seed} mtt calibrate: fit {measured['calibrate fit']} s")
        models = {"mtt": run / "mtt" / "model.pt", "metatrain": run / "metatrain_uncertainty" / "model.pt"}
        arrays = evaluate(models, paths, run / "predictions.npz")
        for tool in TOOLS:
            found, tool_bins = figures(arrays, tool)
            for name, value in found.items():
                record(tool, name, value)
            for quantity, rows in tool_bins.items():
                bins.setdefault((tool, quantity), []).append(rows)
        rates: dict[tuple[str, str], list[float]] = {}
        cases = [(tool, case) for case in MD_CASES for tool in TOOLS]
        for round_ in range(args.md_rounds):
            for tool, case in alternate(cases, repeat * args.md_rounds + round_):
                rates.setdefault((tool, case), []).append(md_rate(models[tool], case, paths["held_out"], args.steps))
        for tool in TOOLS:
            only = rates[(tool, "energy only")]
            for case in MD_CASES:
                for value in rates[(tool, case)]:
                    record(tool, f"MD {case} (steps/s)", value)
                if case != "energy only":
                    for base, other in zip(only, rates[(tool, case)]):
                        record(tool, f"MD {case}: cost (x energy only)", base / other)
        print(f"  seed {seed}: done ({(datetime.now() - started).seconds} s)", file=sys.stderr, flush=True)

    quality = [name for (tool, name) in results if tool == "mtt" and name.startswith(tuple(QUANTITIES))]
    cost = ["fit (s)", "separate command (s)"]
    cost += [name for (tool, name) in results if tool == "mtt" and name.startswith("MD ")]
    cost += ["training wall (s, context)"]
    output = [
        f"mtt vs metatrain 2026.4.1, LLPR of SOAP-BPNN on xTB ethanol (300 training, 50 validation, 300 "
        f"held-out structures), {args.epochs} epochs, {args.repeats} training runs each (seeds 7 to "
        f"{6 + args.repeats}), medians [min, max]; single-threaded; {datetime.now():%Y-%m-%d}",
        "",
        "Uncertainty on the held-out structures (forces: a structure's force RMSE against its force uncertainty)",
        "",
        side_by_side(results, quality),
        "",
        "Calibration: observed RMSE / RMS predicted uncertainty in ten bins of 30 held-out structures, from the "
        "least uncertain (medians [min, max] over the runs)",
        "",
    ]
    rows = []
    for quantity, unit in QUANTITIES.items():
        for k in range(10):
            cells = []
            for tool in TOOLS:
                runs = [rows_[k] for rows_ in bins[(tool, quantity)]]
                cells += [spread([p for p, _, _ in runs], number), spread([o / p for p, o, _ in runs], "{:.2f}".format)]
            rows.append((f"{quantity} ({unit})", k + 1, *cells))
    output += [
        markdown_table(
            [
                "quantity",
                "bin",
                "mtt predicted",
                "mtt observed / predicted",
                "metatrain predicted",
                "metatrain observed / predicted",
            ],
            rows,
            "lrrrrr",
        ),  # fmt: skip
        "",
        f"Cost: the fit, the separate command that adds it to a trained model (mtt calibrate; metatrain's llpr "
        f"training), and ASE MD of one ethanol molecule ({args.steps} steps, {args.md_rounds} runs per case per "
        f"training run)",
        "",
        side_by_side(results, cost),
        "",
        *notes,
    ]
    load = os.getloadavg()[2]
    output.append(f"load average over the last 15 minutes at the end: {load:.1f} on {os.cpu_count()} cores")
    text = "\n".join(output)
    print("\n" + text)
    (WORK / "results.md").write_text(text + "\n")
    print(f"\n(took {(datetime.now() - started).seconds / 60:.1f} min)")


if __name__ == "__main__":
    main()
