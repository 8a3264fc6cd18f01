"""What an architecture computes once per structure and the trainer keeps between epochs.

Training structures do not move, so whatever a model computes from them without its
weights (SOAP-BPNN: the descriptor, and what its derivatives need) is the same at every
epoch. The model says what that is (``Model.precompute``); this keeps it, within a memory
budget, and gives it to the batches of those structures (``FlatBatch.data``, rows
concatenated structure by structure).

The same budget holds the structures of sets streamed from disk (with their neighbour
lists), so that they are read once rather than at every epoch. A structure takes precedence
over precomputed data: it is many times smaller, and saves its reading and neighbour list
at every epoch, where precomputed data serves only batches whose structures all have it.
A shuffled batch is then seldom served unless the whole training set is kept, so when the
first structure's data says that the training set's would not fit in what is left of the
budget, none is kept: the memory and the first epoch's work would buy next to nothing.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..data.batching import structure_bytes
from ..data.flat_batch import FlatBatch
from ..data.readers import Structure
from ..outputs.logs import LOGGER


def _bytes(data: dict[str, torch.Tensor]) -> int:
    return sum(values.numel() * values.element_size() for values in data.values())


class PrecomputedInputs:
    """Keeps ``model.precompute``'s data per structure, up to ``budget_mb``.

    ``batch_of`` makes the flat batch of one structure, which ``Model.precompute`` takes;
    ``training_atoms`` is the number of atoms of the training set, whose data, estimated
    from the first structure's per atom, must fit whole to be kept at all.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        derivatives: bool,
        budget_mb: float,
        batch_of: Callable[[Structure], FlatBatch],
        training_atoms: int = 0,
    ):
        self.model = model
        self.training_atoms = training_atoms
        self.derivatives = derivatives
        self.budget = budget_mb * 1024**2
        self.batch_of = batch_of
        self.used = 0
        self.full = budget_mb <= 0
        self.kept: dict[object, dict[str, torch.Tensor]] = {}  # structure's key -> its rows, by name

    def _data(self, structure: Structure) -> dict[str, torch.Tensor] | None:
        """The structure's kept data, computed the first time, if it fits."""
        # streamed structures are new objects at every epoch: kept by where they come from
        key = structure.key if structure.key is not None else id(structure)
        data = self.kept.get(key)
        if data is None and not self.full:
            with torch.no_grad():
                data = self.model.precompute(self.batch_of(structure), self.derivatives)
            if not data:  # the architecture keeps nothing: not asked again, no entry per structure
                self.full = True
                return None
            size = _bytes(data)
            if not self.kept and not self._training_set_fits(size / max(1, len(structure))):
                return None
            if self.used + size > self.budget:
                self._report_full()
                return None
            self.used += size
            self.kept[key] = data
        return data

    def _training_set_fits(self, bytes_per_atom: float) -> bool:
        needed = bytes_per_atom * self.training_atoms
        if self.used + needed <= self.budget:
            return True
        self.full = True
        LOGGER.info(
            "what the architecture precomputes of the training set would take about %.0f MB, more than the "
            "%.0f MB left of the cache: none is kept, since it serves only batches kept whole; raise "
            "architecture.training.cache_memory_mb to %.0f to keep it",
            needed / 1024**2,
            (self.budget - self.used) / 1024**2,
            (self.used + needed) / 1024**2 * 1.25,  # room for the validation set's too
        )
        return False

    def _report_full(self) -> None:
        if not self.full:
            self.full = True
            LOGGER.info(
                "the cache of precomputed inputs is full (%.1f MB, %d structures): other structures "
                "are computed at every step; raise architecture.training.cache_memory_mb to keep more",
                self.used / 1024**2,
                len(self.kept),
            )

    def hold(self, structure: Structure) -> bool:
        """Whether a structure streamed from disk may stay in memory rather than be read again
        at the next epoch; precomputed data is dropped to make room for it."""
        size = structure_bytes(structure)
        while self.used + size > self.budget and self.kept:
            self._report_full()  # nothing more is computed to be kept
            _, data = self.kept.popitem()
            self.used -= _bytes(data)
        if self.used + size > self.budget:
            return False
        self.used += size
        return True

    def keep(self, structures: list[Structure], batch: FlatBatch) -> None:
        """Give ``batch`` the kept data of its structures, when every one of them has it."""
        data = []
        for structure in structures:
            rows = self._data(structure)
            if not rows:
                return
            data.append(rows)
        for name in data[0] if data else []:
            batch.data[name] = torch.cat([rows[name] for rows in data])
