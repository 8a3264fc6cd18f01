"""How good and how costly mtt's last-layer energy uncertainty is, on the shared xTB ethanol.

    python benchmarks/uncertainty.py [--architectures soap_bpnn equivariant_mp] [--epochs 60]
                                     [--repeats 3] [--steps 300]

For each architecture: train on 300 random structures of ethanol_xtb_2000.xyz (50 more for
validation, on which the uncertainty is calibrated), then ``mtt eval`` 300 held-out
structures of the same trajectories and the same structures rattled by 0.1 and 0.2 Å. It
reports the rank correlation (Spearman) of |energy error| and predicted energy
uncertainty, the negative log-likelihood and miscalibration area (as ``mtt eval`` prints
them), observed RMSE against predicted deviation in bins of 30 held-out structures, and the
ROC AUC of telling the rattled structures from the held-out ones by their uncertainty.
Then the cost in ASE MD through metatomic's calculator, in a fresh process each, the cases
alternating: steps/s with the calculator's default (it requests the per-atom
``energy_uncertainty`` at every step when a model declares it) against
``uncertainty_threshold=None`` (energy only), and the fit's own cost from the summary.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
from harness import BENCH, DATA, alternate, ase_md_rates, markdown_table, mtt_train, run_folder, spread

XTB = DATA / "ethanol_xtb_2000.xyz"
WORK = BENCH / "uncertainty"

OPTIONS = """
seed: 7
architecture:
  name: {architecture}
  training: {{num_epochs: {epochs}, batch_size: 10}}
training_set:
  systems: train.xyz
  targets:
    energy: {{key: energy, unit: eV, forces: forces}}
validation_set:
  systems: validation.xyz
  targets:
    energy: {{key: energy, unit: eV, forces: forces}}
test_set: 0.0
"""

MD = """
from metatomic_ase import MetatomicCalculator
def systems():
    atoms = ase.io.read({structure!r}, 0)
    atoms.calc = MetatomicCalculator({model!r}, extensions_directory={extensions!r}{extra})
    yield atoms, {steps}
