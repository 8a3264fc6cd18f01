"""`mtt train`: options -> distributed env -> data -> model -> Trainer -> checkpoint -> export.

How the run begins (a new model, a fine-tuning, a restart of either) is decided once, by
:func:`mtt.starts.choose_start`; from there the way is the same for every start.
"""

from __future__ import annotations

import resource
import textwrap
from pathlib import Path

import torch
from ase.data import chemical_symbols

from .. import architectures, distributed
from ..config import ComposedOptions, load_options
from ..data.batching import check_cutoff, compute_neighbor_lists
from ..data.dataset import Splits, load_splits
from ..data.readers import Structure
from ..data.structure_sets import InMemorySet, StructureSet, sample_for_statistics
from ..export import export_run_model
from ..outputs.display import format_metrics
from ..outputs.learning_curve import write_learning_curve
from ..outputs.logs import FILE_LOGGER, LOGGER, setup_logging
from ..outputs.metric_loggers import check_loggers, open_loggers
from ..outputs.run_folder import new_run_folder, write_run_files
from ..outputs.terminal import print_summary, summary_lines
from ..starts import RunParts, choose_start
from ..training.loss import Metrics, describe_weights, terms_of
from ..training.trainer import Trainer, describe_training
from ..training.uncertainty import fit_best_model_uncertainty, wants_uncertainty
from .context import RunContext


def train(
    options_path: str, overrides: list[str], output: str, restart_request: str | None, context: RunContext
) -> None:
    setup_logging(None)
    options = load_options(options_path, overrides)
    run, hypers = options.run, options.trainer_hypers
    environment = distributed.setup(run.distributed.enabled, run.distributed.port, run.distributed.timeout, run.device)
    context.environment = environment
    main = environment.is_main
    setup_logging(None, verbose=main)
    for note in options.notes:
        LOGGER.info("note: %s", note)
    architecture = architectures.load(run.architecture.name)
    check_loggers(run.loggers)
    start = choose_start(options, restart_request, Path(options_path), environment.world_size)
    if start.already_complete():
        environment.shutdown()
        return
    dtype = torch.float64 if run.base_precision == 64 else torch.float32  # a restart may adopt its checkpoint's
    architecture.check_capabilities(environment.device.type, str(dtype).removeprefix("torch."))

    torch.manual_seed(run.seed)
    splits = load_splits(options.raw, Path(options_path).parent, run.seed)
    model_info = start.model_info(splits)  # what the model predicts; splits.info is what is learned
    architecture.check_targets(model_info.targets.values())
    model = start.build_model(architecture, model_info, environment.device, dtype)
    uncertain = wants_uncertainty(model, hypers, architecture.name)
    with architectures.blame_architecture(architecture):
        requests = model.requested_neighbor_lists()
    for structures in splits.sets.values():
        if isinstance(structures, InMemorySet):  # computed once; streamed batches get theirs as they are read
            compute_neighbor_lists(structures.structures, requests)
    check_cutoff(_cutoff_sample(splits.train, requests, run.seed), requests)

    folder = Path(environment.broadcast_object(str(new_run_folder()) if main else None))
    context.run_folder = folder
    if main:
        _describe_run(folder, options, options_path, context, splits, environment, architecture)
    loggers = open_loggers(run.loggers, folder, options.raw) if main else []
    trainer = Trainer(hypers, architecture, splits.info, environment, dtype, run.seed, loggers)
    try:
        state = start.initial_state(RunParts(model, model_info, splits, trainer, folder))
        state = trainer.fit(model, splits.train, splits.validation, state, folder)
        if not splits.train.in_memory:
            loading = trainer.describe_loading()
            if main:
                FILE_LOGGER.info("data loading: %s", loading)
        uncertainty_lines = []
        if uncertain:
            fitted = fit_best_model_uncertainty(trainer, model, state, splits.train, splits.validation)
            uncertainty_lines = textwrap.wrap(
                f"uncertainty: {fitted.describe()}", 78, initial_indent="  ", subsequent_indent="    "
            )
            FILE_LOGGER.info("uncertainty: %s", fitted.describe())
        if main:
            state.save(folder / "model.ckpt", model)

        model.load_state_dict(state.best_model_state)
        test = None
        if splits.test:
            metrics = trainer.evaluate(model, splits.test, None)
            test = metrics.results()
            FILE_LOGGER.info("test set (%d structures): %s", len(splits.test), format_metrics(test, metrics.units()))
        monitor_lines = trainer.monitors_summary(model, state)
        files = []
        if main:
            files = export_run_model(model, model_info, architecture, folder, Path(output))
            files.append(("checkpoint", str(folder / "model.ckpt")))
            curve = write_learning_curve(folder / "metrics.csv", folder / "learning_curve.png", state.best_epoch)
            if curve is not None:
                files.append(("learning curve", str(curve)))
        files += [(logger.title, logger.where()) for logger in loggers]
    finally:
        trainer.close()
        for logger in loggers:
            logger.close()
    files.append(("precision", f"float{run.base_precision}"))
    peak = environment.all_reduce_max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    files.append(("peak memory", f"{peak:.0f} MB" + (" (largest rank)" if environment.enabled else "")))
    if main:
        units = Metrics(trainer.terms).units()
        lines = summary_lines(
            state.best_epoch, state.epoch, hypers.best_model_metric, state.best_validation, test, units, files
        )
        print_summary(lines[: -len(files)] + uncertainty_lines + monitor_lines + lines[-len(files) :])
    environment.shutdown()


