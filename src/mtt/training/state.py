"""Where a run stands, with what it was started from: what a checkpoint holds.

One class writes and reads checkpoints (:meth:`TrainingState.save`, :meth:`TrainingState.load`),
so their contents are spelled out once, here; the file format itself (versions, atomic
writes, refusing foreign files) is :mod:`mtt.checkpoint`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from ..checkpoint import load_checkpoint, save_checkpoint


@dataclass
class RunIdentity:
    """What a run was started with: its architecture, model hyperparameters, data and options."""

    architecture: str
    model_hypers: dict
    dataset_info: dict
    options: dict


@dataclass
class TrainingState:
    """What a checkpoint needs to continue training exactly where it stopped."""

    identity: RunIdentity
    model_state: dict | None = None  # the weights when the checkpoint was written
    epoch: int = 0  # last completed epoch
    batches_done: int = 0  # batches of epoch + 1 already done (a run stopped by a signal)
    partial_train_metrics: torch.Tensor | None = None
    best_figure: float = math.inf
    best_model_state: dict | None = None
    optimizer_state: dict | None = None
    scheduler_state: dict | None = None
    spreads: dict[str, float] = field(default_factory=dict)

    def save(self, path: Path, model: torch.nn.Module) -> None:
        """Write a checkpoint of this state with ``model``'s current weights."""
        self.model_state = model.state_dict()
        identity = {f.name: getattr(self.identity, f.name) for f in fields(RunIdentity)}
        progress = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "identity"}
        save_checkpoint(path, {**identity, **progress})

    @classmethod
    def load(cls, path: str | Path) -> "TrainingState":
        """Read a checkpoint (upgraded to the current version); see :func:`mtt.checkpoint.load_checkpoint`."""
        content = load_checkpoint(path)
        identity = RunIdentity(**{f.name: content[f.name] for f in fields(RunIdentity)})
        progress = {f.name: content[f.name] for f in fields(cls) if f.name != "identity" and f.name in content}
        return cls(identity=identity, **progress)
