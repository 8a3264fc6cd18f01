"""Converted datasets: structures stored once on disk, read by index without loading the rest.

A converted dataset is a folder (``name.mttdata``) of NumPy ``.npy`` arrays, whose rows
are read at their offsets in the files, and a ``dataset.json`` that describes them. The atoms of all structures are
concatenated (types, positions, and the forces of each target), the rest has a row per
structure (cell, periodicity, atom count, first atom, element counts, values, stress, and
the sums of squares of forces and stress that fitting needs). Reading a structure is a few
reads of files the operating system caches once for every process on the node, without
locks, so DataLoader workers and ranks read it at once; a dataset is a handful of large
files, as parallel file systems prefer. ``benchmarks/storage_formats.py`` compares this
with HDF5, LMDB and zarr. Everything is in mtt's internal units (eV, Å).

``dataset.json`` is written last and the folder is renamed into place, so a dataset
without it was never finished (:mod:`mtt.data.convert`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import DataError
from .options import DatasetOptions
from .readers import Structure, TargetInfo, resolve_path
from .structure_sets import StatisticsChunk, StructureSet

DESCRIPTION = "dataset.json"
FORMAT = "mtt converted dataset"
#: the version this mtt writes, and the newest it reads
VERSION = 1


def array_layout(
    n_structures: int, n_atoms: int, n_elements: int, targets: list[TargetInfo]
) -> dict[str, tuple[str, tuple]]:
    """Every array of a dataset: file name -> (dtype, shape)."""
    layout = {
        "types": ("<i4", (n_atoms,)),
        "positions": ("<f8", (n_atoms, 3)),
        "cells": ("<f8", (n_structures, 3, 3)),
        "pbc": ("|b1", (n_structures, 3)),
        "n_atoms": ("<i8", (n_structures,)),
        "first_atom": ("<i8", (n_structures,)),
        "element_counts": ("<i4", (n_structures, n_elements)),  # columns: the elements, in order
    }
    for target in targets:
        layout[f"values.{target.name}"] = ("<f8", (n_structures,))
        if target.forces:
            layout[f"forces.{target.name}"] = ("<f8", (n_atoms, 3))
            layout[f"squares.forces.{target.name}"] = ("<f8", (n_structures,))
        if target.stress:
            layout[f"stress.{target.name}"] = ("<f8", (n_structures, 3, 3))
            layout[f"squares.stress.{target.name}"] = ("<f8", (n_structures,))
    return layout


@dataclass
class Description:
    """What ``dataset.json`` says of a converted dataset."""

    n_structures: int
    n_atoms: int
    elements: list[int]
    targets: list[TargetInfo]
    sources: list[str]  # the files it was converted from
    digest: str  # sha256 of every array, in the order of the layout
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": self.version,
                "n_structures": self.n_structures,
                "n_atoms": self.n_atoms,
                "elements": self.elements,
                "targets": [t.to_dict() for t in self.targets],
                "length_unit": "angstrom",
                "sources": self.sources,
                "digest": self.digest,
            },
            indent=1,
        )


def _unreadable(path: Path, what: str) -> DataError:
    return DataError(
        f"'{path}' is not a complete converted dataset: {what}.",
        hint="Convert it again with `mtt data convert` (an interrupted conversion leaves nothing at its path, "
        "so this one was damaged or copied incompletely).",
    )


def read_description(path: Path) -> Description:
    """The description of the converted dataset at ``path``, checked."""
    if not path.exists():
        raise DataError(
            f"converted dataset '{path}' does not exist.",
            hint="Check the path; relative paths are taken from the folder of the options file. "
            "`mtt data convert` writes converted datasets.",
        )
    if not path.is_dir():
        raise _unreadable(path, f"a converted dataset is a folder with a {DESCRIPTION}")
    try:
        data = json.loads((path / DESCRIPTION).read_text())
    except FileNotFoundError:
        raise _unreadable(path, f"it has no {DESCRIPTION}") from None
    except (OSError, ValueError) as error:
        raise _unreadable(path, f"its {DESCRIPTION} cannot be read ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _unreadable(path, f"its {DESCRIPTION} does not describe an mtt dataset")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise DataError(
            f"'{path}' was written by a newer mtt (dataset format version {version}; this mtt reads up to {VERSION}).",
            hint="Upgrade mtt (pip install -U mtt), or convert the data again with this version.",
        )
    try:
        return Description(
            n_structures=int(data["n_structures"]),
            n_atoms=int(data["n_atoms"]),
            elements=[int(z) for z in data["elements"]],
            targets=[TargetInfo(**t) for t in data["targets"]],
            sources=list(data["sources"]),
            digest=str(data["digest"]),
            version=version,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise _unreadable(path, f"its {DESCRIPTION} lacks or garbles {error}") from None


@dataclass
class _ArrayFile:
    """Where an array's rows lie in its .npy file."""

    descriptor: int
    offset: int  # of the first row
    dtype: np.dtype
    row_shape: tuple
    row_bytes: int


