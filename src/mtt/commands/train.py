"""`mtt train`: options -> config -> distributed env -> data -> run folder -> model ->
Trainer -> checkpoint -> export."""

from __future__ import annotations

import resource
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import architectures, distributed
from ..config import ComposedOptions, load_options
from ..data.batching import check_cutoff, compute_neighbor_lists
from ..data.dataset import DatasetInfo, Splits, load_splits
from ..errors import CheckpointError
from ..export import export_model
from ..outputs import LOGGER, format_metrics, new_run_folder, setup_logging
from ..schema import to_plain
from ..training.composition import fit_baseline
from ..training.state import RunIdentity, TrainingState
from ..training.trainer import Trainer
from .restart import find_latest_checkpoint

if TYPE_CHECKING:
    from ..__main__ import RunContext


def _restart_from(restart: str | None) -> tuple[TrainingState | None, Path | str | None]:
    """The state to continue from, and its checkpoint's path (None, None for a new run)."""
    if restart is None:
        return None, None
    if restart == "auto":
        found = find_latest_checkpoint(Path("outputs"))
        if found is None:
            LOGGER.info("--restart auto: no checkpoint under outputs/, starting from scratch")
            return None, None
        return TrainingState.load(found), found
    return TrainingState.load(restart), restart


def _write_run_files(folder: Path, options: ComposedOptions, splits: Splits) -> None:
    (folder / "options.yaml").write_text(options.to_yaml())
    indices = folder / "indices"
    indices.mkdir()
    for name, origins in splits.origins.items():
        (indices / f"{name}.txt").write_text("".join(f"{path}\t{i}\n" for path, i in origins))


def train(options_path: str, overrides: list[str], output: str, restart: str | None, context: RunContext) -> None:
    setup_logging(None)
    options = load_options(options_path, overrides)
    run = options.run
    environment = distributed.setup(run.distributed.enabled, run.distributed.port, run.distributed.timeout, run.device)
    context.environment = environment
    main = environment.is_main
    setup_logging(None, verbose=main)
    dtype = torch.float64 if run.base_precision == 64 else torch.float32
    architecture = architectures.load(run.architecture.name)
    architecture.check_capabilities(environment.device.type, str(dtype).removeprefix("torch."))

    restarted, restart_path = _restart_from(restart)
    if restarted is not None and restarted.identity.architecture != run.architecture.name:
        raise CheckpointError(
            f"the checkpoint is of architecture '{restarted.identity.architecture}', but the options "
            f"ask for '{run.architecture.name}'.",
            hint="Restart with the options of that run (options.yaml in its run folder).",
        )

    torch.manual_seed(run.seed)
    splits = load_splits(options.raw, Path(options_path).parent, run.seed)
    info = splits.info
    if restarted is not None:
        saved = DatasetInfo.from_dict(restarted.identity.dataset_info)
        if saved.to_dict() != info.to_dict():
            raise CheckpointError(
                "the checkpoint was trained on other elements or targets than these options give "
                f"(checkpoint: elements {saved.atomic_types}, targets {list(saved.targets)}; now: "
                f"elements {info.atomic_types}, targets {list(info.targets)}).",
                hint="Restart with the same datasets as the interrupted run.",
            )

    with architectures.blame_architecture(architecture):
        model = architecture.model_class(options.model_hypers, info).to(device=environment.device, dtype=dtype)
        requests = model.requested_neighbor_lists()
    compute_neighbor_lists(splits.train + splits.validation + splits.test, requests)
    check_cutoff(splits.train, requests)

    folder = environment.broadcast_object(str(new_run_folder()) if main else None)
    folder = Path(folder)
    context.run_folder = folder
    if main:
        setup_logging(folder / "train.log")
        LOGGER.info("run folder: %s", folder)
        LOGGER.info("distributed: %s", environment.describe())
        _write_run_files(folder, options, splits)
        LOGGER.info(
            "%d training, %d validation, %d test structures; elements %s; targets %s",
            len(splits.train),
            len(splits.validation),
            len(splits.test),
            info.atomic_types,
            ", ".join(
                f"{t.name} [{t.unit}]" + (" + forces" if t.forces else "") + (" + stress" if t.stress else "")
                for t in info.targets.values()
            ),
        )

    trainer = Trainer(options.trainer_hypers, architecture, info, environment, dtype, run.seed)
    hypers = options.trainer_hypers
    identity = RunIdentity(
        architecture.name, to_plain(options.model_hypers), info.to_dict(), options.raw, architecture.checkpoint_version
    )
    if restarted is None:
        state = TrainingState(identity)
        trainer.adapt(model, splits.train)
        state.spreads = fit_baseline(
            model, splits.train, info, trainer.terms, hypers.fixed_composition_weights, hypers.scale_targets
        )
        environment.broadcast_module(model)
    else:
        model.load_state_dict(restarted.model_state)
        state = restarted
        state.identity = identity
        where = f"epoch {state.epoch}" + (
            f", step {state.batches_done} of epoch {state.epoch + 1}" if state.batches_done else ""
        )
        LOGGER.info("continuing after %s from %s", where, restart_path)

    state = trainer.fit(model, splits.train, splits.validation, state, folder)
    if main:
        state.save(folder / "model.ckpt", model)

    model.load_state_dict(state.best_model_state)
    if splits.test:
        metrics = trainer.evaluate(model, splits.test, None)
        LOGGER.info(
            "test set (%d structures): %s", len(splits.test), format_metrics(metrics.results(), metrics.units())
        )
    if main:
        with architectures.blame_architecture(architecture):  # TorchScript compiles its code
            exported = export_model(model, info, architecture, folder / "model.pt")
        target = Path(output)
        if target.resolve() != exported.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(exported, target)
            shutil.copytree(folder / "extensions", target.parent / "extensions", dirs_exist_ok=True)
        LOGGER.info("final model written to %s (checkpoint %s)", target, folder / "model.ckpt")
    peak = environment.all_reduce_max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    LOGGER.info("peak resident memory: %.0f MB%s", peak, " (largest rank)" if environment.enabled else "")
    environment.shutdown()
