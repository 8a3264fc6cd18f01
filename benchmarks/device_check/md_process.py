"""One exported model in ASE molecular dynamics through metatomic's calculator, on each
device asked for; its forces against finite differences of its energy. A helper of the
device check's MD step (md.py), run in its own process; prints a line ``RESULT {json}``
after each part.

    python benchmarks/device_check/md_process.py --model model.pt --checkpoint model.ckpt \
        --system ethanol|cu1008 [--devices cuda cpu] [--steps 200] [--seconds 20]

The finite differences use a float64 copy of the same trained model (float32 energies of
a few thousand eV leave about 1e-3 eV of rounding, too coarse for a 1e-3 A step): the
checkpoint's best weights exported again in float64 with mtt's own export.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def build_system(name: str, structure: str | None):
    import ase.io
    from ase.build import bulk, molecule

    if name == "ethanol":
        atoms = ase.io.read(structure, 0) if structure else molecule("CH3CH2OH")
        atoms.calc = None
        atoms.pbc = False
        atoms.cell = None
        return atoms
    if name == "cu1008":  # 6 x 6 x 7 cubic fcc cells, 1008 atoms, periodic
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((6, 6, 7))
        atoms.positions += np.random.default_rng(0).normal(0.0, 0.05, atoms.positions.shape)
        return atoms
    raise ValueError(f"unknown system {name}")


def calculator(model: Path, device: str):
    from metatomic_ase import MetatomicCalculator

    return MetatomicCalculator(str(model), extensions_directory=str(model.parent / "extensions"), device=device)


def md_rate(atoms, model: Path, device: str, steps: int, seconds: float, warmup: int) -> dict:
    from ase import units
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    atoms = atoms.copy()
    atoms.calc = calculator(model, device)
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dynamics = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    forces = atoms.get_forces().copy()
    dynamics.run(warmup)
    start_energy = atoms.get_total_energy()
    done, start = 0, time.perf_counter()
    chunk = max(1, min(steps, 10))
    while done < steps and time.perf_counter() - start < seconds:
        dynamics.run(min(chunk, steps - done))
        done += min(chunk, steps - done)
    elapsed = time.perf_counter() - start
    drift = (atoms.get_total_energy() - start_energy) / len(atoms)
    return {
        "steps": done,
        "seconds": elapsed,
        "steps_per_s": done / elapsed,
        "energy_drift_meV_per_atom": 1000 * drift,
        "temperature_K": atoms.get_temperature(),
        "forces_at_start": forces,
    }


def float64_copy(checkpoint: Path, folder: Path) -> Path:
    import torch

    from mtt.export import export_model, model_from_state
    from mtt.training.state import TrainingState

    model, info, architecture = model_from_state(TrainingState.load(checkpoint))
    return export_model(model.to(torch.float64), info, architecture, folder / "model64.pt")


def finite_differences(atoms, model: Path, device: str, count: int, step: float) -> dict:
    atoms = atoms.copy()
    atoms.calc = calculator(model, device)
    analytic = atoms.get_forces().copy()
    chosen = sorted({int(i) for i in np.linspace(0, len(atoms) - 1, count)})
    worst, largest = 0.0, float(np.abs(analytic).max())
    for index in chosen:
        for axis in range(3):
            energies = []
            for sign in (1, -1):
                moved = atoms.copy()
                moved.calc = atoms.calc
                moved.positions[index, axis] += sign * step
                energies.append(moved.get_potential_energy())
            numeric = -(energies[0] - energies[1]) / (2 * step)
            worst = max(worst, abs(numeric - analytic[index, axis]))
    tolerance = 1e-5 + 1e-4 * largest
    return {
        "atoms_checked": chosen,
        "step_A": step,
        "max_abs_error_eV_per_A": worst,
        "max_force_eV_per_A": largest,
        "tolerance_eV_per_A": tolerance,
        "ok": bool(worst <= tolerance),
        "forces64": analytic,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--system", required=True, choices=["ethanol", "cu1008"])
    parser.add_argument("--structure", help="file whose first frame is the ethanol molecule")
    parser.add_argument(
        "--devices",
        nargs="+",
        default=["cuda", "cpu"],
        help="torch devices, the first also for the finite differences; LABEL=DEVICE runs DEVICE under LABEL",
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0, help="at most this long per device")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--fd-atoms", type=int, default=3)
    parser.add_argument("--fd-step", type=float, default=1e-4)
    args = parser.parse_args()

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # ASE's MaxwellBoltzmannDistribution
    atoms = build_system(args.system, args.structure)
    result: dict = {"system": args.system, "atoms": len(atoms), "periodic": bool(atoms.pbc.any()), "md": {}}

    def report() -> None:  # after each part, so that a run cut short still says what it measured
        print("RESULT " + json.dumps(result), flush=True)

    forces = {}
    first = args.devices[0].partition("=")[0]
    for entry in args.devices:
        label, _, device = entry.partition("=")
        device = device or label
        rate = md_rate(atoms, args.model, device, args.steps, args.seconds, args.warmup)
        forces[label] = rate.pop("forces_at_start")
        result["md"][label] = rate
        print(f"{args.system} on {label}: {rate['steps_per_s']:.1f} steps/s", file=sys.stderr, flush=True)
        if label != first:
            difference = np.abs(forces[label] - forces[first]).max() / max(np.abs(forces[first]).max(), 1e-12)
            result[f"forces_{first}_vs_{label}_max_rel"] = float(difference)
        report()
        if label == first:  # the finite differences on the first device, before the slower ones
            with tempfile.TemporaryDirectory() as folder:
                model64 = float64_copy(args.checkpoint, Path(folder))
                fd = finite_differences(atoms, model64, device, args.fd_atoms, args.fd_step)
            forces64 = fd.pop("forces64")
            fd["device"] = label
            fd["float32_vs_float64_forces_max_rel"] = float(
                np.abs(forces[first] - forces64).max() / max(np.abs(forces64).max(), 1e-12)
            )
            result["finite_differences"] = fd
            report()


if __name__ == "__main__":
    main()
