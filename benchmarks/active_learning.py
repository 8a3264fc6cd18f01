"""What `mtt learn` buys, against labelling at random: ethanol with GFN2-xTB (tblite), and
periodic copper with EMT (stress included).

    python benchmarks/active_learning.py [--system ethanol|copper] [--rounds 5] [--per-round 20]
                                         [--steps 1000] [--epochs 500] [--finetune-epochs 100]
                                         [--mode finetune|retrain]

ethanol: from 20 random structures of the shared ethanol_xtb_2000.xyz (GFN2-xTB, eV),
`mtt learn` runs ``--rounds`` rounds of MD at 500 K from those 20 structures with the
current SOAP-BPNN, labels the ``--per-round`` most uncertain, diverse frames with tblite in
a pool of two processes, and fine-tunes for ``--finetune-epochs`` (``--mode retrain``:
trains from scratch for ``--epochs``, as the starting model). The held-out set is the other 1980 structures of
the file.

copper: the same loop from 10 rattled, strained 32-atom fcc cells labelled with EMT (energy,
forces and stress), MD at 1000 K. The held-out set is 200 frames of EMT's own Langevin MD
(four runs from 500 to 1400 K, cells strained by -2 to +2 %), labelled with EMT.

The loop's result is its final model, trained from scratch on all its structures with the
starting model's settings (``train.final: retrain``, the default; with ``--mode retrain``
the last round's model). The control is a model trained the same way on the starting
structures and as many frames as the loop added, taken at random from the very MD runs of
the loop (their candidates.xyz), labelled with the same reference the same way. Reports
the held-out force and energy RMSE of the starting model, of the last fine-tuned round, of
the loop's result and of the control, their ratios, and the loop's time per stage
(labelling and the final training included). Its files go to
``.bench/active_learning/<system>/``.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ase
import ase.io
import numpy as np
from ase.build import bulk
from ase.calculators.singlepoint import SinglePointCalculator
from harness import BENCH, DATA, markdown_table

XTB = DATA / "ethanol_xtb_2000.xyz"

OPTIONS = """
seed: 3
architecture:
  name: soap_bpnn
  training: {{num_epochs: {epochs}, batch_size: 5}}
training_set:
  systems: {train}
  targets:
    energy: {{key: energy, unit: eV, forces: forces, stress: {stress}}}
