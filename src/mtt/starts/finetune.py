"""What a fine-tuning run starts from (``architecture.training.finetune``): the checkpoint's
model hyperparameters and weights, its elements and targets joined with the new data's,
and its own validation structures, on which the cost of fine-tuning is measured."""

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
from ..data.dataset import DatasetInfo, load_splits
from ..data.readers import TargetInfo
from ..data.structure_sets import InMemorySet, StructureSet
from ..errors import DataError, MttError, OptionsError
from ..export import model_from_state
from ..outputs import LOGGER
from ..schema import flow_yaml, parse_options
from ..training.hypers import FinetuneHypers
from ..training.state import TrainingState

WHERE = "architecture.training.finetune"


@dataclass
class Finetuning:
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


def prepare_finetuning(options: ComposedOptions) -> Finetuning | None:
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
    return Finetuning(hypers, path, state, DatasetInfo.from_dict(identity.dataset_info))


def _what(target: TargetInfo) -> str:
    """'energy in eV', 'a property in e per atom', 'a vector x 2 in D'."""
    kind = "a vector" if target.vector else (target.quantity or "a property")
    kind += f" x {target.properties}" if target.properties > 1 else ""
    return f"{kind} in {target.unit or 'no unit'}" + (" per atom" if target.per_atom else "")


def joined_info(finetuning: Finetuning, new: DatasetInfo) -> DatasetInfo:
    """The fine-tuned model's elements and targets: the checkpoint's and the new data's."""
    old = finetuning.info
    targets = dict(old.targets)
    for name, target in new.targets.items():
        before = old.targets.get(name)
        if before is None:
            targets[name] = target
            continue
        if before.layout != target.layout:
            raise DataError(
                f"target '{name}' is {_what(target)} here, but {_what(before)} in the checkpoint {finetuning.path}.",
                hint="Give the new quantity another name: it then gets a head of its own.",
            )
        targets[name] = copy.copy(target)
        targets[name].forces = before.forces or target.forces
        targets[name].stress = before.stress or target.stress
        targets[name].description = target.description or before.description
    types = sorted(set(old.atomic_types) | set(new.atomic_types))
    return DatasetInfo(atomic_types=types, targets=targets, length_unit=new.length_unit)


def start_from_checkpoint(
    model: torch.nn.Module, finetuning: Finetuning, architecture: architectures.Architecture
) -> torch.nn.Module:
    """Copy the checkpoint's best weights into ``model`` (new elements and targets keep
    their initial weights). Returns the checkpoint's own model, for comparisons."""
    old = finetuning.model(model)
    with architectures.blame_architecture(architecture):
        model.inherit(old)
    return old


def check_method(finetuning: Finetuning, new: DatasetInfo) -> None:
    """Refuse ``heads`` and ``lora`` for data with elements the checkpoint lacks: the
    weights of a new element outside the heads would stay at their random start."""
    missing = sorted(set(new.atomic_types) - set(finetuning.info.atomic_types))
    if missing and finetuning.hypers.method != "full":
        names = ", ".join(chemical_symbols[z] for z in missing)
        raise OptionsError(
            f"'{WHERE}.method: {finetuning.hypers.method}' cannot learn elements the checkpoint never saw "
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


def fixed_baseline(model: torch.nn.Module, finetuning: Finetuning, new: DatasetInfo) -> dict[str, dict[int, Any]]:
    """The per-element values kept from the checkpoint: those of its elements for the
    targets it had (with ``refit_baseline``, only of elements the new data lacks)."""
    kept_types = [
        z for z in finetuning.info.atomic_types if not finetuning.hypers.refit_baseline or z not in new.atomic_types
    ]
    weights = model.composition.weights
    kept: dict[str, dict[int, float | list[float]]] = {}
    for name in new.targets:
        if name not in finetuning.info.targets:
            continue
        index = model.output_names.index(architectures.base.output_name(name))
        columns = slice(model.output_starts[index], model.output_starts[index] + model.output_widths[index])
        rows = {z: weights[model.atomic_types.index(z), columns].tolist() for z in kept_types}
        kept[name] = {z: values[0] if len(values) == 1 else values for z, values in rows.items()}
    return kept


def original_validation(finetuning: Finetuning, requests: list) -> tuple[StructureSet, DatasetInfo] | str:
    """The checkpoint's own validation structures, split again from its options and seed,
    or why they are not available."""
    state = finetuning.state
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


def with_original_baseline(model: torch.nn.Module, finetuning: Finetuning) -> torch.nn.Module:
    """A copy of ``model`` whose baseline is the checkpoint's for its elements and targets."""
    old = finetuning.model(model)
    copy_of = copy.deepcopy(model)
    weights = copy_of.composition.weights
    axes = [(0, shared_indices(copy_of.atomic_types, old.atomic_types)), (1, copy_of.shared_outputs(old))]
    with torch.no_grad():
        weights.copy_(copied_along(weights, old.composition.weights, axes))
    return copy_of
