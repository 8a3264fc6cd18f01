"""A run that fine-tunes a trained model (``architecture.training.finetune``): it starts
from the checkpoint's model hyperparameters and weights, its elements and targets joined
with the new data's, and measures the cost of fine-tuning on the checkpoint's own
validation structures (a monitor of the Trainer, whose before/after table ends the summary)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from ase.data import chemical_symbols

from .. import architectures
from ..architectures.adapters import add_adapters, choose_trained
from ..architectures.base import copied_along, shared_indices
from ..config import ComposedOptions
from ..data.batching import compute_neighbor_lists
from ..data.dataset import DatasetInfo, Splits, load_splits
from ..data.readers import TargetInfo
from ..data.structure_sets import InMemorySet, StructureSet
from ..errors import DataError, MttError, OptionsError
from ..export import model_from_state
from ..outputs.display import format_metrics
from ..outputs.logs import FILE_LOGGER, LOGGER
from ..outputs.terminal import comparison_lines
from ..schema import flow_yaml, parse_options
from ..training.hypers import FinetuneHypers
from ..training.loss import Metrics, terms_of
from ..training.state import RunIdentity, TrainingState
from ..training.trainer import Trainer
from .base import RunParts, RunStart

WHERE = "architecture.training.finetune"


@dataclass
class FinetuneSource:
    """The checkpoint a run fine-tunes, read once."""

    hypers: FinetuneHypers
    path: Path
    state: TrainingState
    info: DatasetInfo  # the checkpoint's elements and targets
    _model: torch.nn.Module | None = field(default=None, repr=False)

    def model(self, like: torch.nn.Module) -> torch.nn.Module:
        """The checkpoint's own model (its best weights), on the device and in the dtype of
        ``like``: built once, as it is compared with at the start and the end."""
        if self._model is None:
            self._model = model_from_state(self.state)[0]
            parameter = next(like.parameters(), None)
            if parameter is not None:
                self._model = self._model.to(device=parameter.device, dtype=parameter.dtype)
        return self._model


def _lookup(node: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return "(not an option of it)"
        node = node[part]
    return node


def read_finetune_source(options: ComposedOptions) -> FinetuneSource | None:
    """The checkpoint of ``finetune``, checked against the options, whose model
    hyperparameters become the checkpoint's (written so to the run's options.yaml)."""
    hypers = options.trainer_hypers.finetune
    if hypers is None:
        return None
    path = Path(hypers.read_from)
    state = TrainingState.load(path)
    identity = state.identity
    name = options.run.architecture.name
    if identity.architecture != name:
        raise OptionsError(
            f"'{WHERE}.read_from' holds a '{identity.architecture}' model, but architecture.name is '{name}'.",
            hint=f"Set architecture.name: {identity.architecture}: a model is fine-tuned with its own architecture.",
        )
    model = options.raw["architecture"]["model"]
    conflicts = [
        f"architecture.model.{key}: {flow_yaml(_lookup(model, key))} here, "
        f"{flow_yaml(_lookup(identity.model_hypers, key))} in the checkpoint"
        for key in options.given_model_keys
        if _lookup(model, key) != _lookup(identity.model_hypers, key)
    ]
    if conflicts:
        raise OptionsError(
            f"a fine-tuned model keeps the hyperparameters of its checkpoint ({path}), and these options set "
            "others:\n" + "\n".join(f"  - {line}" for line in conflicts),
            hint="Remove them from the options file or the command line.",
        )
    architecture = architectures.load(name)
    options.raw["architecture"]["model"] = copy.deepcopy(identity.model_hypers)
    options.model_hypers = parse_options(architecture.hypers_class, identity.model_hypers, "architecture.model")
    return FinetuneSource(hypers, path, state, DatasetInfo.from_dict(identity.dataset_info))


def _what(target: TargetInfo) -> str:
    """'energy in eV', 'a property in e per atom', 'a vector x 2 in D'."""
    kind = "a vector" if target.vector else (target.quantity or "a property")
    kind += f" x {target.properties}" if target.properties > 1 else ""
    return f"{kind} in {target.unit or 'no unit'}" + (" per atom" if target.per_atom else "")


def joined_info(source: FinetuneSource, new: DatasetInfo) -> DatasetInfo:
    """The fine-tuned model's elements and targets: the checkpoint's and the new data's."""
    old = source.info
    targets = dict(old.targets)
    for name, target in new.targets.items():
        before = old.targets.get(name)
        if before is None:
            targets[name] = target
            continue
        if before.layout != target.layout:
            raise DataError(
                f"target '{name}' is {_what(target)} here, but {_what(before)} in the checkpoint {source.path}.",
                hint="Give the new quantity another name: it then gets a head of its own.",
            )
        targets[name] = copy.copy(target)
        targets[name].forces = before.forces or target.forces
        targets[name].stress = before.stress or target.stress
        targets[name].description = target.description or before.description
    types = sorted(set(old.atomic_types) | set(new.atomic_types))
    return DatasetInfo(atomic_types=types, targets=targets, length_unit=new.length_unit)


