"""The one training loop, shared by every architecture."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..architectures import Architecture, blame_architecture
from ..data.batching import batch_indices, make_batch
from ..data.dataset import DatasetInfo
from ..data.readers import Structure
from ..errors import TrainingDiverged
from ..outputs import LOGGER, MetricsCsv, Progress, format_metrics
from .hypers import TrainerHypers
from .loss import Loss, Metrics, terms_of
from .predictions import predict


@dataclass
class TrainingState:
    """What a checkpoint needs to continue training exactly where it stopped."""

    epoch: int = 0
    best_figure: float = math.inf
    best_model_state: dict | None = None
    optimizer_state: dict | None = None
    scheduler_state: dict | None = None
    spreads: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Optimises a model on the training set, validating after every epoch.

    An architecture that truly needs a different optimiser subclasses this and overrides
    :meth:`make_optimizer`; the loop itself is the same for everyone.
    """

    def __init__(
        self,
        hypers: TrainerHypers,
        architecture: Architecture,
        info: DatasetInfo,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
    ):
        self.hypers = hypers
        self.architecture = architecture
        self.info = info
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.terms = terms_of(info)
        self.needs_forces = any(t.forces for t in info.targets.values())
        self.needs_stress = any(t.stress for t in info.targets.values())

    # -- hooks ---------------------------------------------------------------------------
    def make_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        optimizer = torch.optim.AdamW if self.hypers.optimizer == "adamw" else torch.optim.Adam
        return optimizer(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.hypers.learning_rate,
            weight_decay=self.hypers.weight_decay,
        )

    def make_schedule(self, total_steps: int) -> Callable[[int], float]:
        warmup = int(self.hypers.warmup_fraction * total_steps)
        final = self.hypers.final_lr_fraction

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            if self.hypers.lr_schedule == "constant":
                return 1.0
            progress = (step - warmup) / max(1, total_steps - warmup)
            return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

        return factor

    # -- the loop ------------------------------------------------------------------------
    def batch(self, structures: list[Structure]):
        return make_batch(structures, self.dtype, self.device, self.needs_forces, self.needs_stress)

    def evaluate(self, model: torch.nn.Module, structures: list[Structure], loss: Loss | None) -> Metrics:
        """Errors of ``model`` over a whole set, batch by batch in file order."""
        metrics = Metrics(self.terms)
        model.eval()
        for indices in batch_indices(len(structures), self.hypers.batch_size, None):
            batch = self.batch([structures[i] for i in indices])
            with blame_architecture(self.architecture):
                predictions = predict(model, batch, self.info, create_graph=False)
            value = float(loss(predictions, batch).detach()) if loss is not None else None
            metrics.update(predictions, batch, value)
        return metrics

    def fit(
        self,
        model: torch.nn.Module,
        train: list[Structure],
        validation: list[Structure],
        state: TrainingState,
        run_folder: Path,
        save: Callable[[Path, TrainingState], None],
    ) -> TrainingState:
        """Train from ``state.epoch`` to ``num_epochs``; returns the final state."""
        hypers = self.hypers
        loss = Loss(hypers.loss_hypers, self.terms, state.spreads)
        parameters = [p for p in model.parameters() if p.requires_grad]
        optimizer = self.make_optimizer(model) if parameters else None
        n_batches = math.ceil(len(train) / hypers.batch_size)
        scheduler = None
        if optimizer is not None:
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, self.make_schedule(hypers.num_epochs * n_batches)
            )
            if state.optimizer_state is not None:
                optimizer.load_state_dict(state.optimizer_state)
                scheduler.load_state_dict(state.scheduler_state)
        else:
            LOGGER.info("%s has no trainable parameters: only its baseline is fitted", self.architecture.name)

        csv = MetricsCsv(run_folder / "metrics.csv")
        progress = Progress(hypers.num_epochs, state.epoch, len(train), hypers.log_interval)
        units = Metrics(self.terms).units()
        try:
            for epoch in range(state.epoch + 1, hypers.num_epochs + 1):
                model.train()
                train_metrics = Metrics(self.terms)
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                for indices in batch_indices(len(train), hypers.batch_size, generator):
                    batch = self.batch([train[i] for i in indices])
                    with blame_architecture(self.architecture):
                        predictions = predict(model, batch, self.info, create_graph=optimizer is not None)
                    value = loss(predictions, batch)
                    if not torch.isfinite(value):
                        raise TrainingDiverged(
                            f"the loss became {float(value)} at epoch {epoch}.",
                            hint="Lower architecture.training.learning_rate, or check the "
                            "dataset for outliers.",
                        )
                    if optimizer is not None:
                        optimizer.zero_grad(set_to_none=True)
                        value.backward()
                        if hypers.max_grad_norm is not None:
                            torch.nn.utils.clip_grad_norm_(parameters, hypers.max_grad_norm)
                        optimizer.step()
                        scheduler.step()
                    train_metrics.update(predictions, batch, float(value.detach()))

                validation_metrics = self.evaluate(model, validation, loss)
                figure = validation_metrics.selection_figure(hypers.best_model_metric)
                state.epoch = epoch
                if figure < state.best_figure or state.best_model_state is None:
                    state.best_figure = figure
                    state.best_model_state = copy.deepcopy(model.state_dict())
                learning_rate = optimizer.param_groups[0]["lr"] if optimizer else 0.0
                sets = {"train": train_metrics.results(), "validation": validation_metrics.results()}
                csv.write(epoch, learning_rate, sets, units)
                progress.epoch_done(
                    epoch,
                    f"train {format_metrics(sets['train'], units, hypers.log_mae)} | "
                    f"validation {format_metrics(sets['validation'], units, hypers.log_mae)}",
                )
                if optimizer is not None:
                    state.optimizer_state = optimizer.state_dict()
                    state.scheduler_state = scheduler.state_dict()
                if epoch % hypers.checkpoint_interval == 0:
                    save(run_folder / "checkpoints" / f"epoch_{epoch}.ckpt", state)
        finally:
            progress.close()
        if state.best_model_state is None:  # no epoch run (num_epochs reached already)
            state.best_model_state = copy.deepcopy(model.state_dict())
        return state
