"""How good and how costly mtt's last-layer uncertainties are, on the shared xTB ethanol.

    python benchmarks/uncertainty.py [--architectures soap_bpnn equivariant_mp] [--epochs 60]
                                     [--repeats 3] [--steps 300] [--shallow nll crps]
                                     [--members 8] [--seed 7] [--no-md]

For each architecture: train on 300 random structures of ethanol_xtb_2000.xyz (50 more for
validation, on which the uncertainty is calibrated), then ``mtt eval`` 300 held-out
structures of the same trajectories and the same structures rattled by 0.1 and 0.2 Å. It
reports, for the energy and for the forces (a structure's force RMSE against its force
uncertainty, the spread of the ensemble's forces), the rank correlation (Spearman) of
error and predicted uncertainty, observed RMSE against predicted uncertainty in bins of
30 held-out structures, and the ROC AUC of telling the rattled structures from the
held-out ones by their uncertainty (``mtt eval`` prints the negative log-likelihood and
miscalibration area beside them). With ``--shallow``, each architecture is also trained with
a shallow ensemble of ``--members`` members for each loss given (``training.shallow_ensemble``), whose
trained members are then the ensemble, to compare with the one sampled from the
last-layer posterior. Then the cost in ASE MD, in a fresh process each, the
cases alternating: steps/s of metatomic's calculator with ``uncertainty_threshold=None``
(energy only), with its default (it requests the per-atom ``energy_uncertainty`` at every
step when a model declares it), and of ``examples/ensemble_calculator.py`` (energy, forces
and the forces of the 16 members, the force uncertainty), single-threaded (on a molecule of
nine atoms a second thread adds more noise than speed); and the fit's own cost.
"""

from __future__ import annotations

import argparse
import os
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
seed: {seed}
architecture:
  name: {architecture}
  training: {{num_epochs: {epochs}, batch_size: 10{extra}}}
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
import sys
sys.path.insert(0, {examples!r})
from metatomic_ase import MetatomicCalculator
from ensemble_calculator import EnsembleCalculator
def systems():
    atoms = ase.io.read({structure!r}, 0)
    atoms.calc = {calculator}({model!r}, extensions_directory={extensions!r}{extra})
    yield atoms, {steps}
"""
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def write_sets(seed: int = 0, folder: Path = WORK) -> dict[str, Path]:
    """train (300), validation (50), held-out (300) and the held-out rattled by 0.1 and 0.2 Å,
    as extended XYZ files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    frames = ase.io.read(XTB, ":")
    order = np.random.default_rng(seed).permutation(len(frames))
    parts = {"train": order[:300], "validation": order[300:350], "held_out": order[350:650]}
    paths = {}
    for name, indices in parts.items():
        paths[name] = folder / f"{name}.xyz"
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
        paths[f"rattled_{amplitude}"] = folder / f"rattled_{amplitude}.xyz"
        ase.io.write(paths[f"rattled_{amplitude}"], rattled, format="extxyz")
    return paths


def train(
    architecture: str,
    epochs: int,
    paths: dict[str, Path],
    shallow: str | None = None,
    members: int = 8,
    seed: int = 7,
) -> tuple[Path, str]:
    """Train ``architecture``, with a shallow ensemble of that loss when ``shallow`` is given."""
    folder = WORK / (architecture if shallow is None else f"{architecture}_shallow_{shallow}")
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir()
    for name in ("train", "validation"):
        (folder / f"{name}.xyz").symlink_to(paths[name])
    extra = "" if shallow is None else f", shallow_ensemble: {{members: {members}, loss: {shallow}}}"
    options = OPTIONS.format(architecture=architecture, epochs=epochs, extra=extra, seed=seed)
    (folder / "options.yaml").write_text(options)
    subprocess.run(mtt_train(), cwd=folder, check=True, capture_output=True, text=True)
    log = (run_folder(folder) / "train.log").read_text().splitlines()
    fit = next(line for line in log if " INFO uncertainty: " in line)
    return folder / "model.pt", fit.split(" INFO uncertainty: ", 1)[1]


