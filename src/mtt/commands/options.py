"""`mtt options [architecture]`: every option with its type, default and documentation,
on the terminal (the docs' options reference, read from the same dataclasses)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import textwrap
from typing import Any

from .. import architectures
from ..config.loader import training_defaults
from ..config.options import (
    DEFAULT_NAMES,
    TYPE_NAMES,
    ArchitectureOptions,
    DatasetDefaults,
    DistributedOptions,
    RunOptions,
)
from ..data.options import DatasetOptions
from ..schema import OptionEntry, walk_options
from ..training.hypers import TrainerHypers

GROUPS = ("architecture", "distributed", "dataset")
MISSING = object()


def _entry_lines(entry: OptionEntry, width: int) -> list[str]:
    if entry.required:
        default = "required"
    elif entry.key in DEFAULT_NAMES:
        default = DEFAULT_NAMES[entry.key]
    elif entry.nested and entry.default is None:
        default = "null (when given: the keys below)"
    elif entry.nested and not isinstance(entry.default, str):
        default = "(the keys below)"
    else:
        default = entry.default_yaml()
    lines = [f"{entry.key}: {default}"]
    text = f"{entry.type}. {entry.doc}" if entry.doc else entry.type
    lines += textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
    return lines


def _section(title: str, intro: str, entries: list[OptionEntry], width: int) -> list[str]:
    lines = ["", title, "=" * len(title)]
    if intro:
        lines += textwrap.wrap(intro, width) + [""]
    for entry in entries:
        lines += _entry_lines(entry, width)
    return lines


def _training_entries(architecture: architectures.Architecture) -> list[OptionEntry]:
    """The training options with the defaults a run of ``architecture`` starts from: the
    Trainer's, or the architecture's own where it sets one."""
    defaults = training_defaults(architecture)
    entries = []
    for entry in walk_options(TrainerHypers, "architecture.training"):
        value: Any = defaults
        for part in entry.key.split(".")[2:]:
            value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
        entries.append(entry if value is MISSING else dataclasses.replace(entry, default=value))
    return entries


def option_listing(name: str, width: int = 80) -> str:
    """Every option of a run of architecture ``name``, as plain text."""
    architecture = architectures.load(name)
    top = [e for e in walk_options(RunOptions, type_names=TYPE_NAMES) if e.depth == 0 and e.key not in GROUPS]
    model = list(walk_options(architecture.hypers_class, "architecture.model"))
    lines = [
        f"Every option of mtt train, with its default, for architecture.name: {name} "
        "(`mtt options NAME` for another). The keys are written nested in the options file, "
        "or dotted on the command line: architecture.training.num_epochs=5.",
    ]
    lines = textwrap.wrap(lines[0], width)
    lines += _section("Top level", "", top, width)
    lines += _section("Architecture", "", list(walk_options(ArchitectureOptions, "architecture", TYPE_NAMES)), width)
    lines += _section(
        f"Model hyperparameters of {name} (architecture.model)",
        "" if model else f"{name} has none.",
        model,
        width,
    )
    own = sorted(architecture.training_defaults)
    lines += _section(
        "Training hyperparameters (architecture.training)",
        "The same for every architecture"
        + (f"; {name} sets its own defaults of {', '.join(own)}, shown here." if own else "."),
        _training_entries(architecture),
        width,
    )
    lines += _section(
        "Datasets (training_set, validation_set, test_set)",
        "Each takes a dataset block with these keys (a path alone reads its energy); validation_set "
        "and test_set may instead be a fraction of the training structures.",
        list(walk_options(DatasetOptions, "training_set")),
        width,
    )
    lines += _section("Distributed training", "", list(walk_options(DistributedOptions, "distributed")), width)
    lines += _section("Dataset defaults", "", list(walk_options(DatasetDefaults, "dataset")), width)
    available = ", ".join(sorted(architectures.available()))
    lines += ["", f"Architectures: {available}."]
    return "\n".join(lines) + "\n"


def show_options(name: str | None) -> None:
    width = min(100, shutil.get_terminal_size((80, 24)).columns) - 1 if sys.stdout.isatty() else 79
    sys.stdout.write(option_listing(name or "soap_bpnn", width))
