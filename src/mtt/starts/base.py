"""The interface of every way a run begins (see :func:`mtt.starts.choose_start`).

`mtt train` asks the start what differs between a new model, a fine-tuning and a restart
(the model's hyperparameters and targets, the weights and state training starts from, what
the summary adds) and never which kind it is: a new way to begin a run is one more class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import architectures
from ..config import ComposedOptions
from ..data.dataset import DatasetInfo, Splits
from ..schema import to_plain
from ..training.composition import fit_baseline
from ..training.shallow_ensemble import attach_shallow_ensemble
from ..training.state import RunIdentity, TrainingState
from ..training.trainer import Trainer


@dataclass
class RunParts:
    """What a run has built when its start gives it the state training starts from."""

    model: torch.nn.Module
    model_info: DatasetInfo  # what the model predicts; splits.info is what is learned
    splits: Splits
    trainer: Trainer
    run_folder: Path


class RunStart(ABC):
    """How a run begins: it builds the model, gives the state training starts from and
    attaches what it reports to the Trainer (its monitors)."""

    def __init__(self, options: ComposedOptions):
        self.options = options

    @property
    def model_hypers(self) -> Any:
        """The parsed model hyperparameters the model is built from."""
        return self.options.model_hypers

    def already_complete(self) -> bool:
        """Whether nothing is left to train (a restart of a finished run); says why."""
        return False

    def model_info(self, splits: Splits) -> DatasetInfo:
        """What the model predicts, its elements and targets, checked against the data."""
        return splits.info

    def build_model(
        self, architecture: architectures.Architecture, info: DatasetInfo, device: torch.device, dtype: torch.dtype
    ) -> torch.nn.Module:
        with architectures.blame_architecture(architecture):
            model = architecture.model_class(self.model_hypers, info).to(device=device, dtype=dtype)
        ensemble = self.options.trainer_hypers.shallow_ensemble
        if ensemble is not None:
            attach_shallow_ensemble(model, ensemble, architecture.name)
        return model

    def initial_state(self, run: RunParts) -> TrainingState:
        """The state training starts from, the model's weights set on every rank, with what
        every checkpoint records of the run."""
        architecture = run.trainer.architecture
        identity = RunIdentity(
            architecture.name,
            to_plain(self.model_hypers),
            run.model_info.to_dict(),
            self.options.raw,
            architecture.checkpoint_version,
        )
        state = self.begin(run, identity)
        hypers, world_size = self.options.trainer_hypers, run.trainer.environment.world_size
        state.global_batch_size = hypers.batch_size * world_size
        state.global_max_atoms = (hypers.max_atoms_per_batch or 0) * world_size
        state.data_fingerprint = run.splits.fingerprint()
        return state

    @abstractmethod
    def begin(self, run: RunParts, identity: RunIdentity) -> TrainingState:
        """This way's own part of :meth:`initial_state`."""

    def resume(self, model: torch.nn.Module, splits: Splits, trainer: Trainer) -> None:
        """What a restart of a run begun this way does before the checkpoint's weights are
        loaded into ``model`` (adapters they include, monitors to attach again); nothing
        for a new model."""
        return None

    def fit_baseline(self, run: RunParts, kept: dict[str, dict[int, Any]] | None = None) -> dict[str, float]:
        """Fit the per-element baseline of the learned targets over the model's elements (a
        fine-tuned model may have more), keeping the values of ``fixed_composition_weights``
        and ``kept``; returns the spreads the loss is scaled by."""
        hypers = self.options.trainer_hypers
        fixed = hypers.fixed_composition_weights
        if kept is not None:
            fixed = {name: {**kept.get(name, {}), **fixed.get(name, {})} for name in {*kept, *fixed}}
        fitted = DatasetInfo(run.model_info.atomic_types, run.splits.info.targets)
        terms, environment = run.trainer.terms, run.trainer.environment
        return fit_baseline(run.model, run.splits.train, fitted, terms, fixed, hypers.scale_targets, environment)


class NewRun(RunStart):
    """A model trained from its initial weights."""

    def begin(self, run: RunParts, identity: RunIdentity) -> TrainingState:
        state = TrainingState(identity)
        run.trainer.adapt(run.model, run.splits.train)
        state.spreads = self.fit_baseline(run)
        run.trainer.environment.broadcast_module(run.model)
        return state
