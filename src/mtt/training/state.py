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

from .. import architectures
from ..checkpoint import load_checkpoint, save_checkpoint
from ..errors import CheckpointError


@dataclass
class RunIdentity:
    """What a run was started with: its architecture, model hyperparameters, data and options."""

    architecture: str
    model_hypers: dict
    dataset_info: dict
    options: dict
    #: the version of the architecture's own checkpoint layout (``__checkpoint_version__``)
    architecture_version: int = 1


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
    ema_state: dict | None = None  # the moving average of the weights, with ema_decay
    spreads: dict[str, float] = field(default_factory=dict)
    best_epoch: int = 0  # the epoch of the best model; 0 when unknown (checkpoints of mtt 0.1.0)
    best_validation: dict[str, float] = field(default_factory=dict)  # its validation errors
    plateau_state: dict | None = None  # the reduce-on-plateau schedule's (see .plateau)
    global_batch_size: int = 0  # structures per step, all ranks together; 0 when unknown
    global_max_atoms: int = 0  # with packed batches: atoms per step at most, all ranks together
    data_fingerprint: str = ""  # of the split structures (Splits.fingerprint); "" when unknown
    #: a fine-tuning run's errors before its first step: {"validation": ..., "original validation": ...}
    finetune_start: dict[str, dict[str, float]] = field(default_factory=dict)

    def save(self, path: Path, model: torch.nn.Module) -> None:
        """Write a checkpoint of this state with ``model``'s current weights."""
        self.model_state = model.state_dict()
        self.write(path)

    def write(self, path: Path) -> None:
        """Write a checkpoint of this state as it is."""
        identity = {f.name: getattr(self.identity, f.name) for f in fields(RunIdentity)}
        progress = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "identity"}
        save_checkpoint(path, {**identity, **progress})

    @classmethod
    def load(cls, path: str | Path) -> "TrainingState":
        """Read a checkpoint, upgraded to the current version of mtt's layout
        (:func:`mtt.checkpoint.load_checkpoint`) and of its architecture's."""
        content = _upgraded_for_architecture(load_checkpoint(path), path)
        identity = RunIdentity(**{f.name: content[f.name] for f in fields(RunIdentity)})
        progress = {f.name: content[f.name] for f in fields(cls) if f.name != "identity" and f.name in content}
        return cls(identity=identity, **progress)


def _upgraded_for_architecture(content: dict, path: str | Path) -> dict:
    """The model hyperparameters and states of ``content`` in the layout of the installed
    version of its architecture (``upgrade_checkpoint`` of the architecture's module)."""
    architecture = architectures.load(content["architecture"])
    version = content["architecture_version"]
    if version > architecture.checkpoint_version:
        raise CheckpointError(
            f"'{path}' holds a '{architecture.name}' model of layout version {version}, newer than the "
            f"installed architecture reads (up to {architecture.checkpoint_version}).",
            hint=f"Upgrade the package that provides '{architecture.name}'.",
        )
    while version < architecture.checkpoint_version:
        if architecture.upgrade_checkpoint is None:
            raise CheckpointError(
                f"'{path}' holds a '{architecture.name}' model of layout version {version}, and the "
                f"installed architecture (version {architecture.checkpoint_version}) cannot upgrade it.",
                hint=f"Use the version of '{architecture.name}' that wrote it.",
            )
        parts = {key: content[key] for key in UPGRADED_PARTS}
        with architectures.blame_architecture(architecture):
            parts = architecture.upgrade_checkpoint(parts, version)
        version += 1
        content = {**content, **parts, "architecture_version": version}
    return content


#: what an architecture's ``upgrade_checkpoint`` receives and returns
UPGRADED_PARTS = ("model_hypers", "model_state", "best_model_state")
