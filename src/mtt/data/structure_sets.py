"""The structures of one set (training, validation or test), in memory or on disk.

The trainer and ``mtt eval`` see a set through this interface only, so a dataset read from
extended XYZ into memory and a converted one streamed from disk (:mod:`mtt.data.store`)
train the same way. What is known of every structure without reading it (its atom count,
its elements, its reference values in bulk for fitting the baseline) comes in arrays, so
that the memory of a run does not grow with the structures it never holds.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch

from .readers import Structure


@dataclass
class StatisticsChunk:
    """What fitting the baseline and the spreads needs of some structures, as arrays."""

    counts: np.ndarray  # (k, n_types) float64: atoms of each type, columns in the order asked
    #: per-structure target -> (k,) or (k, width) values in internal units
    values: dict[str, np.ndarray]
    #: (target, "forces" or "stress") -> (sum of squares of the reference, number of components)
    squares: dict[tuple[str, str], tuple[float, int]]
    #: per-atom target -> (n_types, width) sums of its values over the atoms of each type,
    #: and of their squares
    atom_sums: dict[str, np.ndarray] = field(default_factory=dict)
    atom_squares: dict[str, np.ndarray] = field(default_factory=dict)
    #: target -> (k,) bool, the structures that have its values, for targets some lack
    present: dict[str, np.ndarray] = field(default_factory=dict)


class StructureSet(ABC):
    """Structures one can count, read by index, and summarise without reading one by one."""

    #: True when the structures are held in memory: batches are built in the training
    #: process, from structures whose neighbour lists are computed once
    in_memory: bool = True

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def n_atoms(self) -> np.ndarray:
        """(len,) int64: the atom count of every structure."""

    @abstractmethod
    def read(self, indices: Sequence[int]) -> list[Structure]:
        """The structures at ``indices`` (positions in this set)."""

    @abstractmethod
    def statistics(self, types: list[int], start: int, stop: int) -> StatisticsChunk:
        """The statistics of structures ``start`` to ``stop`` of this set."""

    @abstractmethod
    def type_counts(self) -> dict[int, int]:
        """Atomic number -> number of atoms of that element in the whole set."""

    @abstractmethod
    def first_with(self, elements: set[int]) -> tuple[str, int, list[int]]:
        """(file, index in it, which of ``elements`` it has) of the first structure that has
        one of ``elements``."""

    @abstractmethod
    def origins(self) -> Iterator[tuple[str, np.ndarray]]:
        """(file, indices in it) of the structures, in the order of this set, file by file."""

    @abstractmethod
    def update_digest(self, digest: "hashlib._Hash") -> None:
        """Feed what identifies these structures and their reference values to ``digest``."""

    @abstractmethod
    def periodic(self) -> bool:
        """Whether every structure is periodic in all three directions."""

    @abstractmethod
    def subset(self, indices: np.ndarray) -> "StructureSet":
        """The structures at ``indices`` of this set, as a set."""

    def presence(self, name: str, kind: str) -> np.ndarray | None:
        """(len,) bool: the structures that have a reference for target ``name``'s ``kind``
        ("values", "forces" or "stress"); None when every structure has one. Datasets with
        different targets in one set (variants) leave some structures without."""
        return None

    def __bool__(self) -> bool:
        return len(self) > 0


class InMemorySet(StructureSet):
    """Structures read into memory (from any file ASE reads)."""

    def __init__(self, structures: list[Structure], origins: list[tuple[str, int]]):
        self.structures = structures
        self._origins = origins
        self._n_atoms = np.array([len(s) for s in structures], dtype=np.int64)
        self._presence: dict[tuple[str, str], np.ndarray | None] = {}

    def presence(self, name: str, kind: str) -> np.ndarray | None:
        if (name, kind) not in self._presence:
            has = np.array([name in getattr(s, kind) for s in self.structures], dtype=bool)
            self._presence[(name, kind)] = None if has.all() else has
        return self._presence[(name, kind)]

    def __len__(self) -> int:
        return len(self.structures)

    @property
    def n_atoms(self) -> np.ndarray:
        return self._n_atoms

    def read(self, indices: Sequence[int]) -> list[Structure]:
        return [self.structures[i] for i in indices]

    def periodic(self) -> bool:
        return all(bool(s.pbc.all()) for s in self.structures)

    def subset(self, indices: np.ndarray) -> "InMemorySet":
        return InMemorySet([self.structures[i] for i in indices], [self._origins[i] for i in indices])

    def statistics(self, types: list[int], start: int, stop: int) -> StatisticsChunk:
        chosen = self.structures[start:stop]
        column = {t: i for i, t in enumerate(types)}
        counts = np.zeros((len(chosen), len(types)))
        for row, structure in enumerate(chosen):
            elements, numbers = np.unique(structure.types.numpy(), return_counts=True)
            counts[row, [column[int(z)] for z in elements]] = numbers
        names = sorted({name for s in chosen for name in s.values})
        values, atom_sums, atom_squares, present = {}, {}, {}, {}
        for name in names:
            has = np.array([name in s.values for s in chosen], dtype=bool)
            if not has.all():
                present[name] = has
            example = next(s.values[name] for s in chosen if name in s.values)
            if example.dim() == 1:  # per structure; zeros where a structure has none
                values[name] = np.stack(
                    [s.values[name].numpy() if name in s.values else np.zeros(len(example)) for s in chosen]
                )
                continue
            width = example.shape[1]
            atom_sums[name], atom_squares[name] = np.zeros((len(types), width)), np.zeros((len(types), width))
            for structure in chosen:
                if name not in structure.values:
                    continue
                rows = [column[int(z)] for z in structure.types]
                array = structure.values[name].numpy()
                np.add.at(atom_sums[name], rows, array)
                np.add.at(atom_squares[name], rows, array * array)
        squares = {}
        for kind in ("forces", "stress"):
            for name in sorted({name for s in chosen for name in getattr(s, kind)}):
                parts = [getattr(s, kind)[name] for s in chosen if name in getattr(s, kind)]
                squares[(name, kind)] = (
                    float(sum(float(p.double().pow(2).sum()) for p in parts)),
                    sum(p.numel() for p in parts),
                )
        return StatisticsChunk(counts, values, squares, atom_sums, atom_squares, present)

    def type_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for structure in self.structures:
            for z, n in zip(*np.unique(structure.types.numpy(), return_counts=True)):
                counts[int(z)] = counts.get(int(z), 0) + int(n)
        return counts

    def first_with(self, elements: set[int]) -> tuple[str, int, list[int]]:
        for structure, (path, index) in zip(self.structures, self._origins):
            present = elements & {int(z) for z in structure.types}
            if present:
                return path, index, sorted(present)
        raise ValueError("no structure has these elements")

    def origins(self) -> Iterator[tuple[str, np.ndarray]]:
        start = 0
        while start < len(self._origins):
            path = self._origins[start][0]
            stop = start
            while stop < len(self._origins) and self._origins[stop][0] == path:
                stop += 1
            yield path, np.array([index for _, index in self._origins[start:stop]], dtype=np.int64)
            start = stop

    def update_digest(self, digest: "hashlib._Hash") -> None:
        digest.update(len(self.structures).to_bytes(8, "little"))
        for structure in self.structures:
            for tensor in (structure.types, structure.positions, structure.cell, structure.pbc):
                digest.update(tensor.contiguous().numpy().tobytes())
            for values in (structure.values, structure.forces, structure.stress):
                for name in sorted(values):
                    digest.update(name.encode())
                    digest.update(values[name].contiguous().numpy().tobytes())


def sample_for_statistics(n_structures: int, limit: int, seed: int) -> list[int]:
    """Every index when there are at most ``limit``, else ``limit`` of them drawn with
    ``seed``, in order: what an architecture's data statistics are taken from."""
    if n_structures <= limit:
        return list(range(n_structures))
    chosen = torch.randperm(n_structures, generator=torch.Generator().manual_seed(seed))[:limit]
    return sorted(chosen.tolist())
