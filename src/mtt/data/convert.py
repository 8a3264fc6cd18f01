"""`mtt data convert`: dataset files into one converted dataset (:mod:`mtt.data.store`).

The frames of extended XYZ files are located first, by a pass over their lines, so that
every array has its final size before anything is parsed and its disk space is taken at
once (a full disk fails here, not half-way). Worker processes, one per core, then parse
ranges of frames and write them straight into their rows. Other formats ASE reads are
read in this process. Memory stays bounded by a range of frames per worker.

The dataset is written in a hidden folder beside its path and renamed into place once
complete: an interruption, a full disk or a bad frame leave nothing at that path.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path
from typing import Callable, Iterator

import ase.io
import numpy as np
import torch

from ..distributed import available_cores
from ..errors import DataError
from .options import CONVERTED_EXTENSION, DatasetOptions, is_converted
from .readers import DatasetReading, TargetInfo, parsed_by_ase, plan_reading, read_frames, resolve_path
from .store import DESCRIPTION, Description, array_layout

#: extensions whose frames are located and parsed in parallel (ASE reads them as extended XYZ)
XYZ_SUFFIXES = (".xyz", ".extxyz")
#: frames a worker parses at once, at most: its memory
FRAMES_PER_TASK = 256
CHUNK = 1 << 16


@dataclass
class _Source:
    """One dataset file: how to read it, and where each frame starts and how many atoms it has."""

    reading: DatasetReading
    offsets: list[int] | None  # byte offset of each frame (extended XYZ), else None
    n_atoms: list[int]
    first_structure: int  # its first row in the dataset
    first_atom: int


def output_path(output: str) -> Path:
    """``output`` with the converted dataset's extension added when it lacks it."""
    return Path(output if is_converted(output) else output + CONVERTED_EXTENSION)


def _index_xyz(path: Path) -> tuple[list[int], list[int]]:
    """The byte offset and atom count of every frame of an (extended) XYZ file."""
    offsets, counts = [], []
    with open(path, "rb") as file:
        while True:
            offset = file.tell()
            line = file.readline()
            if not line:
                break
            if not line.strip():  # blank lines at the end
                continue
            try:
                count = int(line)
            except ValueError:
                raise DataError(
                    f"'{path}' is not a valid XYZ file: frame {len(offsets)} (byte {offset}) should start with "
                    f"its number of atoms, not {line[:40]!r}.",
                    hint="Check that the file is complete and in extended XYZ format.",
                ) from None
            for _ in range(count + 1):
                if not file.readline():
                    raise DataError(
                        f"'{path}' ends in the middle of frame {len(offsets)}: the file is truncated.",
                        hint="Remove the incomplete last frame, or write the file again.",
                    )
            offsets.append(offset)
            counts.append(count)
    if not offsets:
        raise DataError(f"dataset file '{path}' holds no structure.")
    return offsets, counts


def _locate(block: DatasetOptions, base_dir: Path, where: str) -> tuple[DatasetReading, list[int] | None, list[int]]:
    path = resolve_path(block.systems.read_from, base_dir)
    if is_converted(path):
        raise DataError(f"'{path}' is a converted dataset already.", hint="Give the files it was converted from.")
    if path.suffix.lower() in XYZ_SUFFIXES and path.is_file():
        offsets, counts = _index_xyz(path)
        first = parsed_by_ase(path, lambda: ase.io.read(path, index=0, format="extxyz"))
    elif not path.exists():
        read_frames(path)  # says that it is missing
    else:  # any other format ASE reads: counted by reading it once, read again in this process
        offsets = None
        counts = parsed_by_ase(path, lambda: [len(atoms) for atoms in ase.io.iread(path)])
        if not counts:
            raise DataError(f"dataset file '{path}' holds no structure.")
        first = parsed_by_ase(path, lambda: next(ase.io.iread(path)))
    reading = plan_reading(block, first, path, base_dir, where)
    for target in reading.infos:
        if target.per_atom or target.width > 1:
            raise DataError(
                f"target '{target.name}' of '{where}' is {target.describe()}: converted datasets hold one number "
                "per structure and target (with forces and stress) and cannot hold it yet.",
                hint="Train from the extended XYZ file, read into memory, or convert without this target.",
            )
    return reading, offsets, counts