"""


def write_sets(seed: int = 0) -> dict[str, Path]:
    """train (300), validation (50), held-out (300) and the held-out rattled by 0.1 and 0.2 Å."""
    WORK.mkdir(parents=True, exist_ok=True)
    frames = ase.io.read(XTB, ":")
    order = np.random.default_rng(seed).permutation(len(frames))
    parts = {"train": order[:300], "validation": order[300:350], "held_out": order[350:650]}
    paths = {}
    for name, indices in parts.items():
        paths[name] = WORK / f"{name}.xyz"
        ase.io.write(paths[name], [frames[i] for i in indices], format="extxyz")
    for amplitude in (0.1, 0.2):
        rattled = []
        for k, i in enumerate(parts["held_out"]):
            atoms = frames[i].copy()
            atoms.calc = None
            atoms.info = {}
            atoms.arrays = {key: value for key, value in atoms.arrays.items() if key in ("numbers", "positions")}
            atoms.rattle(amplitude, seed=k)
            rattled.append(atoms)
        paths[f"rattled_{amplitude}"] = WORK / f"rattled_{amplitude}.xyz"
        ase.io.write(paths[f"rattled_{amplitude}"], rattled, format="extxyz")
    return paths


def train(architecture: str, epochs: int, paths: dict[str, Path]) -> tuple[Path, str]:
    folder = WORK / architecture
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir()
    for name in ("train", "validation"):
        (folder / f"{name}.xyz").symlink_to(paths[name])
    (folder / "options.yaml").write_text(OPTIONS.format(architecture=architecture, epochs=epochs))
    subprocess.run(mtt_train(), cwd=folder, check=True, capture_output=True, text=True)
    log = (run_folder(folder) / "train.log").read_text().splitlines()
    fit = next(line for line in log if " INFO uncertainty: " in line)
    return folder / "model.pt", fit.split(" INFO uncertainty: ", 1)[1]


def evaluate(model: Path, structures: Path, folder: Path) -> tuple[np.ndarray, np.ndarray | None, str]:
    """Predicted energy uncertainties, energy errors (None without references), and what
    ``mtt eval`` printed of the uncertainty."""
    folder.mkdir(parents=True, exist_ok=True)
    output = subprocess.run(
        [sys.executable, "-m", "mtt", "eval", str(model), str(structures)],
        cwd=folder,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    predicted = ase.io.read(folder / "predictions.xyz", ":")
    deviations = np.array([atoms.info["energy_uncertainty"] for atoms in predicted])
    errors = None
    if "reference_energy" in predicted[0].info:
        errors = np.array([_energy(atoms) - atoms.info["reference_energy"] for atoms in predicted])
    report = " ".join(line.strip() for line in output.splitlines() if "uncertainty on" in line)
    return deviations, errors, report


def _energy(atoms: ase.Atoms) -> float:
    """The predicted energy of predictions.xyz (ASE reads ``energy`` into a calculator)."""
    return atoms.info["energy"] if "energy" in atoms.info else atoms.get_potential_energy()


def roc_auc(inside: np.ndarray, outside: np.ndarray) -> float:
    """The probability that an outside structure has a larger uncertainty than an inside one."""
    larger = (outside[:, None] > inside[None, :]).mean()
    ties = (outside[:, None] == inside[None, :]).mean()
    return float(larger + 0.5 * ties)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architectures", nargs="+", default=["soap_bpnn", "equivariant_mp"])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="MD runs per case")
    parser.add_argument("--steps", type=int, default=300, help="MD steps per run")
    args = parser.parse_args()
    paths = write_sets()
    quality, cost, calibration = [], [], []
    for architecture in args.architectures:
        model, fit = train(architecture, args.epochs, paths)
        held, errors, report = evaluate(model, paths["held_out"], WORK / architecture / "eval_held_out")
        rattled = {a: evaluate(model, paths[f"rattled_{a}"], WORK / architecture / f"eval_{a}")[0] for a in (0.1, 0.2)}
        order = np.argsort(held)
        for chunk in np.array_split(order, 10):
            calibration.append(
                (architecture, f"{np.sqrt((held[chunk] ** 2).mean()) * 1000:.2f}",
                 f"{np.sqrt((errors[chunk] ** 2).mean()) * 1000:.2f}", len(chunk))
            )  # fmt: skip
        ratios = np.sqrt((errors[order] ** 2)) / held[order]
        quality.append(
            (
                architecture,
                f"{np.sqrt((errors**2).mean()) * 1000:.1f}",
                f"{spearman(np.abs(errors), held):.2f}",
                f"{roc_auc(held, rattled[0.1]):.2f}",
                f"{roc_auc(held, rattled[0.2]):.2f}",
                f"{np.median(ratios):.2f}",
            )
        )
        print(f"{architecture}: fit {fit}\n  mtt eval: {report}", flush=True)
        extensions = str(model.parent / "extensions")
        cases = {
            "energy only": ", uncertainty_threshold=None",
            "with energy_uncertainty (default)": "",
        }
        rates: dict[str, list[float]] = {case: [] for case in cases}
        for round_ in range(args.repeats):
            for case in alternate(list(cases), round_):
                setup = MD.format(
                    structure=str(paths["held_out"]), model=str(model), extensions=extensions,
                    extra=cases[case], steps=args.steps,
                )  # fmt: skip
                rates[case].extend(ase_md_rates(setup, warmup=30))
        only, both = rates["energy only"], rates["with energy_uncertainty (default)"]
        ratios = [b / o for b, o in zip(both, only)]
        cost.append(
            (
                architecture,
                spread(only, "{:.0f}".format),
                spread(both, "{:.0f}".format),
                spread(ratios, "{:.2f}".format),
            )
        )
        seconds = re.search(r"fitted in ([\d.]+) s", fit)
        print(f"  fit: {seconds.group(1) if seconds else '?'} s", flush=True)
    print("\nEnergy uncertainty on 300 held-out xTB ethanol structures (trained on 300, calibrated on 50)\n")
    print(
        markdown_table(
            ["architecture", "energy RMSE [meV]", "Spearman |error| vs uncertainty", "ROC AUC rattled 0.1 Å",
             "ROC AUC rattled 0.2 Å", "median |error| / uncertainty"],
            quality,
            "lrrrrr",
        )
    )  # fmt: skip
    print("\nCalibration: bins of 30 held-out structures by predicted uncertainty\n")
    print(markdown_table(["architecture", "predicted [meV]", "observed RMSE [meV]", "structures"], calibration, "lrrr"))
    print(f"\nASE MD of one ethanol molecule, steps/s (median [min, max] of {args.repeats} runs)\n")
    print(markdown_table(["architecture", "energy only", "with uncertainty", "ratio"], cost, "lrrr"))


if __name__ == "__main__":
    main()
