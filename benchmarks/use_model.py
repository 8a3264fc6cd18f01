"""Speed of a trained SOAP-BPNN model where it is used: ASE molecular dynamics through
metatomic's calculator (ethanol, 9 atoms; a periodic Cu cell, 108 atoms) and `mtt eval`.

    python benchmarks/use_model.py [--repeats 3] [--steps 200]

Trains throwaway default-size models for 2 epochs (speed does not depend on accuracy),
then times each case in a fresh process, alternating, and prints medians with min and max.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import DATA, EMT, EMT_TARGETS, ETHANOL_TARGETS, ase_md_rates, median_min_max, mtt_train

ETHANOL = DATA / "ethanol_reduced_100.xyz"

OPTIONS = """
seed: 1
architecture: {{name: soap_bpnn, training: {{num_epochs: 2, batch_size: 16}}}}
training_set:
  systems: {data}
  targets:
    energy: {targets}
"""

# the MD of one model on one system (harness.MD_RATE): ``atoms`` is a Python expression
MD = """
from ase.build import bulk
from metatomic_ase import MetatomicCalculator
def systems():
    atoms = {atoms}
    atoms.calc = MetatomicCalculator({model!r}, extensions_directory={extensions!r})
    yield atoms, {steps}
"""


def train(folder: Path, data: Path, targets: str) -> Path:
    folder.mkdir()
    (folder / "options.yaml").write_text(OPTIONS.format(data=data, targets=targets))
    subprocess.run(mtt_train(), cwd=folder, check=True, capture_output=True)
    return folder / "model.pt"


def md_rate(model: Path, atoms: str, steps: int) -> float:
    setup = MD.format(atoms=atoms, model=str(model), extensions=str(model.parent / "extensions"), steps=steps)
    return ase_md_rates(setup, warmup=20)[-1]


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
        ethanol = train(tmp / "ethanol", ETHANOL, ETHANOL_TARGETS)
        metal = train(tmp / "emt", EMT, EMT_TARGETS)
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
        median, low, high = median_min_max(values)
        print(f"{name:52s} median {median:8.1f}  min {low:8.1f}  max {high:8.1f}")


if __name__ == "__main__":
    main()
