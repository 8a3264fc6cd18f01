"""A run that continues an interrupted one (``--restart``): the checkpoint (``auto``: the
latest one of a run with the same options), whether these options may continue it, which
changes are applied, and the checkpoint's state loaded in place of a new one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from .. import architectures
from ..config import ComposedOptions
from ..data.dataset import DatasetInfo, Splits
from ..errors import CheckpointError
from ..outputs.logs import LOGGER
from ..outputs.run_folder import COMMAND_FILE, continue_metrics, run_folder_of
from ..schema import parse_options
from ..training.state import RunIdentity, TrainingState
from .base import RunParts, RunStart
from .option_changes import GLOBAL_BATCH_KEY, OptionChange, option_changes


@dataclass
class RestartPoint:
    """A checkpoint that these options continue."""

    state: TrainingState
    path: Path
    run_folder: Path | None  # the run that wrote the checkpoint, when it lies in one
    model_hypers: Any  # the checkpoint's, parsed: the model is built from these
    applied: list[OptionChange] = field(default_factory=list)

    def where(self) -> str:
        state = self.state
        step = f", step {state.batches_done} of epoch {state.epoch + 1}" if state.batches_done else ""
        return f"epoch {state.epoch}{step}"


def _progress(path: Path) -> tuple[int, int] | None:
    """(epoch, steps into the next) recorded in a checkpoint, read without its weights."""
    try:
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unreadable files are simply not candidates
        return None
    if not isinstance(content, dict) or not isinstance(content.get("epoch"), int):
        return None
    steps = content.get("batches_done", 0)
    return content["epoch"], steps if isinstance(steps, int) else 0


def _run_options(folder: Path) -> dict | None:
    try:
        options = yaml.safe_load((folder / "options.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return options if isinstance(options, dict) else None


#: the precision of runs whose options do not record one (mtt's default before architectures had theirs)
RECORDED_PRECISION = 64


def _comparable(options: ComposedOptions, recorded: dict) -> dict:
    """The options with the seed of ``recorded`` when the seed was drawn at random now, and
    its precision when this run's is the architecture's default: the restart continues the
    run as it was started."""
    comparable = dict(options.raw)
    if options.chosen_seed and isinstance(recorded.get("seed"), int):
        comparable["seed"] = recorded["seed"]
    if options.precision_origin != "given":
        comparable["base_precision"] = recorded.get("base_precision") or RECORDED_PRECISION
    return comparable


def _options_file(folder: Path) -> str | None:
    """The options file a run was started from (its command.yaml)."""
    try:
        command = yaml.safe_load((folder / COMMAND_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return command.get("options_file") if isinstance(command, dict) else None


def _latest(runs: list[tuple[Path, list[Path], list]]) -> Path | None:
    best, best_progress = None, (-1, -1)
    for _, checkpoints, _ in runs:
        for path in checkpoints:
            progress = _progress(path)
            if progress is not None and progress >= best_progress:  # ties: the later run
                best, best_progress = path, progress
    return best


def find_checkpoint(root: Path, options: ComposedOptions, options_file: Path) -> Path | None:
    """The checkpoint with the highest epoch (then step) among the runs under ``root``
    whose options are these, up to those a restart may change; failing that, the latest of
    a run of the same options file (whose changes the restart then refuses, listing them).
    Says what it found."""
    matching, same_file, others = [], [], []
    for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
        checkpoints = sorted((folder / "checkpoints").glob("*.ckpt")) + [folder / "model.ckpt"]
        checkpoints = [c for c in checkpoints if c.is_file()]
        recorded = _run_options(folder)
        if not checkpoints or recorded is None:
            continue
        now = _comparable(options, recorded)
        refused = [c for c in option_changes(recorded, now, allowed=(GLOBAL_BATCH_KEY,)) if c.refused_because]
        run = (folder, checkpoints, refused)
        if not refused:
            matching.append(run)
        elif _options_file(folder) == str(options_file.resolve()):
            same_file.append(run)
        else:
            others.append(run)
    best = _latest(matching) or _latest(same_file)
    if others:
        closest = min(others, key=lambda run: len(run[2]))
        keys = ", ".join(c.key for c in closest[2][:4]) + (", ..." if len(closest[2]) > 4 else "")
        LOGGER.info(
            "--restart auto: %d run(s) under %s have other options and are not continued (the closest, %s, "
            "differs in %s)",
            len(others),
            root,
            closest[0],
            keys,
        )
    if best is None:
        LOGGER.info("--restart auto: no checkpoint under %s/ of a run with these options, starting from scratch", root)
    return best


def _refuse(changes: list[OptionChange], path: Path, run_folder: Path | None) -> None:
    refused = [c for c in changes if c.refused_because]
    if not refused:
        return
    source = f" ({run_folder / 'options.yaml'})" if run_folder is not None else ""
    raise CheckpointError(
        f"the options differ from those of the run of '{path}'{source}; a restart cannot change "
        f"{len(refused)} of them:\n" + "\n".join(f"  - {c.describe()}" for c in changes),
        hint="A restart continues its run as it was started: restart with that run's options, or train "
        "a new model with these options without --restart.",
    )


def find_restart_point(
    request: str | None, options: ComposedOptions, options_file: Path, world_size: int
) -> RestartPoint | None:
    """The checkpoint to continue, checked against ``options`` (nothing is written before);
    the seed of the checkpoint is adopted when this run's was drawn at random, its precision
    when this run's is the architecture's default."""
    if request is None:
        return None
    path = find_checkpoint(Path("outputs"), options, options_file) if request == "auto" else Path(request)
    if path is None:
        return None
    state = TrainingState.load(path)
    recorded = state.identity.options
    adopted = _comparable(options, recorded)
    options.raw["seed"] = options.run.seed = adopted["seed"]
    if options.precision_origin != "given":
        options.raw["base_precision"] = options.run.base_precision = adopted["base_precision"]
        options.precision_origin = "checkpoint"
    run_folder = run_folder_of(path)
    global_batch = options.trainer_hypers.batch_size * world_size
    knows_batch = state.global_batch_size > 0
    changes = option_changes(
        recorded,
        options.raw,
        paths="ignore" if state.data_fingerprint else "name",
        allowed=(GLOBAL_BATCH_KEY,) if knows_batch else (),
    )
    _refuse(changes, path, run_folder)
    if knows_batch and state.global_batch_size != global_batch:
        per_rank, rest = divmod(state.global_batch_size, world_size)
        advice = (
            f"With {world_size} rank(s), architecture.training.batch_size={per_rank} keeps it."
            if not rest
            else "Use a number of ranks that divides it, with batch_size its share."
        )
        raise CheckpointError(
            f"'{path}' was trained with {state.global_batch_size} structures per step, but batch_size "
            f"{options.trainer_hypers.batch_size} on {world_size} rank(s) gives {global_batch}.",
            hint=f"A restart must keep the structures of each step (batch_size times the ranks). {advice}",
        )
    max_atoms = options.trainer_hypers.max_atoms_per_batch
    if max_atoms is not None and state.global_max_atoms and state.global_max_atoms != max_atoms * world_size:
        raise CheckpointError(
            f"'{path}' was trained with batches packed to {state.global_max_atoms} atoms per step, but "
            f"max_atoms_per_batch {max_atoms} on {world_size} rank(s) gives {max_atoms * world_size}.",
            hint="A restart of packed batches keeps the number of ranks it was trained with.",
        )
    architecture = architectures.load(state.identity.architecture)
    hypers = parse_options(architecture.hypers_class, state.identity.model_hypers, "architecture.model")
    if state.best_epoch == 0 and state.epoch > 0:  # a checkpoint of mtt 0.1.0: the best epoch is unknown
        state.best_epoch = state.epoch
    return RestartPoint(state, path, run_folder, hypers, [c for c in changes if not c.refused_because])


def check_restart_data(restart: RestartPoint, splits: Splits, info: DatasetInfo) -> None:
    """The structures of every set are the checkpoint's (or, for checkpoints that do not
    record them, at least its elements and targets); ``info`` is what the model predicts
    (with a fine-tuned checkpoint's elements and targets)."""
    state = restart.state
    saved = DatasetInfo.from_dict(state.identity.dataset_info)
    if saved.to_dict() != info.to_dict():
        raise CheckpointError(
            "the checkpoint was trained on other elements or targets than these options give "
            f"(checkpoint: elements {saved.atomic_types}, targets {list(saved.targets)}; now: "
            f"elements {info.atomic_types}, targets {list(info.targets)}).",
            hint="Restart with the same datasets as the interrupted run.",
        )
    if state.data_fingerprint and state.data_fingerprint != splits.fingerprint():
        raise CheckpointError(
            f"the training, validation or test structures are not those '{restart.path}' was trained on: "
            "a dataset file changed, or another file was given.",
            hint="Restart with the dataset files of the interrupted run, unchanged.",
        )


def is_complete(state: TrainingState, num_epochs: int, patience: int | None) -> bool:
    """Whether the run of ``state`` has nothing left to train."""
    if state.batches_done:
        return False
    stopped_early = patience is not None and state.epoch > 0 and state.epoch - state.best_epoch >= patience
    return state.epoch >= num_epochs or stopped_early


def say_complete(restart: RestartPoint, num_epochs: int) -> None:
    """A finished run asked to continue: nothing to train, nothing written."""
    state = restart.state
    run = restart.run_folder
    why = (
        f"epoch {state.epoch} of {num_epochs}"
        if state.epoch >= num_epochs
        else f"stopped early at epoch {state.epoch}: no better validation figure since epoch {state.best_epoch}"
    )
    model = f" Its model is {run / 'model.pt'}." if run is not None and (run / "model.pt").is_file() else ""
    LOGGER.info(
        "the run of %s is already complete (%s): nothing to train, nothing written.%s\n"
        "To train it longer, raise architecture.training.num_epochs (or early_stopping_patience) on the command line.",
        restart.path,
        why,
        model,
    )


class Restart(RunStart):
    """A run that continues from a checkpoint of one begun in the way of ``continued`` (new
    or fine-tuning), with that checkpoint's model and state."""

    def __init__(self, point: RestartPoint, continued: RunStart):
        super().__init__(continued.options)
        self.point = point
        self.continued = continued

    @property
    def model_hypers(self) -> Any:
        return self.point.model_hypers

    def already_complete(self) -> bool:
        hypers = self.options.trainer_hypers
        if not is_complete(self.point.state, hypers.num_epochs, hypers.early_stopping_patience):
            return False
        say_complete(self.point, hypers.num_epochs)
        return True

    def model_info(self, splits: Splits) -> DatasetInfo:
        info = self.continued.model_info(splits)
        check_restart_data(self.point, splits, info)
        return info

    def begin(self, run: RunParts, identity: RunIdentity) -> TrainingState:
        point = self.point
        self.continued.resume(run.model, run.splits, run.trainer)
        state = point.state
        try:
            run.model.load_state_dict(state.model_state)
        except RuntimeError as error:  # the checks before make this a bug, not the user's doing
            raise CheckpointError(
                f"the weights of '{point.path}' do not fit the model built from its own hyperparameters "
                f"({str(error).splitlines()[0]}).",
                hint="The checkpoint may come from a modified architecture; export it with the mtt that wrote it.",
            ) from error
        state.identity = identity
        run_of = f" (run {point.run_folder})" if point.run_folder is not None else ""
        LOGGER.info("continuing after %s from %s%s", point.where(), point.path, run_of)
        for change in point.applied:
            LOGGER.info("restart: %s", change.describe())
        if run.trainer.environment.is_main and point.run_folder is not None:  # the metrics cover the whole history
            continue_metrics(point.run_folder / "metrics.csv", run.run_folder / "metrics.csv", state.epoch)
        return state
