"""Parallel efficiency of CPU training: the same model trained with 1 and 2 ranks (torchrun,
gloo), same global batch, alternating, several times.

    python benchmarks/distributed_scaling.py [--epochs 10] [--repeats 3]

Prints seconds per epoch, speed-up, parallel efficiency and the peak resident memory of
the largest rank (logged by mtt) for each rank count. On a 2-core machine each rank gets
one core, so ideal scaling is 2x.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from harness import EMT, EMT_TARGETS, median_min_max, mtt_train, peak_memory_mb, run_folder, seconds_per_epoch

OPTIONS = """
seed: 2
architecture: {{name: soap_bpnn, training: {{num_epochs: {epochs}, batch_size: {batch}}}}}
training_set:
  systems: {data}
  targets:
    energy: {targets}
"""


def run(ranks: int, epochs: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as folder:
        options = OPTIONS.format(epochs=epochs, batch=16 // ranks, data=EMT, targets=EMT_TARGETS)
        (Path(folder) / "options.yaml").write_text(options)
        # one process, or torchrun at its default port
        subprocess.run(mtt_train(ranks=None if ranks == 1 else ranks), cwd=folder, check=True, capture_output=True)
        folder = run_folder(Path(folder))
        return seconds_per_epoch(folder), peak_memory_mb(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], 2: []}
    peaks: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for ranks in (1, 2):  # alternate
            seconds, peak = run(ranks, args.epochs)
            times[ranks].append(seconds)
            peaks[ranks].append(peak)
    one = median_min_max(times[1])[0]
    for ranks, values in times.items():
        median, low, high = median_min_max(values)
        print(
            f"{ranks} rank(s): {median:.3f} s/epoch (min {low:.3f}, max {high:.3f}), "
            f"speed-up {one / median:.2f}x, efficiency {one / median / ranks:.0%}, "
            f"peak memory per rank {max(peaks[ranks]):.0f} MB"
        )


if __name__ == "__main__":
    main()
