"""`mtt train`: options -> config -> distributed env -> data -> run folder -> model ->
Trainer -> checkpoint -> export."""

from __future__ import annotations

import resource
import shutil
from pathlib import Path

import torch

from .. import architectures, distributed
from ..checkpoint import export_model, load_checkpoint, save_checkpoint
from ..config import load_options
from ..config.schema import to_plain
from ..data.batching import compute_neighbor_lists
from ..data.dataset import DatasetInfo, load_splits
from ..errors import CheckpointError
from ..outputs import LOGGER, format_metrics, new_run_folder, setup_logging
from ..training.composition import fit_baseline
from ..training.trainer import Trainer, TrainingState
from .restart import find_latest_checkpoint


def _restart_from(restart: str | None):
    """The checkpoint to continue from, and its path (None, None for a new run)."""
    if restart is None:
        return None, None
    if restart == "auto":
        found = find_latest_checkpoint(Path("outputs"))
        if found is None:
            LOGGER.info("--restart auto: no checkpoint under outputs/, starting from scratch")
            return None, None
        return load_checkpoint(found), found
    return load_checkpoint(restart), restart


def _write_run_files(folder: Path, options, splits) -> None:
    (folder / "options.yaml").write_text(options.to_yaml())
    indices = folder / "indices"
    indices.mkdir()
    for name, origins in splits.origins.items():
        (indices / f"{name}.txt").write_text("".join(f"{path}\t{i}\n" for path, i in origins))


def train(options_path: str, overrides: list[str], output: str, restart: str | None, context) -> None:
    setup_logging(None)
    options = load_options(options_path, overrides)
    run = options.run
    environment = distributed.setup(
        run.distributed.enabled, run.distributed.port, run.distributed.timeout, run.device
    )
    context.environment = environment
    main = environment.is_main
    setup_logging(None, verbose=main)
    dtype = torch.float64 if run.base_precision == 64 else torch.float32

    checkpoint, restart_path = _restart_from(restart)
    if checkpoint is not None and checkpoint["architecture"] != run.architecture.name:
        raise CheckpointError(
            f"the checkpoint is of architecture '{checkpoint['architecture']}', but the options "
            f"ask for '{run.architecture.name}'.",
            hint="Restart with the options of that run (options.yaml in its run folder).",
        )

    torch.manual_seed(run.seed)
    splits = load_splits(options.raw, Path(options_path).parent, run.seed)
    info = splits.info
    if checkpoint is not None:
        saved = DatasetInfo.from_dict(checkpoint["dataset_info"])
        if saved.to_dict() != info.to_dict():
            raise CheckpointError(
                "the checkpoint was trained on other elements or targets than these options give "
                f"(checkpoint: elements {saved.atomic_types}, targets {list(saved.targets)}; now: "
                f"elements {info.atomic_types}, targets {list(info.targets)}).",
                hint="Restart with the same datasets as the interrupted run.",
            )

    architecture = architectures.load(run.architecture.name)
    with architectures.blame_architecture(architecture):
        model = architecture.model_class(options.model_hypers, info).to(device=environment.device, dtype=dtype)
        requests = model.requested_neighbor_lists()
    compute_neighbor_lists(splits.train + splits.validation + splits.test, requests)

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
            len(splits.train), len(splits.validation), len(splits.test), info.atomic_types,
            ", ".join(f"{t.name} [{t.unit}]" + (" + forces" if t.forces else "") + (" + stress" if t.stress else "")
                      for t in info.targets.values()),
        )

    trainer = Trainer(options.trainer_hypers, architecture, info, environment, dtype, run.seed)
    hypers = options.trainer_hypers
    if checkpoint is None:
        state = TrainingState()
        state.spreads = fit_baseline(
            model, splits.train, info, trainer.terms, hypers.fixed_composition_weights, hypers.scale_targets
        )
        environment.broadcast_module(model)
    else:
        model.load_state_dict(checkpoint["model_state"])
        state = TrainingState(
            epoch=checkpoint["epoch"],
            batches_done=checkpoint.get("batches_done", 0),
            partial_train_metrics=checkpoint.get("partial_train_metrics"),
            best_figure=checkpoint["best_figure"],
            best_model_state=checkpoint["best_model_state"],
            optimizer_state=checkpoint["optimizer_state"],
            scheduler_state=checkpoint["scheduler_state"],
            spreads=checkpoint["spreads"],
        )
        where = f"epoch {state.epoch}" + (f", step {state.batches_done} of epoch {state.epoch + 1}" if state.batches_done else "")
        LOGGER.info("continuing after %s from %s", where, restart_path)

    def save(path: Path, state: TrainingState) -> None:
        save_checkpoint(path, {
            "architecture": architecture.name,
            "model_hypers": to_plain(options.model_hypers),
            "dataset_info": info.to_dict(),
            "options": options.raw,
            "epoch": state.epoch,
            "batches_done": state.batches_done,
            "partial_train_metrics": state.partial_train_metrics,
            "model_state": model.state_dict(),
            "best_figure": state.best_figure,
            "best_model_state": state.best_model_state,
            "optimizer_state": state.optimizer_state,
            "scheduler_state": state.scheduler_state,
            "spreads": state.spreads,
        })

    state = trainer.fit(model, splits.train, splits.validation, state, folder, save)
    if main:
        save(folder / "model.ckpt", state)

    model.load_state_dict(state.best_model_state)
    if splits.test:
        metrics = trainer.evaluate(model, splits.test, None)
        LOGGER.info("test set (%d structures): %s", len(splits.test), format_metrics(metrics.results(), metrics.units()))
    if main:
        with architectures.blame_architecture(architecture):  # TorchScript compiles its code
            exported = export_model(model, info, architecture.name, folder / "model.pt")
        target = Path(output)
        if target.resolve() != exported.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(exported, target)
            shutil.copytree(folder / "extensions", target.parent / "extensions", dirs_exist_ok=True)
        LOGGER.info("final model written to %s (checkpoint %s)", target, folder / "model.ckpt")
    peak = environment.all_reduce_max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    LOGGER.info("peak resident memory: %.0f MB%s", peak, " (largest rank)" if environment.enabled else "")
    environment.shutdown()