def _tasks(sources: list[_Source], processes: int) -> list[tuple[int, int, int]]:
    """(source, first frame, end frame) of each piece of work: ranges of XYZ frames, small
    enough for every process to get several; a whole file of another format."""
    total = sum(len(source.n_atoms) for source in sources)
    size = max(1, min(FRAMES_PER_TASK, -(-total // (4 * processes))))
    tasks = []
    for number, source in enumerate(sources):
        frames = len(source.n_atoms)
        step = size if source.offsets is not None else frames
        tasks += [(number, start, min(start + step, frames)) for start in range(0, frames, step)]
    return tasks


def _same_targets(sources: list[_Source]) -> list[TargetInfo]:
    first = sources[0].reading
    for source in sources[1:]:
        if [t.to_dict() for t in source.reading.infos] != [t.to_dict() for t in first.infos]:

            def learned(infos: list[TargetInfo]) -> str:
                return ", ".join(
                    f"{t.name} [{t.unit}]" + (" + forces" if t.forces else "") + (" + stress" if t.stress else "")
                    for t in infos
                )

            raise DataError(
                f"'{source.reading.path}' gives {learned(source.reading.infos) or 'no target'}, but "
                f"'{first.path}' gives {learned(first.infos) or 'no target'}: one dataset holds the same targets, "
                "in the same units, for every structure.",
                hint="Give each file the same targets (with forces and stress alike), or convert them apart.",
            )
    return first.infos


# -- the workers: each parses frames and writes their rows ------------------------------
_worker_arrays: dict[str, np.ndarray] = {}
_worker_sources: list[_Source] = []


def _start_worker(folder: Path, layout: dict, sources: list[_Source]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(1)
    _worker_sources[:] = sources
    _worker_arrays.clear()
    _worker_arrays.update({name: np.load(folder / f"{name}.npy", mmap_mode="r+") for name in layout})


def _frames(source: _Source, start: int, stop: int) -> Iterator[ase.Atoms]:
    if source.offsets is None:  # the whole file, as one task
        yield from ase.io.iread(source.reading.path)
        return
    with open(source.reading.path, "rb") as file:
        file.seek(source.offsets[start])
        end = source.offsets[stop] if stop < len(source.offsets) else None
        text = file.read(None if end is None else end - source.offsets[start]).decode()
    yield from ase.io.iread(io.StringIO(text), index=":", format="extxyz")


def _convert_frames(task: tuple[int, int, int]) -> int:
    """Parse frames ``start`` to ``stop`` of source ``number`` and write their rows."""
    number, start, stop = task
    source = _worker_sources[number]
    arrays = _worker_arrays
    row = source.first_structure + start
    atom = source.first_atom + sum(source.n_atoms[:start])
    frames = _frames(source, start, stop)
    for index in range(start, stop):
        atoms = parsed_by_ase(source.reading.path, lambda: next(frames, None))
        if atoms is None:
            raise DataError(f"'{source.reading.path}' holds fewer frames than it did when it was first read.")
        if len(atoms) != source.n_atoms[index]:
            raise DataError(f"structure {index} of '{source.reading.path}' could not be parsed consistently.")
        structure = source.reading.structure(atoms, index)
        atoms_here = slice(atom, atom + len(atoms))
        arrays["types"][atoms_here] = structure.types.numpy()
        arrays["positions"][atoms_here] = structure.positions.numpy()
        arrays["cells"][row] = structure.cell.numpy()
        arrays["pbc"][row] = structure.pbc.numpy()
        arrays["n_atoms"][row] = len(atoms)
        arrays["first_atom"][row] = atom
        for name, value in structure.values.items():
            arrays[f"values.{name}"][row] = float(value)
        for name, forces in structure.forces.items():
            arrays[f"forces.{name}"][atoms_here] = forces.numpy()
            arrays[f"squares.forces.{name}"][row] = float(forces.pow(2).sum())
        for name, stress in structure.stress.items():
            arrays[f"stress.{name}"][row] = stress.numpy()
            arrays[f"squares.stress.{name}"][row] = float(stress.pow(2).sum())
        row += 1
        atom += len(atoms)
    for array in arrays.values():
        array.flush()
    return stop - start


# -- the parent ---------------------------------------------------------------------------
def _allocate(folder: Path, layout: dict[str, tuple[str, tuple]]) -> None:
    """Every array file at its full size, its disk space taken now."""
    for name, (dtype, shape) in layout.items():
        file = folder / f"{name}.npy"
        array = np.lib.format.open_memmap(file, mode="w+", dtype=np.dtype(dtype), shape=shape)
        del array
        with open(file, "r+b") as handle:
            os.posix_fallocate(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)


def _fill_element_counts(folder: Path, n_structures: int) -> list[int]:
    """The elements of the dataset, and each structure's count of each, from its types."""
    types = np.load(folder / "types.npy", mmap_mode="r")
    elements: set[int] = set()
    for start in range(0, len(types), 1 << 22):
        elements |= set(np.unique(types[start : start + (1 << 22)]).tolist())
    ordered = sorted(elements)
    column = np.zeros(max(ordered, default=0) + 1, dtype=np.int64)
    column[ordered] = np.arange(len(ordered))
    counts = np.lib.format.open_memmap(
        folder / "element_counts.npy", mode="w+", dtype=np.int32, shape=(n_structures, len(ordered))
    )
    n_atoms = np.load(folder / "n_atoms.npy", mmap_mode="r")
    first_atom = np.load(folder / "first_atom.npy", mmap_mode="r")
    for start in range(0, n_structures, CHUNK):
        stop = min(start + CHUNK, n_structures)
        atoms = slice(int(first_atom[start]), int(first_atom[stop - 1] + n_atoms[stop - 1]))
        owner = np.repeat(np.arange(stop - start), n_atoms[start:stop])
        flat = owner * len(ordered) + column[types[atoms]]
        counts[start:stop] = np.bincount(flat, minlength=(stop - start) * len(ordered)).reshape(stop - start, -1)
    counts.flush()
    return ordered


def dataset_digest(folder: Path, names: list[str]) -> str:
    """sha256 of the arrays ``names``, in that order."""
    digest = hashlib.sha256()
    for name in names:
        with open(folder / f"{name}.npy", "rb") as file:
            while block := file.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def _progress(total: int) -> Callable[[int], None]:
    """Advance a progress bar on a terminal, or log every tenth of the way."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, unit="structure", desc="converting")
        return lambda done: bar.update(done) if done else bar.close()
    from ..outputs.logs import LOGGER

    state = {"done": 0, "said": 0}

    def advance(done: int) -> None:
        state["done"] += done
        if state["done"] * 10 // total > state["said"] or (done == 0 and state["said"] < 10):
            state["said"] = state["done"] * 10 // total
            LOGGER.info("converted %d of %d structures", state["done"], total)

    return advance


def _refuse_existing(output: Path) -> None:
    """A converted dataset is never replaced: it may have taken hours to write."""
    if output.exists():
        raise DataError(
            f"'{output}' already exists; nothing was written.",
            hint="Remove it first, or give another path with -o.",
        )


def write_dataset(
    output: Path,
    n_structures: int,
    n_atoms: int,
    targets: list[TargetInfo],
    sources: list[str],
    fill: Callable[[Path, dict[str, tuple[str, tuple]]], None],
) -> None:
    """Write a converted dataset at ``output``: its arrays are made at their full size, with
    their disk space, in a hidden folder beside it; ``fill(folder, layout)`` writes their
    rows (every array but the element counts); then the element counts, the digest and the
    description are written and the folder is renamed into place. Anything that stops it
    on the way removes the folder: nothing is ever left at ``output`` half-written."""
    _refuse_existing(output)
    layout = array_layout(n_structures, n_atoms, 0, targets)
    del layout["element_counts"]  # known once the types are
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.parent / f".{output.name}.partial-{os.getpid()}"
    try:
        partial.mkdir()
        try:
            _allocate(partial, layout)
        except OSError as error:
            raise DataError(
                f"no room for the converted dataset ({sum(_size(d, s) for d, s in layout.values()) / 1e6:.0f} MB) "
                f"beside '{output}': {error.strerror or error}; nothing was written.",
                hint="Free disk space, or give -o a path on another disk.",
            ) from None
        fill(partial, layout)
        elements = _fill_element_counts(partial, n_structures)
        names = list(array_layout(n_structures, n_atoms, len(elements), targets))
        description = Description(
            n_structures=n_structures,
            n_atoms=n_atoms,
            elements=elements,
            targets=targets,
            sources=sources,
            digest=dataset_digest(partial, names),
        )
        (partial / DESCRIPTION).write_text(description.to_json())
        partial.rename(output)
    except KeyboardInterrupt:
        shutil.rmtree(partial, ignore_errors=True)
        raise KeyboardInterrupt(f"conversion stopped; nothing was written at {output}") from None
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(
            f"writing the converted dataset failed: {error}; nothing was written at {output}.",
            hint="Check the free disk space and the permissions of the folder.",
        ) from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def convert(blocks: list[DatasetOptions], base_dir: Path, output: Path, where: str, processes: int | None) -> dict:
    """Convert the dataset blocks into one dataset at ``output``. Returns what was written."""
    _refuse_existing(output)  # before the files are read
    started = time.monotonic()
    sources, structures, atoms = [], 0, 0
    for i, block in enumerate(blocks):
        reading, offsets, counts = _locate(block, base_dir, f"{where}[{i}]" if len(blocks) > 1 else where)
        sources.append(_Source(reading, offsets, counts, structures, atoms))
        structures += len(counts)
        atoms += sum(counts)
    targets = _same_targets(sources)
    processes = processes or available_cores()
    tasks = _tasks(sources, processes)
    processes = min(processes, len(tasks)) if all(s.offsets is not None for s in sources) else 1

    def fill(folder: Path, layout: dict[str, tuple[str, tuple]]) -> None:
        advance = _progress(structures)
        if processes > 1:
            # a Ctrl-C while the workers are forked would be lost in the fork handlers (the
            # conversion would go on): it waits until they are started
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                pool = Pool(processes, _start_worker, (folder, layout, sources))
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            with pool:
                for done in pool.imap_unordered(_convert_frames, tasks):
                    advance(done)
        else:
            _start_worker(folder, layout, sources)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                for task in tasks:
                    advance(_convert_frames(task))
            finally:
                _worker_arrays.clear()
        advance(0)

    write_dataset(output, structures, atoms, targets, [str(s.reading.path) for s in sources], fill)
    return {
        "path": output,
        "structures": structures,
        "atoms": atoms,
        "seconds": time.monotonic() - started,
        "bytes": folder_size(output),
        "source_bytes": sum(s.reading.path.stat().st_size for s in sources),
        "processes": processes,
    }


def _size(dtype: str, shape: tuple) -> int:
    return int(np.dtype(dtype).itemsize * np.prod(shape))


def folder_size(folder: Path) -> int:
    return sum(file.stat().st_size for file in folder.iterdir() if file.is_file())