validation_set: 0.2
test_set: 0.0
"""

LEARN = """
options: options.yaml
rounds: {rounds}
explore: {{start: start.xyz, temperature: {temperature}, steps: {steps}, timestep: {timestep}, every: 10}}
select: {{max_per_round: {per_round}}}
label: {{calculator: "{calculator}", parameters: {parameters}, processes: 2}}
train: {{mode: {mode}, overrides: [architecture.training.num_epochs={round_epochs}]}}
"""


@dataclass
class System:
    start: list[ase.Atoms]
    held_out: list[ase.Atoms]
    calculator: str  # module:Class
    parameters: str  # YAML
    temperature: float  # K, of the loop's MD
    timestep: float  # fs
    stress: bool

    def reference(self):
        module, name = self.calculator.split(":")
        calculator = getattr(__import__(module, fromlist=[name]), name)
        return calculator(**({"method": "GFN2-xTB", "verbosity": 0} if "tblite" in module else {}))


def labelled(frames: list[ase.Atoms], calculator, stress: bool) -> list[ase.Atoms]:
    """Copies of ``frames`` with the reference's results, each in its own calculator
    (a shared one would write the last structure's results into every frame)."""
    result = []
    for atoms in frames:
        atoms = atoms.copy()
        atoms.calc = calculator
        values = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        if stress:
            values["stress"] = atoms.get_stress()
        atoms.calc = SinglePointCalculator(atoms, **values)
        result.append(atoms)
    return result


def ethanol() -> System:
    if not XTB.is_file():
        sys.exit(f"the shared dataset is not at {XTB}")
    frames = ase.io.read(XTB, ":")
    order = np.random.default_rng(11).permutation(len(frames))
    return System(
        start=[frames[i] for i in order[:20]],
        held_out=[frames[i] for i in order[20:]],
        calculator="tblite.ase:TBLite",
        parameters="{method: GFN2-xTB, verbosity: 0}",
        temperature=500,
        timestep=0.5,
        stress=False,
    )


def copper() -> System:
    from ase.calculators.emt import EMT
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    rng = np.random.default_rng(4)
    cells = []
    for i in range(10):
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
        atoms.rattle(0.05 + 0.005 * i, rng=rng)
        atoms.set_cell(atoms.cell * (1 + 0.01 * rng.standard_normal()), scale_atoms=True)
        cells.append(atoms)
    held_out = []
    for k, (temperature, strain) in enumerate([(500, -0.02), (800, 0.0), (1100, 0.01), (1400, 0.02)]):
        atoms = bulk("Cu", "fcc", a=3.61 * (1 + strain), cubic=True).repeat((2, 2, 2))
        atoms.calc = EMT()
        MaxwellBoltzmannDistribution(atoms, temperature_K=temperature, rng=np.random.default_rng(k))
        dynamics = Langevin(atoms, 2 * ase.units.fs, temperature_K=temperature, friction=0.02, rng=rng)
        dynamics.run(200)
        for _ in range(50):
            dynamics.run(20)
            held_out.append(atoms.copy())
    emt = EMT()
    return System(
        start=labelled(cells, emt, True),
        held_out=labelled(held_out, emt, True),
        calculator="ase.calculators.emt:EMT",
        parameters="{}",
        temperature=1000,
        timestep=2.0,
        stress=True,
    )


def held_out_errors(checkpoint: Path, frames: list[ase.Atoms]) -> tuple[float, float]:
    """Force RMSE (eV/Å) and energy RMSE (meV/atom) of a checkpoint on ``frames``."""
    from mtt.learning.predictor import UncertainForces

    predicted = UncertainForces(checkpoint).predict_frames(frames, batch_size=64, uncertainty=False)
    forces = np.concatenate([a.get_forces() for a in frames])
    energies = np.array([a.get_potential_energy() for a in frames])
    sizes = np.array([len(a) for a in frames])
    force_rmse = float(np.sqrt(np.mean((np.concatenate(predicted.forces) - forces) ** 2)))
    energy_rmse = float(np.sqrt(np.mean(((predicted.energies - energies) / sizes) ** 2))) * 1000
    return force_rmse, energy_rmse


def last_checkpoint(folder: Path) -> Path:
    return sorted(folder.glob("outputs/*/*/model.ckpt"), key=lambda p: p.stat().st_mtime)[-1]


def fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=["ethanol", "copper"], default="ethanol")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=500, help="of the starting model and the control")
    parser.add_argument("--finetune-epochs", type=int, default=100, help="of each round's fine-tuning")
    parser.add_argument(
        "--mode", choices=["finetune", "retrain"], default="finetune", help="train.mode: retrain takes --epochs"
    )
    args = parser.parse_args()
    system = ethanol() if args.system == "ethanol" else copper()
    work = BENCH / "active_learning" / args.system
    stress = "stress" if system.stress else "off"

    loop = fresh(work / "loop")
    ase.io.write(loop / "start.xyz", system.start, format="extxyz")
    (loop / "options.yaml").write_text(OPTIONS.format(epochs=args.epochs, train="start.xyz", stress=stress))
    (loop / "learn.yaml").write_text(
        LEARN.format(
            rounds=args.rounds,
            steps=args.steps,
            per_round=args.per_round,
            mode=args.mode,
            round_epochs=args.finetune_epochs if args.mode == "finetune" else args.epochs,
            temperature=system.temperature,
            timestep=system.timestep,
            calculator=system.calculator,
            parameters=system.parameters,
        )
    )
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "mtt", "learn", "learn.yaml"], cwd=loop, check=True)
    loop_seconds = time.monotonic() - started

    rows = list(csv.DictReader((loop / "learn" / "learning.csv").open()))
    final = rows[-1]["round"] == "final"
    rounds = [row for row in rows if row["round"] != "final"]
    last = int(rounds[-1]["round"])
    added = sum(int(row["added"]) for row in rounds)
    stages = {
        stage: sum(float(row[f"{stage}_s"]) for row in rounds) for stage in ("explore", "select", "label", "train")
    }
    if final:
        stages["final training"] = float(rows[-1]["train_s"])

    # the control: as many frames, at random, from the same MD runs, labelled by the same reference
    candidates = [
        a for n in range(1, last + 1) for a in ase.io.read(loop / "learn" / f"round_{n}" / "candidates.xyz", ":")
    ]
    picked = np.random.default_rng(5).choice(len(candidates), added, replace=False)
    chosen = labelled([candidates[i] for i in picked], system.reference(), system.stress)
    control = fresh(work / "control")
    ase.io.write(control / "train.xyz", system.start + chosen, format="extxyz")
    (control / "options.yaml").write_text(OPTIONS.format(epochs=args.epochs, train="train.xyz", stress=stress))
    subprocess.run([sys.executable, "-m", "mtt", "train", "options.yaml"], cwd=control, check=True)

    start_count = len(system.start)
    results = {
        f"starting model ({start_count} structures)": held_out_errors(
            last_checkpoint(loop / "learn" / "round_0"), system.held_out
        ),
        f"mtt learn, round {last} ({args.mode})": held_out_errors(
            last_checkpoint(loop / "learn" / f"round_{last}"), system.held_out
        ),
        f"mtt learn's result: {'final training' if final else f'round {last}'} ({start_count + added} structures)": (
            held_out_errors(last_checkpoint(loop / "learn" / ("final" if final else f"round_{last}")), system.held_out)
        ),
        f"control: {added} random MD frames ({start_count + added} structures)": held_out_errors(
            last_checkpoint(control), system.held_out
        ),
    }
    (start_f, start_e), (round_f, round_e), (learn_f, learn_e), (control_f, control_e) = results.values()
    print(f"\n{args.system}, held-out: {len(system.held_out)} structures\n")
    print(
        markdown_table(
            ["model", "force RMSE [eV/Å]", "energy RMSE [meV/atom]"],
            [(name, f"{f:.4f}", f"{e:.2f}") for name, (f, e) in results.items()],
            "lrr",
        )
    )
    print(
        f"\nforce RMSE ratios: mtt learn / starting model {learn_f / start_f:.2f} (goal <= 0.5), "
        f"mtt learn / control {learn_f / control_f:.2f} (goal <= 0.8); energy: {learn_e / start_e:.2f} and "
        f"{learn_e / control_e:.2f}; round {last} / control: forces {round_f / control_f:.2f}, "
        f"energy {round_e / control_e:.2f}\n"
    )
    print(
        markdown_table(
            ["stage", "seconds"],
            [(stage, f"{seconds:.0f}") for stage, seconds in stages.items()]
            + [("whole loop (round 0, final training and start-up included)", f"{loop_seconds:.0f}")],
            "lr",
        )
    )


if __name__ == "__main__":
    main()
