"""`mtt train`: options -> config -> distributed env -> data -> run folder -> model ->
Trainer -> checkpoint -> export."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from ase.data import chemical_symbols

from .. import architectures, distributed
from ..config import ComposedOptions, load_options
from ..data.batching import check_cutoff, compute_neighbor_lists
from ..data.dataset import DatasetInfo, Splits, load_splits
from ..data.readers import Structure
from ..data.structure_sets import InMemorySet, StructureSet, sample_for_statistics
from ..errors import CheckpointError
from ..metric_loggers import check_loggers, open_loggers
from ..outputs import (
    FILE_LOGGER,
    LOGGER,
    continue_metrics,
    format_metrics,
    new_run_folder,
    setup_logging,
)
from ..schema import to_plain
from ..terminal import comparison_lines, print_summary, summary_lines
from ..training.composition import fit_baseline
from ..training.loss import Metrics, terms_of
from ..training.state import RunIdentity, TrainingState
from ..training.trainer import Trainer
from .finetune import (
    Finetuning,
    check_method,
    fixed_baseline,
    joined_info,
    original_validation,
    prepare_finetuning,
    prepare_training,
    start_from_checkpoint,
    with_original_baseline,
)
from .restart import Restart, check_restart_data, is_complete, prepare_restart, say_complete
from .run_files import deliver, how_it_trains, write_run_files

if TYPE_CHECKING:
    from ..__main__ import RunContext


def train(
    options_path: str, overrides: list[str], output: str, restart_request: str | None, context: RunContext
) -> None:
    setup_logging(None)
    options = load_options(options_path, overrides)
    run = options.run
    environment = distributed.setup(run.distributed.enabled, run.distributed.port, run.distributed.timeout, run.device)
    context.environment = environment
    main = environment.is_main
    setup_logging(None, verbose=main)
    for note in options.notes:
        LOGGER.info("note: %s", note)
    dtype = torch.float64 if run.base_precision == 64 else torch.float32
    architecture = architectures.load(run.architecture.name)
    architecture.check_capabilities(environment.device.type, str(dtype).removeprefix("torch."))

    check_loggers(run.loggers)
    finetuning = prepare_finetuning(options)  # before the restart's checks: the model becomes the checkpoint's
    restart = prepare_restart(restart_request, options, Path(options_path), environment.world_size)
    hypers = options.trainer_hypers
    if restart is not None and is_complete(restart.state, hypers.num_epochs, hypers.early_stopping_patience):
        say_complete(restart, hypers.num_epochs)
        environment.shutdown()
        return

    torch.manual_seed(run.seed)
    splits = load_splits(options.raw, Path(options_path).parent, run.seed)
    info = splits.info  # what is learned
    model_info = info if finetuning is None else joined_info(finetuning, info)  # what the model predicts
    if finetuning is not None:
        check_method(finetuning, info)
    architecture.check_targets(model_info.targets.values())
    if restart is not None:
        check_restart_data(restart, splits, model_info)

    model_hypers = options.model_hypers if restart is None else restart.model_hypers  # the checkpoint's model
    with architectures.blame_architecture(architecture):
        model = architecture.model_class(model_hypers, model_info).to(device=environment.device, dtype=dtype)
        requests = model.requested_neighbor_lists()
    for structures in splits.sets.values():
        if isinstance(structures, InMemorySet):  # computed once; streamed batches get theirs as they are read
            compute_neighbor_lists(structures.structures, requests)
    check_cutoff(_cutoff_sample(splits.train, requests, run.seed), requests)

    folder = environment.broadcast_object(str(new_run_folder()) if main else None)
    folder = Path(folder)
    context.run_folder = folder
    if main:
        setup_logging(folder / "train.log")
        LOGGER.info("run folder: %s", folder)
        for note in options.notes:
            FILE_LOGGER.info("note: %s", note)
        LOGGER.info("distributed: %s", environment.describe())
        write_run_files(folder, options, options_path, context.arguments or [], splits)
        LOGGER.info(
            "%d training, %d validation, %d test structures of %s",
            len(splits.train),
            len(splits.validation),
            len(splits.test),
            ", ".join(chemical_symbols[z] for z in info.atomic_types),
        )
        LOGGER.info("learning %s", ", ".join(t.describe() for t in info.targets.values()))
        LOGGER.info("training: %s", how_it_trains(hypers, environment.world_size))

    loggers = open_loggers(run.loggers, folder, options.raw) if main else []
    trainer = Trainer(hypers, architecture, info, environment, dtype, run.seed, loggers)
    original = None
    try:
        if finetuning is not None:
            original = _watch_original(finetuning, trainer, requests)
        state = _initial_state(
            restart, options, model, model_hypers, model_info, splits, trainer, environment, finetuning
        )
        if finetuning is not None and restart is None:
            state.finetune_start = _finetune_figures(trainer, model, splits, original, finetuning)
        if main and restart is not None and restart.run_folder is not None:
            continue_metrics(restart.run_folder / "metrics.csv", folder / "metrics.csv", state.epoch)
        state = trainer.fit(model, splits.train, splits.validation, state, folder)
        if not splits.train.in_memory:
            loading = trainer.describe_loading()
            if main:
                FILE_LOGGER.info("data loading: %s", loading)
        if main:
            state.save(folder / "model.ckpt", model)

        model.load_state_dict(state.best_model_state)
        test = None
        if splits.test:
            metrics = trainer.evaluate(model, splits.test, None)
            test = metrics.results()
            FILE_LOGGER.info("test set (%d structures): %s", len(splits.test), format_metrics(test, metrics.units()))
        finetune_lines = []
        if finetuning is not None:
            units = {"validation": Metrics(trainer.terms).units()}
            if original is not None:
                units["original validation"] = Metrics(terms_of(original[1])).units()
            after = _finetune_figures(trainer, model, splits, original, baseline_of=finetuning)
            finetune_lines = comparison_lines(
                f"fine-tuning of {finetuning.path} ({len(splits.validation)} validation structures"
                + (f", {len(original[0])} of the original run" if original is not None else "")
                + (
                    ", evaluated with the checkpoint's baseline"
                    if original and finetuning.hypers.refit_baseline
                    else ""
                )
                + ")",
                state.finetune_start,
                after,
                units,
            )
            if main:
                for line in finetune_lines[1:]:
                    FILE_LOGGER.info("fine-tuning: %s", line.strip())
        files = deliver(model, model_info, architecture, folder, Path(output), state.best_epoch) if main else []
        files += [(logger.title, logger.where()) for logger in loggers]
    finally:
        trainer.close()
        for logger in loggers:
            logger.close()
    peak = environment.all_reduce_max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    files.append(("peak memory", f"{peak:.0f} MB" + (" (largest rank)" if environment.enabled else "")))
    if main:
        units = Metrics(trainer.terms).units()
        lines = summary_lines(
            state.best_epoch, state.epoch, hypers.best_model_metric, state.best_validation, test, units, files
        )
        print_summary(lines[: -len(files)] + finetune_lines + lines[-len(files) :])
    environment.shutdown()


def _initial_state(
    restart: Restart | None,
    options: ComposedOptions,
    model: torch.nn.Module,
    model_hypers: object,
    model_info: DatasetInfo,
    splits: Splits,
    trainer: Trainer,
    environment: distributed.DistributedEnvironment,
    finetuning: Finetuning | None,
) -> TrainingState:
    """A new run's state (with the fitted baseline, and the checkpoint's weights when it
    fine-tunes one), or the restart's checkpoint's, its weights loaded."""
    info, hypers = splits.info, options.trainer_hypers
    architecture = trainer.architecture
    identity = RunIdentity(
        architecture.name, to_plain(model_hypers), model_info.to_dict(), options.raw, architecture.checkpoint_version
    )
    if restart is None:
        state = TrainingState(identity)
        fixed = hypers.fixed_composition_weights
        if finetuning is None:
            trainer.adapt(model, splits.train)
        else:  # the checkpoint's statistics of its data stay, as its weights need them
            original = start_from_checkpoint(model, finetuning, architecture)
            kept = fixed_baseline(model, finetuning, info)
            fixed = {name: {**kept.get(name, {}), **fixed.get(name, {})} for name in {*kept, *fixed}}
        scales = model.composition.scales.clone()
        # the learned targets, over the model's elements (a fine-tuned model may have more)
        fitted = DatasetInfo(model_info.atomic_types, info.targets)
        state.spreads = fit_baseline(
            model, splits.train, fitted, trainer.terms, fixed, hypers.scale_targets, environment
        )
        if finetuning is not None:  # the inherited networks' outputs keep their scales
            for mine, _ in model.shared_outputs(original):
                model.composition.scales[mine] = scales[mine]
            LOGGER.info("fine-tuning %s, %s", finetuning.path, prepare_training(model, finetuning.hypers, architecture))
        environment.broadcast_module(model)
    else:
        state = restart.state
        if finetuning is not None:
            LOGGER.info("fine-tuning %s", prepare_training(model, finetuning.hypers, architecture))
        try:
            model.load_state_dict(state.model_state)
        except RuntimeError as error:  # the checks before make this a bug, not the user's doing
            raise CheckpointError(
                f"the weights of '{restart.path}' do not fit the model built from its own hyperparameters "
                f"({str(error).splitlines()[0]}).",
                hint="The checkpoint may come from a modified architecture; export it with the mtt that wrote it.",
            ) from error
        state.identity = identity
        run_of = f" (run {restart.run_folder})" if restart.run_folder is not None else ""
        LOGGER.info("continuing after %s from %s%s", restart.where(), restart.path, run_of)
        for change in restart.applied:
            LOGGER.info("restart: %s", change.describe())
    state.global_batch_size = hypers.batch_size * environment.world_size
    state.global_max_atoms = (hypers.max_atoms_per_batch or 0) * environment.world_size
    state.data_fingerprint = splits.fingerprint()
    return state


def _cutoff_sample(structures: StructureSet, requests: list, seed: int) -> list[Structure]:
    """The training structures the cutoff is checked on: all of a set in memory, a
    thousand of one on disk (read with their neighbour lists)."""
    if isinstance(structures, InMemorySet):
        return structures.structures
    sample = structures.read(sample_for_statistics(len(structures), 1000, seed))
    compute_neighbor_lists(sample, requests)
    return sample


def _watch_original(finetuning: Finetuning, trainer: Trainer, requests: list) -> tuple | None:
    """The original run's validation structures, evaluated every ``original_validation_interval``
    epochs when asked; None (and why, in the log) when they cannot be read."""
    found = original_validation(finetuning, requests)
    if isinstance(found, str):
        LOGGER.info("the original run's validation structures are %s; the cost of fine-tuning is not measured", found)
        return None
    interval = finetuning.hypers.original_validation_interval
    if interval is not None:
        evaluated = (
            (lambda model: model)
            if not finetuning.hypers.refit_baseline
            else (lambda model: with_original_baseline(model, finetuning))
        )
        trainer.monitored["original validation"] = (*found, interval, evaluated)
    return found


def _finetune_figures(
    trainer: Trainer,
    model: torch.nn.Module,
    splits: Splits,
    original: tuple | None,
    start: Finetuning | None = None,
    baseline_of: Finetuning | None = None,
) -> dict[str, dict[str, float]]:
    """The errors of ``model`` on the validation set, and on the original run's; at the
    ``start`` of fine-tuning, those of the checkpoint's own model on the original run's. A
    baseline refitted to new data (``refit_baseline``: another level of theory, with another
    energy zero) is set back to the checkpoint's of ``baseline_of`` for the original data,
    whose references it would otherwise miss by the difference of the zeros."""
    figures = {"validation": trainer.evaluate(model, splits.validation, None).results()}
    if original is not None:
        if start is not None:
            model = start.model(model)
        elif baseline_of is not None and baseline_of.hypers.refit_baseline:
            model = with_original_baseline(model, baseline_of)
        figures["original validation"] = trainer.evaluate(model, original[0], None, original[1]).results()
    return figures
