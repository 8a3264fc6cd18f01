"""Architectures: the built-in ones and those registered by other packages.

An architecture is a module exposing ``__model__`` (a subclass of
:class:`mtt.architectures.base.Model`), ``__hypers__`` (a dataclass of its model
hyperparameters) and ``__maintainers__``. Other packages register theirs under the
``mtt.architectures`` entry-point group, as ``name = "package.module"``.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Iterator

from ..errors import ArchitectureError, MttError, OptionsError, did_you_mean

BUILTIN = {
    "soap_bpnn": "mtt.architectures.soap_bpnn",
    "composition": "mtt.architectures.composition",
}
ENTRY_POINT_GROUP = "mtt.architectures"


@dataclass
class Architecture:
    name: str
    model_class: type
    hypers_class: type
    maintainers: list[str]


def available() -> dict[str, str]:
    """Every architecture name with the module that provides it."""
    found = dict(BUILTIN)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def check_name(name: str) -> None:
    known = available()
    if name not in known:
        raise OptionsError(
            f"unknown architecture '{name}'.{did_you_mean(name, known)}",
            hint=f"Available architectures: {', '.join(sorted(known))}.",
        )


def load(name: str) -> Architecture:
    """Import an architecture; a failure inside a third-party one is blamed on it."""
    check_name(name)
    module_name = available()[name]
    try:
        module = importlib.import_module(module_name)
        return Architecture(
            name=name,
            model_class=module.__model__,
            hypers_class=module.__hypers__,
            maintainers=list(getattr(module, "__maintainers__", [])),
        )
    except Exception as error:
        if name in BUILTIN:
            raise
        raise ArchitectureError(name, [f"the authors of {module_name}"], error) from error


@contextmanager
def blame_architecture(architecture: Architecture) -> Iterator[None]:
    """Report errors raised inside architecture code as the architecture's."""
    try:
        yield
    except MttError:
        raise
    except Exception as error:
        raise ArchitectureError(architecture.name, architecture.maintainers, error) from error
