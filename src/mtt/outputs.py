"""The run folder and what is written to it: log, metrics CSV, options, indices."""

from __future__ import annotations

import csv
import datetime
import logging
import math
import sys
import time
import traceback
from pathlib import Path

LOGGER = logging.getLogger("mtt")
#: writes to the run's log file only (progress lines while a bar is on the terminal)
FILE_LOGGER = logging.getLogger("mtt_file")


def new_run_folder(root: Path = Path("outputs")) -> Path:
    """outputs/<date>/<time>, with a suffix when two runs start in the same second."""
    now = datetime.datetime.now()
    base = root / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    folder, suffix = base, 1
    while folder.exists():
        folder = base.with_name(f"{base.name}-{suffix}")
        suffix += 1
    folder.mkdir(parents=True)
    return folder


def setup_logging(log_file: Path | None, verbose: bool = True) -> None:
    """Messages to stdout, and to ``log_file`` when a run folder exists."""
    for logger in (LOGGER, FILE_LOGGER):
        logger.handlers.clear()
        logger.setLevel(logging.INFO)
        logger.propagate = False
    if verbose:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(console)
    if log_file is not None:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        LOGGER.addHandler(handler)
        FILE_LOGGER.addHandler(handler)


def write_error_log(folder: Path, error: BaseException, rank: int | None = None) -> Path:
    name = "error.log" if rank is None else f"error.rank{rank}.log"
    path = folder / name
    path.write_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    return path


def display(value: float, unit: str) -> tuple[float, str]:
    """Energies are shown in meV: the errors of good models are a few meV."""
    if unit.startswith("eV"):
        return value * 1000.0, "m" + unit
    return value, unit


class MetricsCsv:
    """One row per epoch, columns named with their units."""

    def __init__(self, path: Path):
        self.path = path
        self.columns: list[str] | None = None

    def write(
        self, epoch: int, seconds: float, learning_rate: float, sets: dict[str, dict[str, float]], units: dict[str, str]
    ) -> None:
        """One epoch: its wall time (training and validation), learning rate and errors."""
        row = {"epoch": epoch, "time [s]": f"{seconds:.3f}", "learning_rate": learning_rate}
        for split, metrics in sets.items():
            for key, value in metrics.items():
                shown, unit = display(value, units.get(key, ""))
                row[f"{split}_{key}" + (f" [{unit}]" if unit else "")] = f"{shown:.8g}"
        if self.columns is None:
            self.columns = list(row)
            with open(self.path, "w", newline="") as handle:
                csv.writer(handle).writerow(self.columns)
        with open(self.path, "a", newline="") as handle:
            csv.writer(handle).writerow([row.get(c, "") for c in self.columns])


def format_metrics(metrics: dict[str, float], units: dict[str, str], with_mae: bool = True) -> str:
    parts = []
    for key, value in metrics.items():
        if key == "loss" or (key.endswith("_mae") and not with_mae):
            continue
        shown, unit = display(value, units.get(key, ""))
        parts.append(f"{key.replace('_', ' ')} {shown:.4g}" + (f" {unit}" if unit else ""))
    return ", ".join(parts)


class Progress:
    """A progress bar on a terminal; plain lines with throughput and ETA in a file."""

    def __init__(self, total_epochs: int, first_epoch: int, n_structures: int, log_interval: int):
        self.total = total_epochs
        self.first = first_epoch
        self.n_structures = n_structures
        self.log_interval = log_interval
        self.start = time.monotonic()
        self.bar = None
        if sys.stdout.isatty() and total_epochs > first_epoch:
            from tqdm import tqdm

            self.bar = tqdm(total=total_epochs, initial=first_epoch, unit="epoch", dynamic_ncols=True)

    def epoch_done(self, epoch: int, summary: str) -> None:
        elapsed = time.monotonic() - self.start
        done = epoch - self.first
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(summary, refresh=True)
            FILE_LOGGER.info("epoch %d/%d: %s", epoch, self.total, summary)
            return
        if epoch % self.log_interval and epoch != self.total:
            return
        rate = done * self.n_structures / elapsed if elapsed > 0 else math.nan
        eta = elapsed / done * (self.total - epoch) if done else math.nan
        LOGGER.info(
            "epoch %d/%d: %s | %.1f structures/s, ETA %s",
            epoch,
            self.total,
            summary,
            rate,
            _duration(eta),
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
