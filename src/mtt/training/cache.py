"""What an architecture computes once per structure and the trainer keeps between epochs.

Training structures do not move, so whatever a model computes from them without its
weights (SOAP-BPNN: the descriptor, when no derivative is trained) is the same at every
epoch. The model says what that is (``Model.precompute``); this keeps it, within a
memory budget, and attaches it to the structure's system at every step, or to the flat
batches of models that take them (a row per atom, concatenated).
"""

from __future__ import annotations

from typing import Callable

import torch
from metatensor.torch import TensorMap
from metatomic.torch import System

from ..data.batching import FlatBatch
from ..data.readers import Structure
from ..outputs import LOGGER


class PrecomputedInputs:
    """Keeps ``model.precompute``'s data per structure, up to ``budget_mb``."""

    def __init__(self, model: torch.nn.Module, derivatives: bool, budget_mb: float):
        self.model = model
        self.derivatives = derivatives
        self.budget = budget_mb * 1024**2
        self.used = 0
        self.full = budget_mb <= 0
        self.kept: dict[int, dict[str, TensorMap]] = {}
        self.given: dict[int, System] = {}  # structure -> the (reused) system that has its data
        self.rows: dict[int, dict[str, torch.Tensor]] = {}  # structure -> its data's block values

    def _data(self, structure: Structure, system: System) -> dict[str, TensorMap] | None:
        """The structure's kept data, computed from ``system`` the first time, if it fits."""
        data = self.kept.get(id(structure))
        if data is None and not self.full:
            with torch.no_grad():
                data = self.model.precompute(system, self.derivatives)
            size = sum(b.values.numel() * b.values.element_size() for t in data.values() for b in t.blocks())
            if self.used + size > self.budget:
                self.full = True
                LOGGER.info(
                    "the cache of precomputed inputs is full (%.1f MB, %d structures): other structures "
                    "are computed at every step; raise architecture.training.cache_memory_mb to keep more",
                    self.used / 1024**2,
                    len(self.kept),
                )
                return None
            self.used += size
            self.kept[id(structure)] = data
        return data

    def attach(self, structure: Structure, system: System) -> None:
        """Give ``system`` (the batch's copy of ``structure``) the kept data, computing it once."""
        if self.given.get(id(structure)) is system:  # batches reuse systems: given already
            return
        data = self._data(structure, system)
        known = system.known_data() if data else []
        for name, tensor in (data or {}).items():
            if name not in known:
                system.add_data(name, tensor)
        if data is not None:
            self.given[id(structure)] = system

    def keep(self, structures: list[Structure], batch: FlatBatch, system_of: Callable[[Structure], System]) -> None:
        """Give a flat batch the kept data of its structures (a row per atom), when all have it.

        ``system_of`` builds a structure's system, for the first ``Model.precompute``.
        """
        data = []
        for structure in structures:
            rows = self.rows.get(id(structure))
            if rows is None:
                kept = self.kept.get(id(structure))
                if kept is None and not self.full:
                    kept = self._data(structure, system_of(structure))
                if kept is None:
                    return
                rows = self.rows[id(structure)] = {name: tensor.block().values for name, tensor in kept.items()}
            data.append(rows)
        for name in data[0] if data else []:
            batch.data[name] = torch.cat([rows[name] for rows in data])
