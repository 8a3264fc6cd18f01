"""Every epoch's metrics also sent where the user asks (the ``logger`` option): TensorBoard
event files, or a Weights & Biases run kept offline, both in the run folder.

The names and units are those of ``metrics.csv`` (energies in meV): ``train/loss``,
``validation/forces_rmse [meV/A]``, ``learning_rate``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import EnvironmentProblem
from .display import display

#: the loggers the option accepts, with the extra of mtt that installs each
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}


def _missing(name: str, package: str, error: ImportError) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"logger: {name} needs the {package} package, which is not installed ({error}).",
        hint=f"Install it with pip install {package} (or mtt's extra: pip install 'mtt[{EXTRAS[name]}]'), "
        "or drop the logger option.",
    )


def _scalars(sets: dict[str, dict[str, float]], units: dict[str, str]) -> dict[str, float]:
    values = {}
    for split, metrics in sets.items():
        for key, value in metrics.items():
            shown, unit = display(value, units.get(key, ""))
            values[f"{split}/{key}" + (f" [{unit}]" if unit else "")] = shown
    return values


class TensorBoardLogger:
    """Event files in ``<run folder>/tensorboard``: ``tensorboard --logdir outputs``."""

    title = "TensorBoard"

    def __init__(self, folder: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise _missing("tensorboard", "tensorboard", error) from error
        self.folder = folder / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.folder))

    def log_epoch(
        self, epoch: int, learning_rate: float, sets: dict[str, dict[str, float]], units: dict[str, str]
    ) -> None:
        for tag, value in _scalars(sets, units).items():
            self.writer.add_scalar(tag, value, epoch)
        self.writer.add_scalar("learning_rate", learning_rate, epoch)
        self.writer.flush()

    def where(self) -> str:
        return f"{self.folder} (tensorboard --logdir {self.folder.parent})"

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run in ``<run folder>/wandb``, offline unless ``WANDB_MODE`` says
    otherwise; ``wandb sync`` uploads it later."""

    title = "W&B run"

    def __init__(self, folder: Path, options: dict[str, Any]):
        try:
            import wandb
        except ImportError as error:
            raise _missing("wandb", "wandb", error) from error
        self.mode = os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "mtt"),
            name="/".join(folder.parts[-2:]),
            dir=str(folder),
            mode=self.mode,
            config=options,
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.folder = Path(self.run.dir).parent if self.run.dir else folder / "wandb"

    def log_epoch(
        self, epoch: int, learning_rate: float, sets: dict[str, dict[str, float]], units: dict[str, str]
    ) -> None:
        self.run.log({**_scalars(sets, units), "learning_rate": learning_rate, "epoch": epoch}, step=epoch)

    def where(self) -> str:
        if self.mode == "offline":
            return f"{self.folder} (upload it with: wandb sync {self.folder})"
        return str(self.run.url or self.folder)

    def close(self) -> None:
        self.run.finish()


def check_loggers(names: list[str]) -> None:
    """Fail now, before a run folder exists, when a logger's package is missing."""
    for name in names:
        try:
            if name == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            else:
                import wandb  # noqa: F401
        except ImportError as error:
            raise _missing(name, name, error) from error


def open_loggers(names: list[str], folder: Path, options: dict[str, Any]) -> list:
    """The loggers named by the ``logger`` option, writing into the run ``folder``."""
    loggers: list = []
    for name in names:
        loggers.append(TensorBoardLogger(folder) if name == "tensorboard" else WandbLogger(folder, options))
    return loggers
