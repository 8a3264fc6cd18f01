"""Train SOAP-BPNN on ethanol (energy and forces, 80/10/10, batch 16) and report speed,
memory and accuracy.

    python benchmarks/train_ethanol.py [--epochs 50] [--repeats 1] [-- extra overrides]

Prints seconds per epoch (training and validation, median over epochs, from metrics.csv),
the fixed cost (start-up, data, export and final evaluation), peak resident memory of
the `mtt train` process, and the test-set errors. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_folder import peak_memory_mb, run_folder, seconds_per_epoch, test_line

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "ethanol_reduced_100.xyz"

OPTIONS = """
seed: 42
architecture:
  name: soap_bpnn
  training:
    batch_size: 16
    num_epochs: {epochs}
training_set:
  systems: {data}
  targets:
    energy: {{key: energy, unit: kcal/mol, forces: forces}}
validation_set: 0.1
test_set: 0.1
"""


def run_once(epochs: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        options = Path(folder) / "options.yaml"
        options.write_text(OPTIONS.format(epochs=epochs, data=DATA))
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "mtt", "train", str(options), *overrides],
            cwd=folder,
            capture_output=True,
            text=True,
        )
        total = time.monotonic() - start
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        folder = run_folder(Path(folder))
        per_epoch = seconds_per_epoch(folder)
        peak = peak_memory_mb(folder)
        test = test_line(folder)
    figures = dict(re.findall(r"(energy per atom rmse|forces rmse) ([\d.]+)", test))
    return {
        "total_s": total,
        "per_epoch_s": per_epoch,
        "fixed_s": total - per_epoch * epochs,
        "peak_mb": peak,
        "energy_rmse_mev_atom": float(figures["energy per atom rmse"]),
        "forces_rmse_mev_a": float(figures["forces rmse"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="mtt overrides, e.g. base_precision=32")
    args = parser.parse_args()
    if not DATA.exists():
        raise SystemExit(f"needs {DATA}")
    runs = [run_once(args.epochs, args.overrides) for _ in range(args.repeats)]
    print(f"ethanol, {args.epochs} epochs, {len(runs)} run(s), overrides {args.overrides or 'none'}")
    for key in runs[0]:
        values = [run[key] for run in runs]
        print(f"  {key:22s} median {statistics.median(values):9.3f}   min {min(values):9.3f}   max {max(values):9.3f}")


if __name__ == "__main__":
    main()
