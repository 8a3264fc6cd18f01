"""The one training loop, shared by every architecture, for one process or many."""

from __future__ import annotations

import contextlib
import copy
import math
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from .. import STARTED
from ..architectures import Architecture, blame_architecture
from ..data.batching import Batch, batch_indices, flat_batch_of, make_batch, packed_batches, share_by_atoms
from ..data.dataset import DatasetInfo
from ..data.loading import BatchLoader, default_workers
from ..data.readers import Structure
from ..data.structure_sets import StructureSet, sample_for_statistics
from ..distributed import DistributedEnvironment, share
from ..errors import TrainingDiverged
from ..outputs.logs import FILE_LOGGER, LOGGER
from ..outputs.run_folder import MetricsCsv
from ..outputs.terminal import EpochTable
from .averaging import WeightAverage
from .cache import PrecomputedInputs
from .hypers import TrainerHypers
from .loss import Loss, Metrics, term_shares, terms_of
from .optimizer import FusedAdam, LearningRateSchedule
from .plateau import PlateauSchedule
from .predictions import predict
from .shallow_ensemble import EnsembleLossTerm
from .state import TrainingState
from .stopping import StopRequested, StopSignals


def _snapshot(model: torch.nn.Module) -> dict:
    """A copy of the model's state that later steps leave alone: its tensors cloned,
    which is much cheaper than deep-copying the state dict."""
    state = model.state_dict()
    snapshot = type(state)(
        (name, value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value))
        for name, value in state.items()
    )
    snapshot._metadata = copy.deepcopy(getattr(state, "_metadata", None))  # modules' versions, for loading
    return snapshot


class EpochLogger(Protocol):
    """Something that records every epoch's metrics (see :mod:`mtt.metric_loggers`)."""

    def log_epoch(
        self, epoch: int, learning_rate: float, sets: dict[str, dict[str, float]], units: dict[str, str]
    ) -> None: ...


class Monitor(Protocol):
    """Something a run watches besides its validation set (a fine-tuning's cost on the
    original run's data): told of every epoch with the weights being validated, and asked
    for its lines of the summary at the end. Its evaluations are collectives: every rank
    calls them."""

    def epoch_done(self, model: torch.nn.Module, epoch: int) -> None: ...

    def summary_lines(self, model: torch.nn.Module, state: TrainingState) -> list[str]: ...


def describe_training(hypers: TrainerHypers, world_size: int) -> str:
    """The schedule of a run in a line: what metatrain's options turn into is visible."""
    batch = f"batch {hypers.batch_size}" + (
        f" per rank ({hypers.batch_size * world_size} in all)" if world_size > 1 else ""
    )
    if hypers.max_atoms_per_batch is not None:
        batch = f"batches packed to {hypers.max_atoms_per_batch} atoms" + (
            f" per rank ({hypers.max_atoms_per_batch * world_size} in all)" if world_size > 1 else ""
        )
    plateau = PlateauSchedule(hypers.scheduler_patience, hypers.scheduler_factor)  # its defaults filled in
    schedule = {
        "cosine": f"cosine decay to {hypers.final_lr_fraction:g} of it",
        "constant": "constant",
        "plateau": f"times {plateau.factor:g} when the validation loss has not decreased for more than "
        f"{plateau.patience} epochs",
    }[hypers.schedule]
    stop = (
        f", stops after {hypers.early_stopping_patience} epochs without a better model"
        if hypers.early_stopping_patience
        else ""
    )
    return f"{hypers.num_epochs} epochs, {batch}, learning rate {hypers.learning_rate:g} ({schedule}){stop}"


