"""What the benchmarks read from an mtt run folder."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path


def run_folder(cwd: Path) -> Path:
    return next(Path(cwd).glob("outputs/*/*"))


def seconds_per_epoch(folder: Path) -> float:
    """Median wall time of an epoch (training and validation), from metrics.csv; the
    first epoch is left out when there are others (it pays one-off warm-up costs)."""
    times = [float(row["time [s]"]) for row in csv.DictReader(open(folder / "metrics.csv"))]
    return statistics.median(times[1:] or times)


def peak_memory_mb(folder: Path) -> float:
    """Peak resident memory of the run (the largest rank), as train.log reports it (its
    summary's "peak memory", or "peak resident memory" before the summary existed)."""
    text = (folder / "train.log").read_text()
    return float(re.search(r"peak (?:resident )?memory:\s+(\d+) MB", text).group(1))


def test_line(folder: Path) -> str:
    """``test set (N structures): energy per atom rmse ...``, as train.log has it (the
    terminal shows the test errors in the summary's table instead)."""
    lines = (folder / "train.log").read_text().splitlines()
    return next(line.split(" INFO ", 1)[-1] for line in lines if " INFO test set (" in line)
