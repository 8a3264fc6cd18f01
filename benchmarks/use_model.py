"""Speed of a trained SOAP-BPNN model where it is used: ASE molecular dynamics through
metatomic's calculator (ethanol, 9 atoms; a periodic Cu cell, 108 atoms) and `mtt eval`.

    python benchmarks/use_model.py [--repeats 3] [--steps 200]

Trains throwaway default-size models for 2 epochs (speed does not depend on accuracy),
then times each case in a fresh process, alternating, and prints medians with min and max.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ETHANOL = ROOT.parent / "shared" / "data" / "ethanol_reduced_100.xyz"
EMT = ROOT / "examples" / "data" / "emt_metals.xyz"

OPTIONS = """
seed: 1
architecture: {{name: soap_bpnn, training: {{num_epochs: 2, batch_size: 16}}}}
training_set:
  systems: {data}
  targets:
    energy: {targets}
"""

MD = """
import time, ase.io, numpy as np
from ase import units
from ase.build import bulk
from ase.md.verlet import VelocityVerlet
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from metatomic_ase import MetatomicCalculator
atoms = {atoms}
atoms.calc = MetatomicCalculator({model!r}, extensions_directory={extensions!r})
MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
dynamics = VelocityVerlet(atoms, timestep=0.5 * units.fs)
dynamics.run(20)
start = time.perf_counter()
dynamics.run({steps})
print({steps} / (time.perf_counter() - start))
"""


def train(folder: Path, data: Path, targets: str) -> Path:
    folder.mkdir()
    (folder / "options.yaml").write_text(OPTIONS.format(data=data, targets=targets))
    subprocess.run([sys.executable, "-m", "mtt", "train", "options.yaml"], cwd=folder, check=True, capture_output=True)
    return folder / "model.pt"


def md_rate(model: Path, atoms: str, steps: int) -> float:
    script = MD.format(atoms=atoms, model=str(model), extensions=str(model.parent / "extensions"), steps=steps)
    output = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=True, capture_output=True, text=True)
    return float(output.stdout.split()[-1])


def eval_rate(model: Path, data: Path, folder: Path) -> float:
    (folder / "eval.yaml").write_text(f"systems: {data}\n")
    output = subprocess.run(
        [sys.executable, "-m", "mtt", "eval", str(model), "eval.yaml"],
        cwd=folder,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(re.search(r"\(([\d.]+) structures/s\)", output).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ethanol = train(tmp / "ethanol", ETHANOL, "{key: energy, unit: kcal/mol, forces: forces}")
        metal = train(tmp / "emt", EMT, "{key: energy, unit: eV, forces: on, stress: on}")
        cases = {
            "MD ethanol (9 atoms), steps/s": lambda: md_rate(
                ethanol, f"ase.io.read({str(ETHANOL)!r}, '0')", args.steps
            ),
            "MD Cu fcc 3x3x3 (108 atoms, periodic), steps/s": lambda: md_rate(
                metal, "bulk('Cu', 'fcc', a=3.61, cubic=True).repeat((3, 3, 3))", args.steps // 4
            ),
            "mtt eval ethanol (100 structures), structures/s": lambda: eval_rate(ethanol, ETHANOL, tmp / "ethanol"),
            "mtt eval EMT metals (100 structures), structures/s": lambda: eval_rate(metal, EMT, tmp / "emt"),
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):  # alternate the cases
            for name, case in cases.items():
                results[name].append(case())
    for name, values in results.items():
        print(f"{name:52s} median {statistics.median(values):8.1f}  min {min(values):8.1f}  max {max(values):8.1f}")


if __name__ == "__main__":
    main()
