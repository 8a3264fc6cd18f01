"""How training time and memory grow with the dataset: EMT datasets of 1k, 4k and 16k
structures made by the repository's generator, 2 epochs each.

    python benchmarks/growth.py [--sizes 1000 4000 16000] [--epochs 2] [--cache-memory-mb 1024]

Prints seconds per epoch, seconds per epoch per 1000 structures (constant when growth is
linear), the fixed cost (reading, neighbour lists, export) and peak memory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import EMT_GENERATOR, EMT_TARGETS, mtt_train, peak_memory_mb, run_folder, seconds_per_epoch

OPTIONS = """
seed: 0
architecture: {{name: soap_bpnn, training: {{num_epochs: {epochs}, batch_size: 16, cache_memory_mb: {cache}}}}}
training_set:
  systems: {data}
  targets:
    energy: {targets}
validation_set: 0.05
test_set: 0.05
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--cache-memory-mb", type=float, default=1024.0, help="what the trainer may keep of the descriptor (0: nothing)"
    )
    args = parser.parse_args()
    print(f"{'structures':>10s} {'s/epoch':>9s} {'s/epoch/1k':>11s} {'fixed s':>8s} {'peak MB':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            folder = Path(tmp) / str(size)
            folder.mkdir()
            data = folder / "emt.xyz"
            subprocess.run(
                [sys.executable, str(EMT_GENERATOR), "--n-structures", str(size), "--output", str(data)],
                check=True,
                capture_output=True,
            )
            (folder / "options.yaml").write_text(
                OPTIONS.format(epochs=args.epochs, data=data, cache=args.cache_memory_mb, targets=EMT_TARGETS)
            )
            start = time.monotonic()
            subprocess.run(mtt_train(), cwd=folder, check=True, capture_output=True)
            total = time.monotonic() - start
            run = run_folder(folder)
            per_epoch = seconds_per_epoch(run)
            print(
                f"{size:10d} {per_epoch:9.2f} {per_epoch / size * 1000:11.2f} "
                f"{total - per_epoch * args.epochs:8.1f} {peak_memory_mb(run):8.0f}"
            )


if __name__ == "__main__":
    main()
