"""`mtt train`: options -> config -> data -> run folder -> model -> Trainer -> checkpoint -> export."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import yaml

from .. import architectures
from ..checkpoint import export_model, load_checkpoint, save_checkpoint
from ..config import load_options
from ..config.schema import to_plain
from ..data.batching import compute_neighbor_lists
from ..data.dataset import DatasetInfo, load_splits
from ..errors import CheckpointError, OptionsError
from ..outputs import LOGGER, format_metrics, new_run_folder, setup_logging
from ..training.composition import fit_baseline
from ..training.trainer import Trainer, TrainingState
from .restart import find_latest_checkpoint


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise OptionsError(
            f"device '{name}' was asked for, but torch sees no CUDA GPU here.",
            hint="Use device: auto or cpu, or run on a machine with a GPU and a CUDA build of torch.",
        )
    try:
        return torch.device(name)
    except RuntimeError as error:
        raise OptionsError(f"unknown device '{name}'.", hint="Use auto, cpu, cuda or cuda:N.") from error


def train(options_path: str, overrides: list[str], output: str, restart: str | None, context) -> None:
    setup_logging(None)
    options = load_options(options_path, overrides)
    run = options.run
    device = pick_device(run.device)
    dtype = torch.float64 if run.base_precision == 64 else torch.float32

    checkpoint, restart_path = None, restart
    if restart == "auto":
        found = find_latest_checkpoint(Path("outputs"))
        if found is None:
            LOGGER.info("--restart auto: no checkpoint under outputs/, starting from scratch")
        else:
            restart_path = found
            checkpoint = load_checkpoint(found)
    elif restart is not None:
        checkpoint = load_checkpoint(restart)
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
        model = architecture.model_class(options.model_hypers, info).to(device=device, dtype=dtype)
        requests = model.requested_neighbor_lists()
    compute_neighbor_lists(splits.train + splits.validation + splits.test, requests)

    folder = new_run_folder()
    context.run_folder = folder
    setup_logging(folder / "train.log")
    LOGGER.info("run folder: %s", folder)
    (folder / "options.yaml").write_text(options.to_yaml())
    indices = folder / "indices"
    indices.mkdir()
    for name, origins in splits.origins.items():
        (indices / f"{name}.txt").write_text("".join(f"{path}\t{i}\n" for path, i in origins))
    LOGGER.info(
        "%d training, %d validation, %d test structures; elements %s; targets %s",
        len(splits.train), len(splits.validation), len(splits.test), info.atomic_types,
        ", ".join(f"{t.name} [{t.unit}]" + (" + forces" if t.forces else "") + (" + stress" if t.stress else "")
                  for t in info.targets.values()),
    )

    trainer = Trainer(options.trainer_hypers, architecture, info, device, dtype, run.seed)
    hypers = options.trainer_hypers
    if checkpoint is None:
        state = TrainingState()
        state.spreads = fit_baseline(
            model, splits.train, info, trainer.terms, hypers.fixed_composition_weights, hypers.scale_targets
        )
    else:
        model.load_state_dict(checkpoint["model_state"])
        state = TrainingState(
            epoch=checkpoint["epoch"],
            best_figure=checkpoint["best_figure"],
            best_model_state=checkpoint["best_model_state"],
            optimizer_state=checkpoint["optimizer_state"],
            scheduler_state=checkpoint["scheduler_state"],
            spreads=checkpoint["spreads"],
        )
        LOGGER.info("continuing after epoch %d from %s", state.epoch, restart_path)

    def save(path: Path, state: TrainingState) -> None:
        save_checkpoint(path, {
            "architecture": architecture.name,
            "model_hypers": to_plain(options.model_hypers),
            "dataset_info": info.to_dict(),
            "options": options.raw,
            "epoch": state.epoch,
            "model_state": model.state_dict(),
            "best_figure": state.best_figure,
            "best_model_state": state.best_model_state,
            "optimizer_state": state.optimizer_state,
            "scheduler_state": state.scheduler_state,
            "spreads": state.spreads,
        })

    state = trainer.fit(model, splits.train, splits.validation, state, folder, save)
    save(folder / "model.ckpt", state)

    model.load_state_dict(state.best_model_state)
    if splits.test:
        metrics = trainer.evaluate(model, splits.test, None)
        LOGGER.info("test set (%d structures): %s", len(splits.test), format_metrics(metrics.results(), metrics.units()))
    with architectures.blame_architecture(architecture):  # TorchScript compiles its code
        exported = export_model(model, info, architecture.name, folder / "model.pt")
    target = Path(output)
    if target.resolve() != exported.resolve():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exported, target)
        shutil.copytree(folder / "extensions", target.parent / "extensions", dirs_exist_ok=True)
    LOGGER.info("final model written to %s (checkpoint %s)", target, folder / "model.ckpt")
