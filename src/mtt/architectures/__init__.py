"""Architectures: the built-in ones and those registered by other packages.

An architecture is a module exposing ``__model__`` (a subclass of
:class:`mtt.architectures.base.Model`), ``__hypers__`` (a dataclass of its model
hyperparameters) and ``__maintainers__``, and optionally

- ``__training_defaults__``: training options that differ from the Trainer's defaults for
  this architecture (``{"learning_rate": 0.01, "ema_decay": 0.99}``), which the user's
  options still override;
- ``__supported_devices__`` and ``__supported_dtypes__``: what it runs on (by default
  ``("cpu", "cuda")`` and ``("float32", "float64")``), checked before training;
- ``__default_precision__``: the ``base_precision`` (32 or 64, by default 64) of a run whose
  options set none, the one its measurements favour;
- ``__loss_weights__``: weights of the loss terms that the user's ``loss.weights`` leave
  out, by the same names (``{"forces": 3}``), where a run learns them; the others weigh 1;
- ``__target_kinds__``: the kinds of targets its models predict, among "scalar", "scalar
  per atom", "vector" and "vector per atom" (by default the scalars: a per-atom scalar is
  a column of ``per_atom_outputs`` that is not summed; vectors must rotate with the
  structure, which the architecture has to guarantee);
- ``__checkpoint_version__`` (an int, 1 by default) and ``upgrade_checkpoint(state,
  version)``, which turns the model state and hyperparameters of an older checkpoint
  (``{"model_hypers": ..., "model_state": ..., "best_model_state": ...}``) into those of
  ``version + 1``, so that checkpoints survive changes to the architecture.

Other packages register theirs under the ``mtt.architectures`` entry-point group, as
``name = "package.module"``.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Callable, Iterable, Iterator

from ..errors import ArchitectureError, MttError, OptionsError, did_you_mean

BUILTIN = {
    "soap_bpnn": "mtt.architectures.soap_bpnn",
    "equivariant_mp": "mtt.architectures.equivariant_mp",
    "composition": "mtt.architectures.composition",
}
ENTRY_POINT_GROUP = "mtt.architectures"


@dataclass
class Architecture:
    name: str
    model_class: type
    hypers_class: type
    maintainers: list[str]
    training_defaults: dict = field(default_factory=dict)
    supported_devices: tuple[str, ...] = ("cpu", "cuda")
    supported_dtypes: tuple[str, ...] = ("float32", "float64")
    default_precision: int = 64
    loss_weights: dict[str, float] = field(default_factory=dict)
    checkpoint_version: int = 1
    upgrade_checkpoint: Callable[[dict, int], dict] | None = None
    target_kinds: tuple[str, ...] = ("scalar", "scalar per atom")

    def check_targets(self, targets: Iterable) -> None:
        """Refuse a target of a kind this architecture does not predict, naming those that do."""
        for target in targets:
            kind = ("vector" if target.vector else "scalar") + (" per atom" if target.per_atom else "")
            if kind in self.target_kinds:
                continue
            able = []
            for name in sorted(available()):
                try:
                    if kind in load(name).target_kinds:
                        able.append(name)
                except MttError:
                    continue
            raise OptionsError(
                f"target '{target.name}' is a {kind}, which the '{self.name}' architecture does not predict.",
                hint=f"Architectures that do: {', '.join(able) or 'none installed'}.",
            )

    def check_capabilities(self, device: str, dtype: str) -> None:
        """Refuse a device type ('cpu', 'cuda') or dtype the architecture does not run on."""
        for what, value, supported in (
            ("device", device, self.supported_devices),
            ("dtype", dtype, self.supported_dtypes),
        ):
            if value not in supported:
                raise OptionsError(
                    f"the '{self.name}' architecture does not run on {what} {value}; it supports "
                    f"{', '.join(supported)}.",
                    hint="Choose another device (device: ...) or precision (base_precision: 32 or 64), or "
                    "another architecture.",
                )


def available() -> dict[str, str]:
    """Every architecture name with the module that provides it."""
    found = dict(BUILTIN)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def _default_precision(module: ModuleType) -> int:
    precision = getattr(module, "__default_precision__", 64)
    if precision not in (32, 64):
        raise ValueError(f"__default_precision__ must be 32 or 64, not {precision!r}")
    return precision


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
            training_defaults=dict(getattr(module, "__training_defaults__", {})),
            supported_devices=tuple(getattr(module, "__supported_devices__", ("cpu", "cuda"))),
            supported_dtypes=tuple(getattr(module, "__supported_dtypes__", ("float32", "float64"))),
            default_precision=_default_precision(module),
            loss_weights={name: float(weight) for name, weight in getattr(module, "__loss_weights__", {}).items()},
            checkpoint_version=int(getattr(module, "__checkpoint_version__", 1)),
            upgrade_checkpoint=getattr(module, "upgrade_checkpoint", None),
            target_kinds=tuple(getattr(module, "__target_kinds__", ("scalar", "scalar per atom"))),
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
