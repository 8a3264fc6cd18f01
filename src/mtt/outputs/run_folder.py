"""The run folder (``outputs/<date>/<time>``) and the files in it that say how the run was
started and what it learned: options.yaml, command.yaml, indices/, metrics.csv."""

from __future__ import annotations

import csv
import datetime
import shlex
from pathlib import Path
from typing import Iterable, Mapping, Protocol

import numpy as np
import yaml

from .display import display

#: in every run folder: the command and the options file it was started from
COMMAND_FILE = "command.yaml"


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


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is the folder of an `mtt train` run (its options and indices)."""
    return (folder / "options.yaml").is_file() and (folder / "indices").is_dir()


def run_folder_of(checkpoint: Path) -> Path | None:
    """``outputs/<date>/<time>`` for its ``model.ckpt`` and ``checkpoints/*.ckpt``."""
    folder = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    return folder if is_run_folder(folder) else None


class HasOrigins(Protocol):
    """A set of structures that says which file and frame each came from."""

    def origins(self) -> Iterable[tuple[str, np.ndarray]]: ...


def write_run_files(
    folder: Path, options_yaml: str, options_path: str, arguments: list[str], sets: Mapping[str, HasOrigins]
) -> None:
    """options.yaml (composed), command.yaml (how the run was started) and indices/."""
    (folder / "options.yaml").write_text(options_yaml)
    command = {
        "command": shlex.join(["mtt", *arguments]),
        "options_file": str(Path(options_path).resolve()),
        "folder": str(Path.cwd()),
    }
    (folder / COMMAND_FILE).write_text("# how this run was started\n" + yaml.safe_dump(command, sort_keys=False))
    indices = folder / "indices"
    indices.mkdir()
    for name, structures in sets.items():
        with open(indices / f"{name}.txt", "w") as file:
            for path, numbers in structures.origins():
                file.writelines(f"{path}\t{i}\n" for i in numbers.tolist())


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
