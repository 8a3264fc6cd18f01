"""Which options a restart may change: the composed options of the new command compared,
key by key, with those the checkpoint's run was started with.

A restart continues one run. What defines the model (the architecture and its
hyperparameters, the precision) and the data (the datasets, their split and the seed that
shuffles them) cannot change: weights trained for one model do not fit another, and a
model half-trained on one split would be validated on structures it was trained on. How
long and how fast to go on, and what is only reported, may change; they are applied and
logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Iterable

from .. import architectures
from ..config.loader import training_defaults
from ..config.options import RunOptions
from ..schema import defaults_of, flow_yaml
from ..training.hypers import TrainerHypers

#: options a restart applies, with what they change
MAY_CHANGE = {
    "architecture.training.num_epochs": "how long training goes on (the cosine schedule follows it)",
    "architecture.training.learning_rate": "the peak learning rate, from the next step on",
    "architecture.training.early_stopping_patience": "when training stops early",
    "architecture.training.checkpoint_interval": "how often checkpoints are written",
    "architecture.training.log_interval": "how often a line is printed",
    "architecture.training.log_mae": "whether MAEs are printed",
    "architecture.training.validation_batch_size": "structures per evaluation batch (the same figures up to rounding)",
    "architecture.training.cache_memory_mb": "memory for kept inputs (the numbers stay the same)",
    "architecture.training.num_workers": "processes reading batches (the numbers stay the same)",
    "architecture.training.uncertainty": "whether uncertainties are fitted after training",
    "architecture.training.uncertainty_ensemble_size": "members of the ensemble fitted after training",
    "architecture.training.uncertainty_forces": "the posterior the ensemble is drawn from after training",
    "distributed": "the launch: ranks, port and timeout",
    "device": "the device",
    "logger": "where the metrics are also logged",
}

#: may change when the structures of a step stay the same: batch_size times the ranks
GLOBAL_BATCH_KEY = "architecture.training.batch_size"
#: the last part of the keys that hold dataset paths
PATH_KEY = "read_from"


@dataclass
class OptionChange:
    """One option whose value differs between the checkpoint's run and now."""

    key: str
    before: Any
    after: Any
    refused_because: str | None  # None: applied

    def describe(self) -> str:
        verdict = "applied" if self.refused_because is None else f"cannot change: {self.refused_because}"
        return f"{self.key}: {show(self.before)} in the checkpoint, {show(self.after)} now ({verdict})"


MISSING = object()


def show(value: Any) -> str:
    """An option value as it would be written in YAML, shortened."""
    if value is MISSING:
        return "not set"
    text = flow_yaml(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``, lists of mappings (dataset blocks) as
    ``a[0].b``; empty mappings and other lists are values."""
    if isinstance(tree, dict) and tree:
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(tree, list) and any(isinstance(item, dict) for item in tree):
        flat = {f"{prefix} (blocks)": len(tree)}
        for number, item in enumerate(tree):
            flat.update(flatten(item, f"{prefix}[{number}]"))
        return flat
    return {prefix: tree}


def default_options(architecture_name: str) -> dict[str, Any]:
    """The options a run gets when it sets nothing: compared with keys that one side lacks
    (options mtt did not have when the checkpoint was written)."""
    tree = defaults_of(RunOptions)
    if architecture_name in architectures.available():
        architecture = architectures.load(architecture_name)
        model, training = defaults_of(architecture.hypers_class), training_defaults(architecture)
    else:
        model, training = {}, defaults_of(TrainerHypers)
    tree["architecture"] = {"name": architecture_name, "model": model, "training": training}
    return flatten(tree)


def _under(key: str, names: Iterable[str]) -> bool:
    """Whether ``key`` is one of ``names`` or an option inside one."""
    return any(key == name or key.startswith(f"{name}.") for name in names)


def refusal(key: str) -> str:
    """Why ``key`` cannot change in a restart."""
    if key == "architecture.name" or key.startswith("architecture.model") or key == "base_precision":
        return "the model"
    if key.startswith(("training_set", "validation_set", "test_set", "dataset.")):
        return "the data"
    if key == "seed":
        return "the split and the order of the batches"
    if key.startswith("architecture.training."):
        return "how the run trains"
    return "the run"


def option_changes(
    checkpoint: dict, now: dict, paths: str = "full", allowed: tuple[str, ...] = ()
) -> list[OptionChange]:
    """Every option that differs between the checkpoint's run (``checkpoint``) and ``now``,
    both composed options; keys one side lacks are compared with today's defaults.

    Dataset paths are compared as they are (``paths="full"``), by file name only
    (``"name"``), or not at all (``"ignore"``: the caller compares the data itself, so a
    dataset that moved is still the same); ``allowed`` adds keys to :data:`MAY_CHANGE`.
    """
    before_name = (checkpoint.get("architecture") or {}).get("name")
    after_name = (now.get("architecture") or {}).get("name")
    old, new = flatten(checkpoint), flatten(now)
    defaults = default_options(after_name) if isinstance(after_name, str) else {}
    changes = []
    for key in list(old) + [k for k in new if k not in old]:
        if before_name != after_name and key.startswith("architecture.model"):
            continue  # another architecture: its name is the one change that matters
        before, after = old.get(key, defaults.get(key, MISSING)), new.get(key, defaults.get(key, MISSING))
        if before == after:
            continue
        if key.rsplit(".", 1)[-1] == PATH_KEY and isinstance(before, str) and isinstance(after, str):
            if paths == "ignore" or (paths == "name" and PurePath(before).name == PurePath(after).name):
                continue
        may = _under(key, MAY_CHANGE) or _under(key, allowed)
        changes.append(OptionChange(key, before, after, None if may else refusal(key)))
    return changes
