"""The run folder and what is written to it: log, metrics CSV, options, indices."""

from __future__ import annotations

import csv
import datetime
import logging
import sys
import traceback
from pathlib import Path

LOGGER = logging.getLogger("mtt")
#: writes to the run's log file only (the full epoch lines, while the terminal shows a table)
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
        from .terminal import ConsoleHandler  # clears the step bar of the terminal first

        console = ConsoleHandler(sys.stdout)
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


def metric_name(key: str) -> str:
    """A metric key in words: 'energy_per_atom_rmse' -> 'energy per atom RMSE'."""
    return key.replace("_rmse", " RMSE").replace("_mae", " MAE").replace("_per_atom", " per atom").replace("_", " ")


def display(value: float, unit: str) -> tuple[float, str]:
    """Energies are shown in meV: the errors of good models are a few meV."""
    if unit.startswith("eV"):
        return value * 1000.0, "m" + unit
    return value, unit


class MetricsCsv:
    """One row per epoch, columns named with their units; rows are added to a file that
    exists (a restarted run's, which starts with the history of the run it continues)."""

    def __init__(self, path: Path):
        self.path = path
        self.columns: list[str] | None = None
        if path.is_file():
            with open(path, newline="") as handle:
                self.columns = next(csv.reader(handle), None)

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


def continue_metrics(previous: Path, path: Path, last_epoch: int) -> None:
    """Start ``path`` with the rows of ``previous`` (the metrics of the run a restart
    continues) up to ``last_epoch``, so that a run's metrics cover its whole history."""
    if not previous.is_file() or last_epoch < 1:
        return
    with open(previous, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or "epoch" not in rows[0]:
        return
    column = rows[0].index("epoch")
    kept = [row for row in rows[1:] if len(row) > column and row[column].isdigit() and int(row[column]) <= last_epoch]
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows([rows[0], *kept])


def keep_previous(path: Path) -> Path | None:
    """Move the file at ``path`` aside, to ``<stem>.<N><suffix>`` (the first free N, so
    higher numbers are more recent), before something else is written there."""
    if not path.exists():
        return None
    number = 1
    while (kept := path.with_name(f"{path.stem}.{number}{path.suffix}")).exists():
        number += 1
    path.rename(kept)
    return kept
