"""Train SOAP-BPNN on ethanol (energy and forces, 80/10/10, batch 16) and report speed,
memory and accuracy.

    python benchmarks/train_ethanol.py [--epochs 50] [--repeats 1] [-- extra overrides]

Prints seconds per epoch (training and validation, median over epochs, from metrics.csv),
the fixed cost (start-up, data, export and final evaluation), peak resident memory of
the `mtt train` process, and the test-set errors. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from harness import (
    DATA,
    ETHANOL_TARGETS,
    median_min_max,
    mtt_train,
    peak_memory_mb,
    run_folder,
    seconds_per_epoch,
    test_errors,
    test_line,
)

ETHANOL = DATA / "ethanol_reduced_100.xyz"

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
    energy: {targets}
validation_set: 0.1
test_set: 0.1
"""


def run_once(epochs: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        options = Path(folder) / "options.yaml"
        options.write_text(OPTIONS.format(epochs=epochs, data=ETHANOL, targets=ETHANOL_TARGETS))
        start = time.monotonic()
        result = subprocess.run(mtt_train(str(options), overrides), cwd=folder, capture_output=True, text=True)
        total = time.monotonic() - start
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        folder = run_folder(Path(folder))
        per_epoch = seconds_per_epoch(folder)
        peak = peak_memory_mb(folder)
        errors = test_errors(test_line(folder))
    return {
        "total_s": total,
        "per_epoch_s": per_epoch,
        "fixed_s": total - per_epoch * epochs,
        "peak_mb": peak,
        "energy_rmse_mev_atom": errors["energy per atom rmse"][0],
        "forces_rmse_mev_a": errors["forces rmse"][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="mtt overrides, e.g. base_precision=32")
    args = parser.parse_args()
    if not ETHANOL.exists():
        raise SystemExit(f"needs {ETHANOL}")
    runs = [run_once(args.epochs, args.overrides) for _ in range(args.repeats)]
    print(f"ethanol, {args.epochs} epochs, {len(runs)} run(s), overrides {args.overrides or 'none'}")
    for key in runs[0]:
        median, low, high = median_min_max([run[key] for run in runs])
        print(f"  {key:22s} median {median:9.3f}   min {low:9.3f}   max {high:9.3f}")


if __name__ == "__main__":
    main()