def _describe_run(
    folder: Path,
    options: ComposedOptions,
    options_path: str,
    context: RunContext,
    splits: Splits,
    environment: distributed.DistributedEnvironment,
    architecture: architectures.Architecture,
) -> None:
    """The run folder's log and files, and the lines that say what this run learns and how."""
    setup_logging(folder / "train.log")
    LOGGER.info("run folder: %s", folder)
    for note in options.notes:
        FILE_LOGGER.info("note: %s", note)
    LOGGER.info("distributed: %s", environment.describe())
    LOGGER.info("precision: %s", describe_precision(options))
    write_run_files(folder, options.to_yaml(), options_path, context.arguments or [], splits.sets)
    info = splits.info
    LOGGER.info(
        "%d training, %d validation, %d test structures of %s",
        len(splits.train),
        len(splits.validation),
        len(splits.test),
        ", ".join(chemical_symbols[z] for z in info.atomic_types),
    )
    LOGGER.info("learning %s", ", ".join(t.describe() for t in info.targets.values()))
    weights = describe_weights(
        options.trainer_hypers.loss_hypers.weights, terms_of(info), architecture.loss_weights, architecture.name
    )
    if weights:
        LOGGER.info("loss weights: %s; the other terms weigh 1", weights)
    LOGGER.info("training: %s", describe_training(options.trainer_hypers, environment.world_size))


def describe_precision(options: ComposedOptions) -> str:
    """Which precision runs, and where it comes from."""
    precision = options.run.base_precision
    if options.precision_origin == "given":
        return f"float{precision} (base_precision: {precision})"
    if options.precision_origin == "checkpoint":
        return f"float{precision}, the restarted run's"
    other = 64 if precision == 32 else 32
    return f"float{precision}, {options.run.architecture.name}'s default (base_precision: {other} for float{other})"


def _cutoff_sample(structures: StructureSet, requests: list, seed: int) -> list[Structure]:
    """The training structures the cutoff is checked on: all of a set in memory, a
    thousand of one on disk (read with their neighbour lists)."""
    if isinstance(structures, InMemorySet):
        return structures.structures
    sample = structures.read(sample_for_statistics(len(structures), 1000, seed))
    compute_neighbor_lists(sample, requests)
    return sample