class Store:
    """One converted dataset. Its rows are read with ``os.pread``, not through memory maps:
    the structures of a batch are scattered over the files, and a mapping would take into the
    process (and its resident memory) the pages the kernel reads around each of them, about
    a megabyte per structure. The files are opened in each process that reads them
    (DataLoader workers open their own)."""

    def __init__(self, path: Path):
        self.path = path
        self.description = read_description(path)
        described = self.description
        self.layout = array_layout(
            described.n_structures, described.n_atoms, len(described.elements), described.targets
        )
        self._files: dict[str, _ArrayFile] = {}
        self._pid = -1
        for name in self.layout:  # every file there, whole, with the right type: checked before training
            self._file(name)
        self.n_atoms = self.rows("n_atoms", 0, described.n_structures)
        self.first_atom = self.rows("first_atom", 0, described.n_structures)
        if len(self.n_atoms) and (
            self.n_atoms.min() < 1 or self.first_atom[-1] + self.n_atoms[-1] != described.n_atoms
        ):
            raise _unreadable(path, "its atom counts do not add up to its atoms")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_files"], state["_pid"] = {}, -1  # opened again in the process that reads
        return state

    def __del__(self) -> None:
        if getattr(self, "_pid", -1) == os.getpid():
            for file in self._files.values():
                os.close(file.descriptor)

    def array(self, name: str) -> np.ndarray:
        """The whole array ``name`` of the layout, memory-mapped (for reading it all)."""
        self._file(name)
        return np.load(self.path / f"{name}.npy", mmap_mode="r")

    def _file(self, name: str) -> _ArrayFile:
        if self._pid != os.getpid():
            self._files, self._pid = {}, os.getpid()
        if name not in self._files:
            file = self.path / f"{name}.npy"
            dtype, shape = self.layout[name]
            try:
                header = np.load(file, mmap_mode="r")  # reads the header and checks the file's size
            except FileNotFoundError:
                raise _unreadable(self.path, f"'{file.name}' is missing") from None
            except (OSError, ValueError) as error:  # a truncated file fails to map
                raise _unreadable(self.path, f"'{file.name}' cannot be read ({error})") from None
            if header.dtype != np.dtype(dtype) or header.shape != shape:
                raise _unreadable(
                    self.path, f"'{file.name}' holds {header.dtype} {header.shape} instead of {np.dtype(dtype)} {shape}"
                )
            row_shape = shape[1:]
            row_bytes = int(np.dtype(dtype).itemsize * np.prod(row_shape, dtype=np.int64))
            offset = header.offset if isinstance(header, np.memmap) else 0
            self._files[name] = _ArrayFile(os.open(file, os.O_RDONLY), offset, np.dtype(dtype), row_shape, row_bytes)
            del header
        return self._files[name]

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` of the array ``name``."""
        file = self._file(name)
        size = (stop - start) * file.row_bytes
        data = os.pread(file.descriptor, size, file.offset + start * file.row_bytes) if size > 0 else b""
        if len(data) != size:
            raise _unreadable(self.path, f"'{name}.npy' ends before its row {stop}")
        return np.frombuffer(bytearray(data), dtype=file.dtype).reshape((stop - start, *file.row_shape))

    def take(self, name: str, indices: np.ndarray) -> np.ndarray:
        """The rows ``indices`` (sorted) of the array ``name``, read in one piece."""
        if len(indices) == 0:
            return self.rows(name, 0, 0)
        first = int(indices[0])
        return self.rows(name, first, int(indices[-1]) + 1)[np.asarray(indices) - first]

    def element_counts(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), n_elements) atoms of each of ``description.elements`` in each structure."""
        return self.take("element_counts", rows).astype(np.float64)

    def structure(self, index: int, targets: list[TargetInfo]) -> Structure:
        """Structure ``index`` with the reference values of ``targets``."""
        start = int(self.first_atom[index])
        stop = start + int(self.n_atoms[index])
        structure = Structure(
            types=torch.from_numpy(self.rows("types", start, stop)),
            positions=torch.from_numpy(self.rows("positions", start, stop)),
            cell=torch.from_numpy(self.rows("cells", index, index + 1)[0]),
            pbc=torch.from_numpy(self.rows("pbc", index, index + 1)[0]),
            key=(str(self.path), int(index)),
        )
        for target in targets:
            name = target.name
            structure.values[name] = torch.from_numpy(self.rows(f"values.{name}", index, index + 1))
            if target.forces:
                structure.forces[name] = torch.from_numpy(self.rows(f"forces.{name}", start, stop))
            if target.stress:
                structure.stress[name] = torch.from_numpy(self.rows(f"stress.{name}", index, index + 1)[0])
        return structure


class StoredSet(StructureSet):
    """Some structures of a converted dataset (all of it, or a split of it), read when asked."""

    in_memory = False

    def __init__(self, store: Store, indices: np.ndarray, targets: list[TargetInfo]):
        self.store = store
        self.indices = np.asarray(indices, dtype=np.int64)
        self.targets = targets
        self._n_atoms = store.n_atoms[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def n_atoms(self) -> np.ndarray:
        return self._n_atoms

    def read(self, indices: Sequence[int]) -> list[Structure]:
        return [self.store.structure(int(self.indices[i]), self.targets) for i in indices]

    def periodic(self) -> bool:
        return all(
            bool(self.store.take("pbc", self.indices[s : s + (1 << 16)]).all())
            for s in range(0, len(self.indices), 1 << 16)
        )

    def subset(self, indices: np.ndarray) -> "StoredSet":
        return StoredSet(self.store, self.indices[np.asarray(indices, dtype=np.int64)], self.targets)

    def statistics(self, types: list[int], start: int, stop: int) -> StatisticsChunk:
        rows = self.indices[start:stop]
        stored = self.store.element_counts(rows)
        column = {z: i for i, z in enumerate(self.store.description.elements)}
        counts = np.zeros((len(rows), len(types)))
        for i, z in enumerate(types):
            if z in column:
                counts[:, i] = stored[:, column[z]]
        values = {t.name: self.store.take(f"values.{t.name}", rows) for t in self.targets}
        squares = {}
        for target in self.targets:
            for kind, components in (("forces", 3), ("stress", 9)):
                if getattr(target, kind):
                    total = float(self.store.take(f"squares.{kind}.{target.name}", rows).sum())
                    elements = components * (int(self.store.n_atoms[rows].sum()) if kind == "forces" else len(rows))
                    squares[(target.name, kind)] = (total, elements)
        return StatisticsChunk(counts, values, squares)

    def type_counts(self) -> dict[int, int]:
        totals = np.zeros(len(self.store.description.elements), dtype=np.int64)
        for start in range(0, len(self.indices), 1 << 16):
            totals += self.store.element_counts(self.indices[start : start + (1 << 16)]).sum(axis=0).astype(np.int64)
        return {z: int(n) for z, n in zip(self.store.description.elements, totals)}

    def first_with(self, elements: set[int]) -> tuple[str, int, list[int]]:
        columns = [i for i, z in enumerate(self.store.description.elements) if z in elements]
        for start in range(0, len(self.indices), 1 << 16):
            rows = self.indices[start : start + (1 << 16)]
            has = self.store.element_counts(rows)[:, columns] > 0
            hits = np.flatnonzero(has.any(axis=1))
            if len(hits):
                row = hits[0]
                present = [self.store.description.elements[columns[j]] for j in np.flatnonzero(has[row])]
                return str(self.store.path), int(rows[row]), present
        raise ValueError("no structure has these elements")

    def origins(self) -> Iterator[tuple[str, np.ndarray]]:
        yield str(self.store.path), self.indices

    def update_digest(self, digest: "hashlib._Hash") -> None:
        digest.update(len(self.indices).to_bytes(8, "little"))
        digest.update(self.store.description.digest.encode())
        digest.update(json.dumps([t.to_dict() for t in self.targets]).encode())
        digest.update(self.indices.tobytes())


def select_targets(description: Description, block: DatasetOptions, path: Path, where: str) -> list[TargetInfo]:
    """The stored targets a dataset block asks for: all of them when it names none."""
    stored = {t.name: t for t in description.targets}
    if not block.targets:
        return list(stored.values())
    chosen = []
    for name, options in block.targets.items():
        key = options.key or name
        place = f"{where}.targets.{name}"
        if key not in stored:
            raise DataError(
                f"'{place}' asks for the target '{key}', which the converted dataset '{path}' does not hold.",
                hint=f"It holds {', '.join(f'{t.name} [{t.unit}]' for t in stored.values()) or 'no target'}; "
                "convert the data again to add others.",
            )
        target = stored[key]
        if options.unit and options.unit.lower() != target.unit.lower():
            raise DataError(
                f"'{place}.unit' is {options.unit}, but the converted dataset '{path}' holds {key} in {target.unit} "
                "(converted datasets store internal units).",
                hint=f"Remove '{place}.unit': the units were converted when the dataset was.",
            )
        learned = {}
        for kind in ("forces", "stress"):
            option = getattr(options, kind)
            off = option is False or (isinstance(option, str) and option.lower() in ("off", "false", "no"))
            if not off and option is not None and not getattr(target, kind):
                raise DataError(
                    f"'{place}.{kind}' asks for {kind}, but the converted dataset '{path}' holds none for {key}.",
                    hint=f"Remove '{place}.{kind}', or convert the data again with {kind}.",
                )
            learned[kind] = getattr(target, kind) and not off
        chosen.append(
            TargetInfo(
                name=name,
                quantity=target.quantity,
                unit=target.unit,
                forces=learned["forces"],
                stress=learned["stress"],
                description=options.description or target.description,
            )
        )
    return chosen


def open_converted(block: DatasetOptions, base_dir: Path, where: str) -> tuple[StoredSet, list[TargetInfo]]:
    """The set of a dataset block that names a converted dataset, and its targets."""
    path = resolve_path(block.systems.read_from, base_dir)
    store = Store(path)
    if block.systems.length_unit.lower() not in ("angstrom", "a", "å"):
        raise DataError(
            f"'{where}.systems.length_unit' is {block.systems.length_unit}, but converted datasets hold lengths in Å.",
            hint=f"Remove '{where}.systems.length_unit': the lengths were converted when the dataset was.",
        )
    targets = select_targets(store.description, block, path, where)
    renamed = [t for t in targets if t.name not in {s.name for s in store.description.targets}]
    if renamed:
        raise DataError(
            f"'{where}.targets.{renamed[0].name}': targets of a converted dataset keep their stored names.",
            hint=f"Name it as stored: {', '.join(t.name for t in store.description.targets)}.",
        )
    return StoredSet(store, np.arange(store.description.n_structures), targets), targets