def start_from_checkpoint(
    model: torch.nn.Module, source: FinetuneSource, architecture: architectures.Architecture
) -> torch.nn.Module:
    """Copy the checkpoint's best weights into ``model`` (new elements and targets keep
    their initial weights). Returns the checkpoint's own model, for comparisons."""
    old = source.model(model)
    with architectures.blame_architecture(architecture):
        model.inherit(old)
    return old


def check_method(source: FinetuneSource, new: DatasetInfo) -> None:
    """Refuse ``heads`` and ``lora`` for data with elements the checkpoint lacks: the
    weights of a new element outside the heads would stay at their random start."""
    missing = sorted(set(new.atomic_types) - set(source.info.atomic_types))
    if missing and source.hypers.method != "full":
        names = ", ".join(chemical_symbols[z] for z in missing)
        raise OptionsError(
            f"'{WHERE}.method: {source.hypers.method}' cannot learn elements the checkpoint never saw "
            f"({names}): their weights outside the heads would stay at their random start.",
            hint="Use method: full to learn new elements (or train on data without them).",
        )


def prepare_training(model: torch.nn.Module, hypers: FinetuneHypers, architecture: architectures.Architecture) -> str:
    """Adapters for ``lora`` and the weights ``method`` trains; says what is trained. Called
    before the fine-tuned weights (a restart's) are loaded, and after those of the checkpoint."""
    with architectures.blame_architecture(architecture):
        count = 0
        try:
            if hypers.method == "lora":
                count = add_adapters(model, hypers.lora_rank, hypers.lora_alpha)
            trained, total = choose_trained(model, hypers.method)
        except NotImplementedError:
            raise OptionsError(
                f"'{WHERE}.method: {hypers.method}' needs to know the heads of the model, and the "
                f"'{architecture.name}' architecture does not say which they are.",
                hint="Use method: full, or ask its maintainers to implement Model.heads().",
            ) from None
    what = {
        "full": "every weight",
        "heads": "the heads only",
        "lora": f"{count} low-rank adapters (rank {hypers.lora_rank}) and the heads",
    }[hypers.method]
    return f"{hypers.method}: {what}, {trained} of {total} weights trained"


def fixed_baseline(model: torch.nn.Module, source: FinetuneSource, new: DatasetInfo) -> dict[str, dict[int, Any]]:
    """The per-element values kept from the checkpoint: those of its elements for the
    targets it had (with ``refit_baseline``, only of elements the new data lacks)."""
    kept_types = [z for z in source.info.atomic_types if not source.hypers.refit_baseline or z not in new.atomic_types]
    weights = model.composition.weights
    kept: dict[str, dict[int, float | list[float]]] = {}
    for name in new.targets:
        if name not in source.info.targets:
            continue
        index = model.output_names.index(architectures.base.output_name(name))
        columns = slice(model.output_starts[index], model.output_starts[index] + model.output_widths[index])
        rows = {z: weights[model.atomic_types.index(z), columns].tolist() for z in kept_types}
        kept[name] = {z: values[0] if len(values) == 1 else values for z, values in rows.items()}
    return kept


def original_validation(source: FinetuneSource, requests: list) -> tuple[StructureSet, DatasetInfo] | str:
    """The checkpoint's own validation structures, split again from its options and seed,
    or why they are not available."""
    state = source.state
    options = state.identity.options
    try:
        splits = load_splits(options, Path.cwd(), int(options.get("seed") or 0))
    except MttError as error:
        return f"not available: {error.message}"
    if state.data_fingerprint and splits.fingerprint() != state.data_fingerprint:
        return "not available: the files of the original run changed since it was trained"
    if isinstance(splits.validation, InMemorySet):
        compute_neighbor_lists(splits.validation.structures, requests)
    LOGGER.info(
        "the cost of fine-tuning is measured on the %d validation structures of the original run",
        len(splits.validation),
    )
    return splits.validation, splits.info


def with_original_baseline(model: torch.nn.Module, source: FinetuneSource) -> torch.nn.Module:
    """A copy of ``model`` whose baseline is the checkpoint's for its elements and targets."""
    old = source.model(model)
    copy_of = copy.deepcopy(model)
    weights = copy_of.composition.weights
    axes = [(0, shared_indices(copy_of.atomic_types, old.atomic_types)), (1, copy_of.shared_outputs(old))]
    with torch.no_grad():
        weights.copy_(copied_along(weights, old.composition.weights, axes))
    return copy_of