def evaluate(model: Path, structures: Path, folder: Path) -> tuple[dict, dict, str]:
    """Predicted uncertainties and errors (empty without references) of the energy and of the
    forces (a structure's force RMSE), per structure, and what ``mtt eval`` printed of them."""
    folder.mkdir(parents=True, exist_ok=True)
    output = subprocess.run(
        [sys.executable, "-m", "mtt", "eval", str(model), str(structures)],
        cwd=folder,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    predicted = ase.io.read(folder / "predictions.xyz", ":")
    deviations = {
        "energy": np.array([atoms.info["energy_uncertainty"] for atoms in predicted]),
        "forces": np.array([atoms.info["forces_uncertainty"] for atoms in predicted]),
    }
    errors = {}
    if "reference_energy" in predicted[0].info:
        errors["energy"] = np.array([_energy(atoms) - atoms.info["reference_energy"] for atoms in predicted])
        errors["forces"] = np.array(
            [np.sqrt(((atoms.get_forces() - atoms.arrays["reference_forces"]) ** 2).mean()) for atoms in predicted]
        )
    report = "\n  ".join(line.strip() for line in output.splitlines() if "uncertainty on" in line)
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


def calibration_bins(predicted: np.ndarray, observed: np.ndarray, bins: int = 10) -> list[tuple[float, float, int]]:
    """(RMS predicted uncertainty, observed RMSE, structures) in ``bins`` bins of equal counts
    of predicted uncertainty, from the least uncertain; ``observed`` holds the errors."""
    chunks = np.array_split(np.argsort(predicted), bins)
    return [
        (float(np.sqrt((predicted[c] ** 2).mean())), float(np.sqrt((observed[c] ** 2).mean())), len(c)) for c in chunks
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architectures", nargs="+", default=["soap_bpnn", "equivariant_mp"])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="MD runs per case")
    parser.add_argument("--steps", type=int, default=300, help="MD steps per run")
    parser.add_argument(
        "--shallow", nargs="*", default=[], choices=["nll", "crps"], help="also train shallow ensembles of these losses"
    )
    parser.add_argument("--members", type=int, default=8, help="members of the shallow ensembles")
    parser.add_argument("--seed", type=int, default=7, help="the trainings' seed (the split stays)")
    parser.add_argument("--no-md", action="store_true", help="skip the MD timings")
    args = parser.parse_args()
    paths = write_sets()
    quality, cost, calibration = [], [], []
    units = {"energy": ("meV", 1000.0), "forces": ("meV/Å", 1000.0)}
    cases = [(a, loss) for a in args.architectures for loss in [None, *args.shallow]]
    for architecture, shallow in cases:
        model, fit = train(architecture, args.epochs, paths, shallow, args.members, args.seed)
        case_folder = model.parent
        if shallow is not None:
            architecture = f"{architecture}, shallow {shallow}"
        held, errors, report = evaluate(model, paths["held_out"], case_folder / "eval_held_out")
        rattled = {a: evaluate(model, paths[f"rattled_{a}"], case_folder / f"eval_{a}")[0] for a in (0.1, 0.2)}
        for quantity, (unit, scale) in units.items():
            predicted, observed = held[quantity], errors[quantity]
            for sigma, rmse, count in calibration_bins(predicted, observed):
                calibration.append((architecture, quantity, f"{sigma * scale:.2f}", f"{rmse * scale:.2f}", count))
            quality.append(
                (
                    architecture,
                    quantity,
                    f"{np.sqrt((observed**2).mean()) * scale:.1f} {unit}",
                    f"{spearman(np.abs(observed), predicted):.2f}",
                    f"{roc_auc(predicted, rattled[0.1][quantity]):.2f}",
                    f"{roc_auc(predicted, rattled[0.2][quantity]):.2f}",
                    f"{np.median(np.abs(observed) / predicted):.2f}",
                )
            )
        print(f"{architecture}: fit {fit}\n  mtt eval: {report}", flush=True)
        if args.no_md:
            continue
        extensions = str(model.parent / "extensions")
        cases = {
            "energy only": ("MetatomicCalculator", ", uncertainty_threshold=None"),
            "with energy_uncertainty (default)": ("MetatomicCalculator", ""),
            "force ensemble": ("EnsembleCalculator", ""),
        }
        rates: dict[str, list[float]] = {case: [] for case in cases}
        for round_ in range(args.repeats):
            for case in alternate(list(cases), round_):
                calculator, extra = cases[case]
                setup = MD.format(
                    structure=str(paths["held_out"]), model=str(model), extensions=extensions,
                    calculator=calculator, extra=extra, steps=args.steps, examples=str(EXAMPLES),
                )  # fmt: skip
                rates[case].extend(ase_md_rates(setup, warmup=30, env=ONE_THREAD))
        only = rates["energy only"]
        row = [architecture, spread(only, "{:.0f}".format)]
        for case in ("with energy_uncertainty (default)", "force ensemble"):
            costs = [o / b for b, o in zip(rates[case], only)]  # time per step, relative to energy only
            row += [spread(rates[case], "{:.0f}".format), spread(costs, "{:.2f}".format)]
        cost.append(tuple(row))
        seconds = re.search(r"fitted in ([\d.]+) s", fit)
        print(f"  fit: {seconds.group(1) if seconds else '?'} s", flush=True)
    print("\nUncertainty on 300 held-out xTB ethanol structures (trained on 300, calibrated on 50)\n")
    print(
        markdown_table(
            ["architecture", "quantity", "RMSE", "Spearman |error| vs uncertainty", "ROC AUC rattled 0.1 Å",
             "ROC AUC rattled 0.2 Å", "median |error| / uncertainty"],
            quality,
            "llrrrrr",
        )
    )  # fmt: skip
    print("\nCalibration: bins of 30 held-out structures by predicted uncertainty (forces: a structure's RMSE)\n")
    print(
        markdown_table(["architecture", "quantity", "predicted", "observed RMSE", "structures"], calibration, "llrrr")
    )
    print(f"\nASE MD of one ethanol molecule, steps/s (median [min, max] of {args.repeats} runs)\n")
    print(
        markdown_table(
            ["architecture", "energy only", "with energy uncertainty", "cost (x energy only)", "force ensemble of 16",
             "cost (x energy only)"],
            cost,
            "lrrrrr",
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
