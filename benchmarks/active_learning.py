"""What `mtt learn` buys on ethanol with GFN2-xTB (tblite), against labelling at random.

    python benchmarks/active_learning.py [--rounds 5] [--per-round 20] [--steps 1000]

From 20 random structures of the shared ethanol_xtb_2000.xyz (GFN2-xTB, eV), `mtt learn`
runs ``--rounds`` rounds of MD at 500 K from those 20 structures with the current SOAP-BPNN,
labels the ``--per-round`` most uncertain, diverse frames with tblite in a pool of two
processes, and fine-tunes. The held-out set is the other 1980 structures of the file. The
control is a model trained from scratch on the 20 starting structures and as many frames as
the loop added, taken at random from the very MD runs of the loop (their candidates.xyz),
labelled with tblite the same way, with the starting model's training settings. Reports the
held-out force and energy RMSE of the starting model, of the loop's last model and of the
control, their ratios, and the loop's time per stage (labelling included).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import numpy as np
from harness import BENCH, DATA, markdown_table

XTB = DATA / "ethanol_xtb_2000.xyz"
WORK = BENCH / "active_learning"

OPTIONS = """
seed: 3
architecture:
  name: soap_bpnn
  training: {{num_epochs: {epochs}, batch_size: 5}}
training_set:
  systems: {train}
  targets:
    energy: {{key: energy, unit: eV, forces: forces}}
validation_set: 0.2
test_set: 0.0
"""

LEARN = """
options: options.yaml
rounds: {rounds}
explore: {{start: start.xyz, temperature: 500, steps: {steps}, timestep: 0.5, every: 10}}
select: {{max_per_round: {per_round}}}
label: {{calculator: "tblite.ase:TBLite", parameters: {{method: GFN2-xTB, verbosity: 0}}, processes: 2}}
train: {{overrides: [architecture.training.num_epochs={finetune_epochs}]}}
"""


def held_out_errors(checkpoint: Path, frames: list[ase.Atoms]) -> tuple[float, float]:
    """Force RMSE (eV/Å) and energy RMSE (meV/atom) of a checkpoint on ``frames``."""
    from mtt.learning.predictor import UncertainForces

    predicted = UncertainForces(checkpoint).predict_frames(frames, batch_size=64)
    forces = np.concatenate([a.get_forces() for a in frames])
    energies = np.array([a.get_potential_energy() for a in frames])
    force_rmse = float(np.sqrt(np.mean((np.concatenate(predicted.forces) - forces) ** 2)))
    energy_rmse = float(np.sqrt(np.mean(((predicted.energies - energies) / 9) ** 2))) * 1000
    return force_rmse, energy_rmse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=100, help="of the starting model and the control")
    parser.add_argument("--finetune-epochs", type=int, default=40, help="of each round's fine-tuning")
    args = parser.parse_args()
    if not XTB.is_file():
        sys.exit(f"the shared dataset is not at {XTB}")
    frames = ase.io.read(XTB, ":")
    order = np.random.default_rng(11).permutation(len(frames))
    start, held_out = [frames[i] for i in order[:20]], [frames[i] for i in order[20:]]
    loop = WORK / "loop"
    if loop.exists():
        subprocess.run(["rm", "-rf", str(loop)], check=True)
    loop.mkdir(parents=True)
    ase.io.write(loop / "start.xyz", start)
    (loop / "options.yaml").write_text(OPTIONS.format(epochs=args.epochs, train="start.xyz"))
    (loop / "learn.yaml").write_text(
        LEARN.format(
            rounds=args.rounds, steps=args.steps, per_round=args.per_round, finetune_epochs=args.finetune_epochs
        )
    )
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "mtt", "learn", "learn.yaml"], cwd=loop, check=True)
    loop_seconds = time.monotonic() - started

    rows = list(csv.DictReader((loop / "learn" / "learning.csv").open()))
    last = int(rows[-1]["round"])
    added = sum(int(row["added"]) for row in rows)
    stages = {stage: sum(float(row[f"{stage}_s"]) for row in rows) for stage in ("explore", "select", "label", "train")}

    # the control: as many frames, at random, from the same MD runs, labelled by tblite
    from tblite.ase import TBLite

    candidates = [
        a for n in range(1, last + 1) for a in ase.io.read(loop / "learn" / f"round_{n}" / "candidates.xyz", ":")
    ]
    chosen = [candidates[i] for i in np.random.default_rng(5).choice(len(candidates), added, replace=False)]
    calculator = TBLite(method="GFN2-xTB", verbosity=0)
    for atoms in chosen:
        atoms.calc = calculator
        atoms.get_forces()
    control = WORK / "control"
    if control.exists():
        subprocess.run(["rm", "-rf", str(control)], check=True)
    control.mkdir(parents=True)
    ase.io.write(control / "train.xyz", start + chosen)
    (control / "options.yaml").write_text(OPTIONS.format(epochs=args.epochs, train="train.xyz"))
    subprocess.run([sys.executable, "-m", "mtt", "train", "options.yaml"], cwd=control, check=True)

    def checkpoint(folder: Path) -> Path:
        return sorted(folder.glob("outputs/*/*/model.ckpt"), key=lambda p: p.stat().st_mtime)[-1]

    results = {
        "starting model (20 structures)": held_out_errors(checkpoint(loop / "learn" / "round_0"), held_out),
        f"mtt learn, {last} rounds ({20 + added} structures)": held_out_errors(
            checkpoint(loop / "learn" / f"round_{last}"), held_out
        ),
        f"control: {added} random MD frames ({20 + added} structures)": held_out_errors(checkpoint(control), held_out),
    }
    (start_f, start_e), (learn_f, learn_e), (control_f, control_e) = results.values()
    print(f"\nheld-out: {len(held_out)} structures of {XTB.name}\n")
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
        f"{learn_e / control_e:.2f}\n"
    )
    print(
        markdown_table(
            ["stage", "seconds"],
            [(stage, f"{seconds:.0f}") for stage, seconds in stages.items()]
            + [("whole loop (round 0 and start-up included)", f"{loop_seconds:.0f}")],
            "lr",
        )
    )


if __name__ == "__main__":
    main()