class FinetuneCost:
    """A monitor of the Trainer: the errors on the original run's validation structures
    every ``original_validation_interval`` epochs, and the summary's before/after table
    of the validation sets."""

    def __init__(self, source: FinetuneSource, trainer: Trainer, model: torch.nn.Module, validation: StructureSet):
        self.source = source
        self.trainer = trainer
        self.validation = validation
        with architectures.blame_architecture(trainer.architecture):
            requests = model.requested_neighbor_lists()
        found = original_validation(source, requests)
        self.original: tuple[StructureSet, DatasetInfo] | None = None
        if isinstance(found, str):
            LOGGER.info(
                "the original run's validation structures are %s; the cost of fine-tuning is not measured", found
            )
        else:
            self.original = found

    def _with_original_baseline(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the original data is evaluated with: a baseline refitted to new data
        (``refit_baseline``: another level of theory, with another energy zero) is set back
        to the checkpoint's, whose references it would otherwise miss by the difference of
        the zeros."""
        return with_original_baseline(model, self.source) if self.source.hypers.refit_baseline else model

    def epoch_done(self, model: torch.nn.Module, epoch: int) -> None:
        interval = self.source.hypers.original_validation_interval
        if self.original is None or interval is None or epoch % interval != 0:
            return
        structures, info = self.original
        watched = self.trainer.evaluate(self._with_original_baseline(model), structures, None, info)
        if self.trainer.environment.is_main:
            LOGGER.info(
                "epoch %d, original validation: %s",
                epoch,
                format_metrics(watched.results(), watched.units(), self.trainer.hypers.log_mae),
            )

    def figures(self, model: torch.nn.Module, at_start: bool) -> dict[str, dict[str, float]]:
        """The errors of ``model`` on the validation set and on the original run's; at the
        start, those of the checkpoint's own model on the original run's."""
        figures = {"validation": self.trainer.evaluate(model, self.validation, None).results()}
        if self.original is not None:
            structures, info = self.original
            evaluated = self.source.model(model) if at_start else self._with_original_baseline(model)
            figures["original validation"] = self.trainer.evaluate(evaluated, structures, None, info).results()
        return figures

    def summary_lines(self, model: torch.nn.Module, state: TrainingState) -> list[str]:
        units = {"validation": Metrics(self.trainer.terms).units()}
        if self.original is not None:
            units["original validation"] = Metrics(terms_of(self.original[1])).units()
        after = self.figures(model, at_start=False)
        refit = self.original is not None and self.source.hypers.refit_baseline
        lines = comparison_lines(
            f"fine-tuning of {self.source.path} ({len(self.validation)} validation structures"
            + (f", {len(self.original[0])} of the original run" if self.original is not None else "")
            + (", evaluated with the checkpoint's baseline" if refit else "")
            + ")",
            state.finetune_start,
            after,
            units,
        )
        if self.trainer.environment.is_main:
            for line in lines[1:]:
                FILE_LOGGER.info("fine-tuning: %s", line.strip())
        return lines


class Finetuning(RunStart):
    """A run that starts from a trained model's weights, on new data."""

    def __init__(self, options: ComposedOptions, source: FinetuneSource):
        super().__init__(options)
        self.source = source

    def model_info(self, splits: Splits) -> DatasetInfo:
        check_method(self.source, splits.info)
        return joined_info(self.source, splits.info)

    def begin(self, run: RunParts, identity: RunIdentity) -> TrainingState:
        model, trainer = run.model, run.trainer
        cost = FinetuneCost(self.source, trainer, model, run.splits.validation)
        trainer.monitors.append(cost)
        state = TrainingState(identity)
        original = start_from_checkpoint(model, self.source, trainer.architecture)
        # the checkpoint's statistics of its data stay, as its weights need them
        kept = fixed_baseline(model, self.source, run.splits.info)
        scales = model.composition.scales.clone()
        state.spreads = self.fit_baseline(run, kept)
        for mine, _ in model.shared_outputs(original):  # the inherited networks' outputs keep their scales
            model.composition.scales[mine] = scales[mine]
        trained = prepare_training(model, self.source.hypers, trainer.architecture)
        LOGGER.info("fine-tuning %s, %s", self.source.path, trained)
        trainer.environment.broadcast_module(model)
        state.finetune_start = cost.figures(model, at_start=True)
        return state

    def resume(self, model: torch.nn.Module, splits: Splits, trainer: Trainer) -> None:
        trainer.monitors.append(FinetuneCost(self.source, trainer, model, splits.validation))
        LOGGER.info("fine-tuning %s", prepare_training(model, self.source.hypers, trainer.architecture))