class Trainer:
    """Optimises a model on the training set, validating after every epoch.

    ``batch_size`` is per rank: with N ranks each optimisation step sees N times as many
    structures, split contiguously from the same shuffled order a single process uses;
    each rank reads only its part.
    """

    #: structures an architecture's statistics of the training set are taken from, at most
    ADAPT_LIMIT = 10_000

    def __init__(
        self,
        hypers: TrainerHypers,
        architecture: Architecture,
        info: DatasetInfo,
        environment: DistributedEnvironment,
        dtype: torch.dtype,
        seed: int,
        loggers: Sequence[EpochLogger] = (),
    ):
        self.hypers = hypers
        self.loggers = list(loggers)  # also given every epoch's metrics (TensorBoard, W&B)
        self.architecture = architecture
        self.info = info
        self.environment = environment
        self.device = environment.device
        self.dtype = dtype
        self.seed = seed
        self.terms = terms_of(info)
        self.precomputed: PrecomputedInputs | None = None
        #: the shallow ensemble's term of the loss, beside ``Loss``'s (made by :meth:`fit`)
        self.ensemble_term: EnsembleLossTerm | None = None
        self.loaders: dict[int, BatchLoader] = {}
        self._train_set = 0  # id of the training set
        self.training_seconds = 0.0  # in the training steps, waiting for data included
        self.first_step_logged = False
        #: told of every epoch, and asked for lines of the summary (see :class:`Monitor`)
        self.monitors: list[Monitor] = []

    def loader(self, structures: StructureSet, model: torch.nn.Module) -> BatchLoader:
        """The loader of a set, made once (its workers stay for the whole run)."""
        if id(structures) not in self.loaders:
            with blame_architecture(self.architecture):
                requests = model.requested_neighbor_lists()
            workers = self.hypers.num_workers
            if workers is None:
                workers = default_workers(structures, self.environment.world_size)
            self.loaders[id(structures)] = BatchLoader(structures, requests, self.device, workers)
        return self.loaders[id(structures)]

    def describe_loading(self) -> str:
        """How many training structures each rank read in the first and last epochs and
        holds in memory, and how much of the training steps' time went to waiting for them;
        on every rank (a collective)."""
        loader = self.loaders.get(self._train_set)
        environment = self.environment
        counts = torch.zeros((3, environment.world_size), dtype=torch.float64)
        if loader is not None and loader.reads:
            rank = environment.rank if environment.enabled else 0
            counts[:, rank] = torch.tensor([loader.reads[0], loader.reads[-1], len(loader.held)], dtype=torch.float64)
        counts = environment.all_reduce_sum(counts)
        if loader is None or self.training_seconds <= 0:
            return "no training step"
        first, last, held = (", ".join(f"{count:.0f}" for count in row) for row in counts.tolist())
        return (
            f"structures read by each rank in the first epoch: {first}; in the last: {last}; held in memory: "
            f"{held}; {loader.waited:.1f} s of {self.training_seconds:.1f} s of training steps on this rank "
            f"waiting for data ({100 * loader.waited / self.training_seconds:.1f}%), {loader.workers} worker"
            f"{'s' if loader.workers != 1 else ''} per rank"
        )

    def monitors_summary(self, model: torch.nn.Module, state: TrainingState) -> list[str]:
        """The lines the monitors add to the summary, for ``model`` (the best one); on every rank."""
        return [line for monitor in self.monitors for line in monitor.summary_lines(model, state)]

    def close(self) -> None:
        """Stop the loaders' workers."""
        for loader in self.loaders.values():
            loader.close()
        self.loaders.clear()

    # -- optimiser and learning rate ----------------------------------------------------
    def make_optimizer(self, model: torch.nn.Module) -> FusedAdam:
        """Adam or AdamW, one fused pass over the parameters per step (:mod:`.optimizer`)."""
        return FusedAdam(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.hypers.learning_rate,
            weight_decay=self.hypers.weight_decay,
            decoupled_weight_decay=self.hypers.optimizer == "adamw",
            amsgrad=self.hypers.amsgrad,
        )

    def make_schedule(self, total_steps: int, steps_per_epoch: int) -> Callable[[int], float]:
        """The learning rate of each step, as a factor of the peak: warm-up, then cosine
        decay or constant, then the final stage's constant rate if there is one."""
        warmup = int(self.hypers.warmup_fraction * total_steps)
        final = self.hypers.final_lr_fraction
        stage_start = self.hypers.final_stage_start()
        stage_step = total_steps if stage_start is None else stage_start * steps_per_epoch
        stage_factor = 1.0 if stage_start is None else self.hypers.final_stage.learning_rate / self.hypers.learning_rate

        def factor(step: int) -> float:
            if step >= stage_step:
                return stage_factor
            if step < warmup:
                return (step + 1) / (warmup + 1)
            if self.hypers.schedule in ("constant", "plateau"):  # plateau: its factor is applied apart
                return 1.0
            progress = (step - warmup) / max(1, stage_step - warmup)
            return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

        return factor

    # -- pieces of the loop --------------------------------------------------------------
    def batch(self, structures: list[Structure]) -> Batch:
        """The flat batch of ``structures``, with what the trainer keeps of them."""
        kept = self.precomputed
        return make_batch(
            structures,
            self.dtype,
            self.device,
            self.info.needs_forces,
            self.info.needs_stress,
            keep=kept.keep if kept is not None else None,
        )

    def adapt(self, model: torch.nn.Module, structures: StructureSet) -> None:
        """Let the architecture take its statistics of the training set (``Model.adapt_to_data``),
        from at most :attr:`ADAPT_LIMIT` of its structures."""
        size = self.hypers.batch_size
        chosen = sample_for_statistics(len(structures), self.ADAPT_LIMIT, self.seed)
        items = [chosen[start : start + size] for start in range(0, len(chosen), size)]
        batches = (
            make_batch(read, self.dtype, self.device, False, False).flat
            for read in self.loader(structures, model).batches(items)
        )
        with torch.no_grad(), blame_architecture(self.architecture):
            model.adapt_to_data(batches)

    def global_batches(self, structures: StructureSet, epoch: int) -> list[list[int]]:
        """The shuffled batches of an epoch, the same on every rank and for any rank count:
        ``batch_size`` structures per rank, or packed to ``max_atoms_per_batch`` atoms per rank."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        world_size = self.environment.world_size
        if self.hypers.max_atoms_per_batch is None:
            return batch_indices(len(structures), self.hypers.batch_size * world_size, generator)
        order = torch.randperm(len(structures), generator=generator).tolist()
        return packed_batches(order, structures.n_atoms, self.hypers.max_atoms_per_batch * world_size)

    def share(self, indices: list[int], n_atoms: np.ndarray) -> list[int]:
        """This rank's part of a global batch: as many structures as every other rank, or
        with packed batches about as many atoms."""
        environment = self.environment
        if self.hypers.max_atoms_per_batch is None:
            return share(indices, environment.rank, environment.world_size)
        return share_by_atoms(indices, n_atoms, environment.rank, environment.world_size)

    def set_batches(self, structures: StructureSet) -> list[list[int]]:
        """Batches of this rank's part of a set to evaluate, in order: ``validation_batch_size``
        structures, or twice the training batch (see that option)."""
        hypers = self.hypers
        mine = share(list(range(len(structures))), self.environment.rank, self.environment.world_size)
        size = hypers.validation_batch_size
        if size is None and hypers.max_atoms_per_batch is not None:
            return packed_batches(mine, structures.n_atoms, 2 * hypers.max_atoms_per_batch)
        size = size or 2 * hypers.batch_size
        return [[mine[i] for i in batch] for batch in batch_indices(len(mine), size, None)]

    def evaluate(
        self, model: torch.nn.Module, structures: StructureSet, loss: Loss | None, info: DatasetInfo | None = None
    ) -> Metrics:
        """Errors of ``model`` over a whole set, on the terms of the training targets or of
        ``info``'s (the original validation set of a fine-tuning run); each rank takes a
        part, sums are reduced."""
        terms = self.terms if info is None else terms_of(info)
        metrics = Metrics(terms)
        model.eval()
        hold = self.precomputed.hold if self.precomputed is not None and info is None else None
        set_info = info or self.info
        forces, stress = set_info.needs_forces, set_info.needs_stress
        for read in self.loader(structures, model).batches(self.set_batches(structures), hold):
            batch = self.batch(read) if info is None else make_batch(read, self.dtype, self.device, forces, stress)
            # without derivatives to take, no graph at all: a batch needs only its activations
            with torch.set_grad_enabled(forces or stress), blame_architecture(self.architecture):
                predictions = predict(model, batch, set_info, create_graph=False)
            metrics.update(predictions, batch, loss)
        metrics.load_tensor(self.environment.all_reduce_sum(metrics.as_tensor()))
        return metrics

    def _step(
        self,
        model: torch.nn.Module,
        loss: Loss,
        optimizer: FusedAdam | None,
        scheduler: LearningRateSchedule | None,
        parameters: list[torch.Tensor],
        structures: list[Structure],
        mine: list[int],
        indices: list[int],
        n_atoms: np.ndarray,
        presence: Callable,
        epoch: int,
        metrics: Metrics,
    ) -> None:
        """One optimisation step on this rank's part ``mine`` of the global batch ``indices``,
        whose ``structures`` were read (the first of the batch when this rank has none)."""
        environment = self.environment
        batch = self.batch(structures)
        with blame_architecture(self.architecture):
            predictions = predict(model, batch, self.info, create_graph=optimizer is not None)
        terms = loss.per_term(predictions, batch)
        # keyed by the label of the energy's own term, whose distributed share it takes
        ensemble = self.ensemble_term.per_term(predictions, batch) if self.ensemble_term is not None else {}
        value = sum(terms.values()) + sum(ensemble.values())
        if not torch.isfinite(value):
            raise TrainingDiverged(
                f"the loss became {float(value)} at epoch {epoch}.",
                hint="Lower architecture.training.learning_rate, or check the dataset for outliers.",
            )
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
            # each term's mean, rescaled by this rank's share of its elements (see term_shares)
            shares = term_shares(self.terms, mine, indices, n_atoms, presence, environment.world_size)
            # gradients of the weights only: the positions and strains are leaves too, and
            # their second derivatives would cost a quarter of the step for nothing
            weighted = sum(terms[label] * share for label, share in shares.items())
            if ensemble:  # the ensemble's term trains its members alone (see .shallow_ensemble)
                members = [p for p in model.shallow_ensemble.parameters() if p.requires_grad]
                own = [p for p in parameters if all(p is not m for m in members)]
                weighted.backward(inputs=own, retain_graph=True)
                sum(ensemble[label] * shares[label] for label in ensemble).backward(inputs=members)
            else:
                weighted.backward(inputs=parameters)
            environment.average_gradients(parameters)
            if self.hypers.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(parameters, self.hypers.max_grad_norm)
            optimizer.step()
            scheduler.step()
        if mine:
            metrics.update(predictions, batch, loss)

    def _stop(self, model: torch.nn.Module, state: TrainingState, signals: StopSignals, path: Path, when: str) -> None:
        """Write the checkpoint of a run stopped by a signal, on rank 0, and stop every rank
        once it is written."""
        cause = signals.received or "a signal to another rank"
        if self.environment.is_main:
            state.save(path, model)
            LOGGER.info("stopped by %s %s; checkpoint written to %s", cause, when, path)
        self.environment.barrier()
        raise StopRequested(
            f"training stopped on {cause} {when}; the checkpoint {path} holds it.",
            hint="Continue with `mtt train <options> --restart auto` (or --restart with that file).",
            signal_name=signals.received,
        )

    # -- the loop ------------------------------------------------------------------------
    def fit(
        self,
        model: torch.nn.Module,
        train: StructureSet,
        validation: StructureSet,
        state: TrainingState,
        run_folder: Path,
    ) -> TrainingState:
        """Train from ``state`` to ``num_epochs``; returns the final state.

        On SIGUSR1 or SIGTERM the current step ends, a checkpoint is written and
        :class:`StopRequested` is raised; ``--restart`` continues from that very step.
        """
        hypers = self.hypers
        main = self.environment.is_main
        self.precomputed = PrecomputedInputs(
            model,
            self.info.needs_forces or self.info.needs_stress,
            hypers.cache_memory_mb,
            lambda structure: flat_batch_of(structure, self.dtype, self.device),
            int(train.n_atoms.sum()),
        )
        # the final stage's loss made now too, so that a misnamed weight is reported before training
        defaults = self.architecture.loss_weights
        first_loss = Loss(hypers.loss_hypers, self.terms, state.spreads, defaults=defaults)
        final_loss = Loss(
            hypers.loss_hypers_of(hypers.num_epochs),
            self.terms,
            state.spreads,
            "architecture.training.final_stage",
            defaults,
        )
        if hypers.shallow_ensemble is not None:
            self.ensemble_term = EnsembleLossTerm(hypers.shallow_ensemble, self.terms, state.spreads)
        stage_start = hypers.final_stage_start()
        parameters = [p for p in model.parameters() if p.requires_grad]
        optimizer = self.make_optimizer(model) if parameters else None
        steps_per_epoch = len(self.global_batches(train, 1))  # packed batches: about as many every epoch
        scheduler = average = None
        plateau = None
        if hypers.schedule == "plateau":
            plateau = PlateauSchedule(hypers.scheduler_patience, hypers.scheduler_factor)
        if plateau is not None and state.plateau_state is not None:
            plateau.load_state_dict(state.plateau_state)
        if optimizer is not None:
            schedule = self.make_schedule(hypers.num_epochs * steps_per_epoch, steps_per_epoch)
            scheduler = LearningRateSchedule(optimizer, schedule)
            scheduler.scale = plateau.scale if plateau is not None else 1.0
            if state.optimizer_state is not None:
                optimizer.load_state_dict(state.optimizer_state)
                scheduler.load_state_dict(state.scheduler_state)
                scheduler.set_peak(hypers.learning_rate)  # a restart may change it
            if hypers.ema_decay is not None:
                average = WeightAverage(parameters, hypers.ema_decay)
                if state.ema_state is not None:
                    average.load_state_dict(state.ema_state)
        elif main:
            LOGGER.info("%s has no trainable parameters: only its baseline is fitted", self.architecture.name)

        csv = MetricsCsv(run_folder / "metrics.csv") if main else None
        loader = self.loader(train, model)
        loader.waited, loader.reads = 0.0, []
        self._train_set = id(train)
        units = Metrics(self.terms).units()
        progress = None

        def remember_optimizer() -> None:
            if optimizer is not None:
                state.optimizer_state = optimizer.state_dict()
                state.scheduler_state = scheduler.state_dict()
            if average is not None:
                state.ema_state = average.state_dict()

        try:
            with StopSignals() as signals:
                if main:  # its header is on the terminal once a Ctrl-C stops cleanly
                    progress = EpochTable(hypers.num_epochs, state.epoch, len(train), hypers.log_interval, units)
                for epoch in range(state.epoch + 1, hypers.num_epochs + 1):
                    started = time.monotonic()
                    model.train()
                    loss = final_loss if stage_start is not None and epoch > stage_start else first_loss
                    train_metrics = Metrics(self.terms)
                    if state.partial_train_metrics is not None and main:  # already summed over ranks
                        train_metrics.load_tensor(state.partial_train_metrics)
                    batches = self.global_batches(train, epoch)
                    first = state.batches_done
                    n_atoms = train.n_atoms
                    shares = [self.share(b, n_atoms) for b in batches[first:]]
                    items = [mine or b[:1] for mine, b in zip(shares, batches[first:])]
                    steps_started = time.monotonic()
                    for number, read in enumerate(loader.batches(items, self.precomputed.hold), start=first):
                        self._step(
                            model,
                            loss,
                            optimizer,
                            scheduler,
                            parameters,
                            read,
                            shares[number - first],
                            batches[number],
                            n_atoms,
                            lambda term: train.presence(term.target, term.kind),
                            epoch,
                            train_metrics,
                        )
                        if average is not None:
                            average.update()
                        if not self.first_step_logged and main:
                            self.first_step_logged = True
                            FILE_LOGGER.info(
                                "first optimisation step done %.1f s after mtt started", time.monotonic() - STARTED
                            )
                        if progress is not None:
                            progress.step_done(epoch, number + 1, len(batches))
                        if self.environment.any_rank(signals.received is not None) and number + 1 < len(batches):
                            state.batches_done = number + 1
                            state.partial_train_metrics = self.environment.all_reduce_sum(train_metrics.as_tensor())
                            remember_optimizer()
                            self._stop(
                                model,
                                state,
                                signals,
                                run_folder / "checkpoints" / f"epoch_{epoch - 1}_step_{number + 1}.ckpt",
                                f"during epoch {epoch} after {number + 1} of {len(batches)} steps",
                            )
                    self.training_seconds += time.monotonic() - steps_started
                    state.batches_done, state.partial_train_metrics = 0, None
                    train_metrics.load_tensor(self.environment.all_reduce_sum(train_metrics.as_tensor()))

                    with average.swapped_in() if average is not None else contextlib.nullcontext():
                        validation_metrics = self.evaluate(model, validation, loss)
                        figure = validation_metrics.selection_figure(hypers.best_model_metric)
                        state.epoch = epoch
                        better = figure < state.best_figure or state.best_model_state is None
                        if better:
                            state.best_figure = figure
                            state.best_model_state = _snapshot(model)
                            state.best_epoch, state.best_validation = epoch, validation_metrics.results()
                        for monitor in self.monitors:
                            monitor.epoch_done(model, epoch)
                    learning_rate = optimizer.param_groups[0]["lr"] if optimizer else 0.0
                    if plateau is not None and scheduler is not None:  # the same loss on every rank
                        if plateau.step(validation_metrics.results()["loss"]) and main:
                            LOGGER.info(
                                "epoch %d: no lower validation loss for %d epochs, learning rate multiplied by %g",
                                epoch,
                                plateau.patience + 1,
                                plateau.factor,
                            )
                        scheduler.set_scale(plateau.scale)
                        state.plateau_state = plateau.state_dict()
                    remember_optimizer()
                    if main:
                        sets = {"train": train_metrics.results(), "validation": validation_metrics.results()}
                        csv.write(epoch, time.monotonic() - started, learning_rate, sets, units)
                        for logger in self.loggers:
                            logger.log_epoch(epoch, learning_rate, sets, units)
                        progress.epoch_done(epoch, sets, learning_rate, better)
                        if epoch % hypers.checkpoint_interval == 0:
                            state.save(run_folder / "checkpoints" / f"epoch_{epoch}.ckpt", model)
                    patience = hypers.early_stopping_patience
                    if patience is not None and epoch - state.best_epoch >= patience and epoch < hypers.num_epochs:
                        if main:
                            LOGGER.info(
                                "early stopping after epoch %d: no better validation %s for %d epochs (best: epoch %d)",
                                epoch,
                                hypers.best_model_metric.replace("_", " "),
                                patience,
                                state.best_epoch,
                            )
                        break
                    if self.environment.any_rank(signals.received is not None) and epoch < hypers.num_epochs:
                        self._stop(
                            model,
                            state,
                            signals,
                            run_folder / "checkpoints" / f"epoch_{epoch}.ckpt",
                            f"after epoch {epoch}",
                        )
        finally:
            if progress is not None:
                progress.close()
        if state.best_model_state is None:  # no epoch run (num_epochs reached already)
            with average.swapped_in() if average is not None else contextlib.nullcontext():
                state.best_model_state = _snapshot(model)
        return state
