"""On-disk formats for a dataset of atomic structures, measured side by side, so that the
storage format of ``mtt data convert`` is chosen by measurement rather than by taste.

    python3.11 -m venv .bench/formats && .bench/formats/bin/pip install numpy h5py lmdb zarr
    .bench/formats/bin/python benchmarks/storage_formats.py --structures 100000 --out .bench/storage_formats

It needs only numpy, h5py, lmdb and zarr (no torch), so it runs in its own small virtual
environment. The data is synthetic (numpy, fixed seed): periodic structures of 4 to 64 atoms,
each with types, positions, cell, pbc, energy, forces and stress. The candidates:

- npy: a folder of .npy files, every structure's atoms concatenated, read with np.load(mmap_mode="r");
- hdf5 contiguous / hdf5 chunked: one HDF5 file with the same concatenated layout;
- lmdb: one LMDB file, one key per structure, the value its arrays as raw bytes behind an atom count;
- zarr chunked / zarr sharded: a zarr v3 group with the concatenated layout, without and with
  the sharding codec (which packs many chunks into one file).

Each round writes every format afresh (the order rotating from round to round), then measures
the opening, random reads (batches of random structures, as a training loop asks for them), in
one process and in 4 processes that open the file themselves after they start (as DataLoader
workers do), and a full pass over all energies and forces (as fitting the composition model
and the scales does). The table gives medians with min and max over the rounds. Reads are
warm-cache: every file is read once before the reads are timed. Run it with nothing else on
the machine; the results go to stdout and to OUT/results.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterator

import h5py
import lmdb
import numpy as np
import zarr
from harness import markdown_table, spread

# name: (dtype, shape of one row); per-atom arrays are concatenated over all structures
PER_ATOM = {"types": (np.int32, ()), "positions": (np.float64, (3,)), "forces": (np.float64, (3,))}
PER_STRUCTURE = {
    "n_atoms": (np.int32, ()),
    "cell": (np.float64, (3, 3)),
    "pbc": (np.bool_, (3,)),
    "energy": (np.float64, ()),
    "stress": (np.float64, (3, 3)),
}
ARRAYS = {**PER_ATOM, **PER_STRUCTURE}
WRITE_CHUNK = 1000  # structures handed to a writer at a time
H5_CHUNK = 65536  # rows per HDF5 chunk (atoms, or structures for per-structure arrays)
ZARR_CHUNK = 4096  # rows per zarr chunk
ZARR_SHARD = 262144  # rows per zarr shard (64 chunks)
PASS_BLOCK = 1 << 20  # atoms read at a time in the full pass
Structure = dict[str, np.ndarray]


# ---------------------------------------------------------------------------------------------
# synthetic data


class Synthetic:
    """N periodic structures, made a chunk at a time; chunk [start, stop) always comes out the same."""

    def __init__(self, n_structures: int, seed: int):
        self.seed = seed
        self.n_atoms = np.random.default_rng([seed, 0]).integers(4, 65, n_structures).astype(np.int32)

    def __len__(self) -> int:
        return len(self.n_atoms)

    def chunk(self, start: int, stop: int) -> Structure:
        rng = np.random.default_rng([self.seed, 1, start])
        n_atoms = self.n_atoms[start:stop]
        count, atoms = stop - start, int(n_atoms.sum())
        cell = np.eye(3) * rng.uniform(4.0, 15.0, (count, 1, 1)) + rng.normal(0.0, 0.3, (count, 3, 3))
        fractional = rng.random((atoms, 3))
        stress = rng.normal(0.0, 0.01, (count, 3, 3))
        return {
            "n_atoms": n_atoms,
            "types": rng.integers(1, 90, atoms).astype(np.int32),
            "positions": np.einsum("ai,aij->aj", fractional, np.repeat(cell, n_atoms, axis=0)),
            "forces": rng.normal(0.0, 1.0, (atoms, 3)),
            "cell": cell,
            "pbc": rng.random((count, 3)) < 0.9,
            "energy": rng.normal(-4.0, 0.5, count) * n_atoms,
            "stress": (stress + stress.transpose(0, 2, 1)) / 2,
        }

    def chunks(self) -> Iterator[Structure]:
        for start in range(0, len(self), WRITE_CHUNK):
            yield self.chunk(start, min(start + WRITE_CHUNK, len(self)))

    def structure(self, index: int) -> Structure:
        start = index - index % WRITE_CHUNK
        return split_chunk(self.chunk(start, min(start + WRITE_CHUNK, len(self))))[index - start]


def split_chunk(chunk: Structure) -> list[Structure]:
    """The structures of a chunk, each as its own arrays (views into the chunk)."""
    ends = np.cumsum(chunk["n_atoms"])
    structures = []
    for i, end in enumerate(ends):
        start = end - chunk["n_atoms"][i]
        structure = {name: chunk[name][start:end] for name in PER_ATOM}
        structure.update({name: chunk[name][i] for name in PER_STRUCTURE if name != "n_atoms"})
        structures.append(structure)
    return structures


def reference_sums(data: Synthetic) -> tuple[float, float]:
    """Sum of energies and of squared force components, for checking each format's full pass."""
    energy = forces = 0.0
    for chunk in data.chunks():
        energy += float(chunk["energy"].sum())
        forces += float(np.square(chunk["forces"]).sum())
    return energy, forces


# ---------------------------------------------------------------------------------------------
# writers: begin(path, data), append(chunk) for each chunk, end()


def new_empty(tail: tuple, dtype: type) -> dict:
    return {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (0, *tail)}


class NpyWriter:
    """Appends raw rows to .npy files; the shape in each header is set at the end (numpy leaves
    room in the header for that), so the total size need not be known up front."""

    def begin(self, path: Path, data: Synthetic) -> None:
        path.mkdir(parents=True)
        self.files = {name: open(path / f"{name}.npy", "wb") for name in ARRAYS}
        self.rows = dict.fromkeys(ARRAYS, 0)
        for name, (dtype, tail) in ARRAYS.items():
            np.lib.format.write_array_header_1_0(self.files[name], new_empty(tail, dtype))
        self.header_sizes = {name: file.tell() for name, file in self.files.items()}

    def append(self, chunk: Structure) -> None:
        for name, file in self.files.items():
            chunk[name].tofile(file)
            self.rows[name] += len(chunk[name])

    def end(self) -> None:
        for name, file in self.files.items():
            dtype, tail = ARRAYS[name]
            header = new_empty(tail, dtype) | {"shape": (self.rows[name], *tail)}
            file.seek(0)
            np.lib.format.write_array_header_1_0(file, header)
            assert file.tell() == self.header_sizes[name], "the .npy header grew"
            file.close()


class H5Writer:
    """One HDF5 file. Contiguous datasets cannot grow, so that layout takes the total atom count
    up front (a converter would count atoms in a first pass over its input, not timed here);
    the chunked layout grows its datasets chunk by chunk."""

    def __init__(self, chunked: bool):
        self.chunked = chunked

    def begin(self, path: Path, data: Synthetic) -> None:
        self.file = h5py.File(path, "w")
        totals = {name: int(data.n_atoms.sum()) for name in PER_ATOM} | {name: len(data) for name in PER_STRUCTURE}
        self.rows = dict.fromkeys(ARRAYS, 0)
        for name, (dtype, tail) in ARRAYS.items():
            if self.chunked:
                self.file.create_dataset(
                    name, shape=(0, *tail), maxshape=(None, *tail), chunks=(H5_CHUNK, *tail), dtype=dtype
                )
            else:
                self.file.create_dataset(name, shape=(totals[name], *tail), dtype=dtype)

    def append(self, chunk: Structure) -> None:
        for name, dataset in self.file.items():
            start, stop = self.rows[name], self.rows[name] + len(chunk[name])
            if self.chunked:
                dataset.resize(stop, axis=0)
            dataset[start:stop] = chunk[name]
            self.rows[name] = stop

    def end(self) -> None:
        self.file.close()


LMDB_FLOATS = ("positions", "forces", "cell", "stress", "energy")  # float64 first: every array aligned


def encode(structure: Structure) -> bytes:
    """A structure as bytes: the atom count (int64), then the float64 arrays, types (int32), pbc."""
    n_atoms = len(structure["types"])
    parts = [n_atoms.to_bytes(8, "little")]
    parts += [structure[name].tobytes() for name in LMDB_FLOATS]
    parts += [structure["types"].tobytes(), structure["pbc"].tobytes()]
    return b"".join(parts)


def decode(value: bytes, names: tuple[str, ...] = tuple(ARRAYS)) -> Structure:
    n_atoms = int.from_bytes(value[:8], "little")
    shapes = {"positions": (n_atoms, 3), "forces": (n_atoms, 3), "cell": (3, 3), "stress": (3, 3), "energy": ()}
    shapes |= {"types": (n_atoms,), "pbc": (3,)}
    dtypes = {name: ARRAYS[name][0] for name in shapes}
    structure, offset = {}, 8
    for name, shape in shapes.items():
        count = int(np.prod(shape))
        if name in names:
            array = np.frombuffer(value, dtypes[name], count, offset)
            structure[name] = array.reshape(shape)
        offset += count * np.dtype(dtypes[name]).itemsize
    return structure


def lmdb_key(index: int) -> bytes:
    return index.to_bytes(8, "big")  # big-endian: keys sort in index order, so puts can append


class LmdbWriter:
    """One LMDB file (subdir=False, no lock file); one write transaction per chunk, synced at the end."""

    def begin(self, path: Path, data: Synthetic) -> None:
        self.env = lmdb.open(
            str(path), subdir=False, map_size=1 << 36, lock=False, sync=False, metasync=False, readahead=False
        )
        self.next = 0

    def append(self, chunk: Structure) -> None:
        structures = split_chunk(chunk)
        items = [(lmdb_key(self.next + i), encode(s)) for i, s in enumerate(structures)]
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items, append=True)
        self.next += len(structures)

    def end(self) -> None:
        self.env.sync(True)
        self.env.close()


class ZarrWriter:
    """A zarr v3 group, the concatenated layout grown by Array.append, uncompressed (the
    synthetic floats are random: compression would cost time and save nothing)."""

    def __init__(self, sharded: bool):
        self.sharded = sharded

    def begin(self, path: Path, data: Synthetic) -> None:
        group = zarr.open_group(str(path), mode="w", zarr_format=3)
        self.arrays = {}
        for name, (dtype, tail) in ARRAYS.items():
            shards = (ZARR_SHARD, *tail) if self.sharded else None
            self.arrays[name] = group.create_array(
                name,
                shape=(0, *tail),
                dtype=dtype,
                chunks=(ZARR_CHUNK, *tail),
                shards=shards,
                compressors=None,
                fill_value=0,
            )

    def append(self, chunk: Structure) -> None:
        for name, array in self.arrays.items():
            array.append(chunk[name], axis=0)

    def end(self) -> None:
        self.arrays = {}


# ---------------------------------------------------------------------------------------------
# readers: get(index) -> Structure, full_pass() -> (sum of energies, sum of squared forces), close()


class ConcatReader:
    """The concatenated layout, over any arrays that slice (memory maps, HDF5 datasets, zarr
    arrays); the start of each structure comes from n_atoms, read whole when opening."""

    def __init__(self, arrays: dict, materialize: Callable, close: Callable = lambda: None):
        self.arrays, self.materialize, self.close = arrays, materialize, close
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(arrays["n_atoms"][:], dtype=np.int64))])

    def get(self, index: int) -> Structure:
        start, stop = self.offsets[index], self.offsets[index + 1]
        structure = {name: self.materialize(self.arrays[name][start:stop]) for name in PER_ATOM}
        for name in PER_STRUCTURE:
            if name != "n_atoms":
                structure[name] = self.materialize(self.arrays[name][index])
        return structure

    def full_pass(self) -> tuple[float, float]:
        energy = float(np.asarray(self.arrays["energy"][:]).sum())
        forces, total = 0.0, int(self.offsets[-1])
        for start in range(0, total, PASS_BLOCK):
            block = np.asarray(self.arrays["forces"][start : min(start + PASS_BLOCK, total)])
            forces += float(np.square(block).sum())
        return energy, forces


def open_npy(path: Path) -> ConcatReader:
    arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
    return ConcatReader(arrays, np.array)  # np.array copies: a memory map only reads on access


def open_h5(path: Path) -> ConcatReader:
    """HDF5 tuned for small random reads. No chunk cache: the default (1 MiB a dataset) holds a
    few 64k-row chunks, so random reads of chunked data thrash it, a whole chunk read for each
    structure (about 700 structures/s here, against 7000 without it); uncompressed chunks are
    then read in part. No sieve buffer: by default each small read of a contiguous dataset reads
    64 KiB around it (about 5300 structures/s here, against 8800 without it)."""
    access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    access.set_sieve_buf_size(0)
    metadata, slots, _, w0 = access.get_cache()
    access.set_cache(metadata, slots, 0, w0)
    file = h5py.File(h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY, access))
    return ConcatReader({name: file[name] for name in ARRAYS}, np.asarray, file.close)


def open_zarr(path: Path) -> ConcatReader:
    group = zarr.open_group(str(path), mode="r")
    return ConcatReader({name: group[name] for name in ARRAYS}, np.asarray)


class LmdbReader:
    def __init__(self, path: Path):
        self.env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False)
        self.txn = self.env.begin()

    def get(self, index: int) -> Structure:
        return decode(self.txn.get(lmdb_key(index)))

    def full_pass(self) -> tuple[float, float]:
        energy = forces = 0.0
        for value in self.txn.cursor().iternext(keys=False, values=True):
            structure = decode(value, ("energy", "forces"))
            energy += float(structure["energy"])
            forces += float(np.square(structure["forces"]).sum())
        return energy, forces

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


@dataclass(frozen=True)
class Format:
    name: str
    writer: Callable
    reader: Callable
    suffix: str = ""  # a file name suffix for one-file formats; "" for a folder


FORMATS = {
    f.name: f
    for f in (
        Format("npy", NpyWriter, open_npy),
        Format("hdf5 contiguous", lambda: H5Writer(chunked=False), open_h5, ".h5"),
        Format("hdf5 chunked", lambda: H5Writer(chunked=True), open_h5, ".h5"),
        Format("lmdb", LmdbWriter, LmdbReader, ".lmdb"),
        Format("zarr chunked", lambda: ZarrWriter(sharded=False), open_zarr),
        Format("zarr sharded", lambda: ZarrWriter(sharded=True), open_zarr),
    )
}


# ---------------------------------------------------------------------------------------------
# measurements


def files_of(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return [Path(root) / name for root, _, names in os.walk(path) for name in names]


def fsync_all(path: Path) -> None:
    for file in files_of(path):
        descriptor = os.open(file, os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)


def disk_usage(path: Path) -> tuple[int, int]:
    """Bytes allocated on disk (as du counts them) and the number of files."""
    files = files_of(path)
    return sum(os.stat(file).st_blocks * 512 for file in files), len(files)


def warm_cache(path: Path) -> None:
    for file in files_of(path):
        with open(file, "rb") as handle:
            while handle.read(1 << 24):
                pass


def write(fmt: Format, path: Path, data: Synthetic) -> float:
    """Seconds to write every structure, including the final fsync; making the data is not timed."""
    writer, elapsed = fmt.writer(), 0.0
    start = time.perf_counter()
    writer.begin(path, data)
    elapsed += time.perf_counter() - start
    for chunk in data.chunks():
        start = time.perf_counter()
        writer.append(chunk)
        elapsed += time.perf_counter() - start
    start = time.perf_counter()
    writer.end()
    fsync_all(path)
    return elapsed + time.perf_counter() - start


def check(fmt: Format, path: Path, data: Synthetic, picks: np.ndarray) -> None:
    reader = fmt.reader(path)
    try:
        for index in picks:
            got, expected = reader.get(int(index)), data.structure(int(index))
            for name, array in expected.items():
                assert np.array_equal(got[name], array), f"{fmt.name}: {name} of structure {index} differs"
    finally:
        reader.close()


def read_batches(reader, batches: np.ndarray, deadline: float) -> int:
    """Reads batch after batch until done or past the deadline; the number of structures read."""
    count = 0
    for batch in batches:
        structures = [reader.get(int(index)) for index in batch]
        count += len(structures)
        if time.perf_counter() > deadline:
            break
    return count


def read_one_process(fmt: Format, path: Path, batches: np.ndarray, seconds: float) -> tuple[float, float, int]:
    """Milliseconds to open and read a first structure, then structures/s and batches read."""
    start = time.perf_counter()
    reader = fmt.reader(path)
    reader.get(0)
    opened = time.perf_counter()
    count = read_batches(reader, batches, opened + seconds)
    rate = count / (time.perf_counter() - opened)
    reader.close()
    return (opened - start) * 1000, rate, count // batches.shape[1]


def worker(fmt_name: str, path: Path, batches: np.ndarray, seconds: float, barrier, results) -> None:
    """One reader process: opens the file itself, waits for the others, reads its batches."""
    try:
        reader = FORMATS[fmt_name].reader(path)
        reader.get(0)
        barrier.wait(timeout=120)
        count = read_batches(reader, batches, time.perf_counter() + seconds)
        results.put(("ok", count, time.perf_counter()))
        reader.close()
    except Exception as error:  # reported in the table, not lost in a child's traceback
        results.put(("error", f"{type(error).__name__}: {error}", 0.0))


def read_processes(fmt: Format, path: Path, batches: np.ndarray, seconds: float) -> float | str:
    """Total structures/s of forked processes, one for each set of batches, each opening the file
    after it starts (DataLoader's way on Linux); an error message if one fails."""
    context = mp.get_context("fork")
    barrier, results = context.Barrier(len(batches) + 1), context.Queue()
    processes = [
        context.Process(target=worker, args=(fmt.name, path, own, seconds, barrier, results)) for own in batches
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=120)
        start = time.perf_counter()
        outcomes = [results.get(timeout=seconds + 120) for _ in processes]
    except Exception as error:
        outcomes = [("error", f"{type(error).__name__} {error}".strip(), 0.0)]
    for process in processes:
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()
    errors = [message for status, message, _ in outcomes if status == "error"]
    if errors:
        return errors[0]
    return sum(count for _, count, _ in outcomes) / (max(end for _, _, end in outcomes) - start)


def full_pass(fmt: Format, path: Path, expected: tuple[float, float]) -> float:
    """Seconds to open and read every energy and every force, checked against the data made."""
    start = time.perf_counter()
    reader = fmt.reader(path)
    sums = reader.full_pass()
    reader.close()
    elapsed = time.perf_counter() - start
    assert np.allclose(sums, expected, rtol=1e-9), f"{fmt.name}: full pass gives {sums}, expected {expected}"
    return elapsed


def measure(fmt: Format, path: Path, data: Synthetic, batches: np.ndarray, args, expected) -> dict:
    """batches: one set for the single reader, then one for each of the reader processes."""
    seconds = write(fmt, path, data)
    size, files = disk_usage(path)
    check(fmt, path, data, batches[0, 0])
    warm_cache(path)
    open_ms, rate, batches_read = read_one_process(fmt, path, batches[0], args.read_seconds)
    many = read_processes(fmt, path, batches[1:], args.read_seconds)
    return {
        "write": len(data) / seconds,
        "size": size / 1e6,
        "per structure": size / len(data),
        "files": files,
        "open": open_ms,
        "read 1": rate,
        "batches 1": batches_read,
        "read n": many,
        "full pass": full_pass(fmt, path, expected),
    }


# ---------------------------------------------------------------------------------------------
# what else ran: the benchmark shares the machine, and its readers need both cores


def cpu_seconds() -> tuple[float, float, float, float]:
    """Wall clock, the machine's busy and stolen CPU seconds, and this process's with its children's."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    tick = os.sysconf("SC_CLK_TCK")
    own = sum(os.times()[:4])  # user and system, of this process and of its finished children
    return time.perf_counter(), (user + nice + system + irq + softirq) / tick, steal / tick, own


def others_share(before: tuple, after: tuple) -> tuple[float, float]:
    """Share of the machine's CPUs that other processes, and the hypervisor (steal), took."""
    wall, busy, steal, own = (b - a for a, b in zip(before, after))
    capacity = wall * (os.cpu_count() or 1)
    return max(busy - own, 0.0) / capacity, steal / capacity


def machine_load(before: tuple, rounds: list[tuple[float, float]], workers: int) -> str:
    whole = others_share(before, cpu_seconds())
    per_round = ", ".join(f"{others:.0%}" for others, _ in rounds)
    return (
        f"Other processes (kernel threads included) kept {whole[0]:.0%} of the machine's CPU time busy "
        f"during the run (rounds: {per_round}); "
        f"steal {whole[1]:.0%}. Anything above a few % slows the figures, the {workers}-process ones most."
    )


# ---------------------------------------------------------------------------------------------
# report


def number(value: float) -> str:
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def cell(values: list) -> str:
    failures = [v for v in values if isinstance(v, str)]
    if failures:
        return f"failed in {len(failures)}/{len(values)} rounds: {failures[0]}"
    return spread(values, number)


COLUMNS = {
    "write": "write str/s",
    "size": "size MB",
    "per structure": "B/structure",
    "files": "files",
    "open": "open ms",
    "read 1": "read str/s 1 proc",
    "read n": "read str/s {workers} procs",
    "full pass": "full pass s",
}


def table(results: dict[str, list[dict]], workers: int) -> str:
    headers = ["format"] + [title.format(workers=workers) for title in COLUMNS.values()]
    rows = [[name, *(cell([r[key] for r in rounds]) for key in COLUMNS)] for name, rounds in results.items()]
    return markdown_table(headers, rows)


def notes(args, results: dict[str, list[dict]], elapsed: float, load: str) -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    packages = ", ".join(f"{name} {version(name)}" for name in ("numpy", "h5py", "lmdb", "zarr"))
    batches = {name: sorted(r["batches 1"] for r in rounds) for name, rounds in results.items()}
    capped = {name: b for name, b in batches.items() if min(b) < args.batches}
    lines = [
        f"Storage formats, {args.structures} structures of 4 to 64 atoms (seed {args.seed}), {args.rounds} rounds, "
        f"medians [min, max]; {datetime.now():%Y-%m-%d %H:%M}, Python {sys.version.split()[0]}, {packages}; "
        f"{os.cpu_count()} cores, {memory:.0f} GiB of memory; the whole run took {elapsed / 60:.1f} min.",
        "",
        f"- Reads are warm-cache: every file was read once just before, and the data ({args.structures} "
        "structures, a few hundred MB a format) fits in the page cache many times over; caches were not dropped.",
        f"- Writes: chunks of {WRITE_CHUNK} structures, the final fsync included, making the data not timed; "
        "size is what du counts (allocated blocks). hdf5 contiguous takes the total atom count up front.",
        f"- Random reads: {args.batches} batches of {args.batch_size} random structures (the same in every format), "
        f"each structure read whole into numpy arrays, one at a time; a reading stops after {args.read_seconds:g} s "
        f"even if batches are left. Open: opening, reading the per-structure atom counts, and a first structure.",
        f"- {args.workers} procs: forked processes, each opening the file itself after it starts and reading "
        f"{args.batches} batches of its own (the same time limit); their total rate, from a common start to the "
        "last finish. The machine has 2 cores: the most 4 processes can give is about twice one.",
        "- Full pass: opening, then every energy and every force component, read and summed (checked against "
        f"the data made). Layout: hdf5 chunks of {H5_CHUNK} rows, read without chunk cache and sieve buffer "
        "(with h5py's defaults, random reads here were 1.6 times slower for contiguous, 12 times for chunked), "
        f"zarr chunks of {ZARR_CHUNK} rows and shards of {ZARR_SHARD} rows, no compression anywhere "
        "(random floats do not compress).",
        f"- {load}",
    ]
    if capped:
        read = "; ".join(f"{name}: {', '.join(map(str, b))}" for name, b in capped.items())
        lines.append(f"- Stopped by the time limit before {args.batches} batches (batches read, 1 proc): {read}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--structures", type=int, default=100000)
    parser.add_argument("--out", type=Path, default=Path(".bench/storage_formats"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--read-seconds", type=float, default=15.0, help="most seconds a random-read test runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--keep", action="store_true", help="keep the last round's files")
    args = parser.parse_args()

    began = time.perf_counter()
    data = Synthetic(args.structures, args.seed)
    expected = reference_sums(data)
    folder = args.out / "data"
    results: dict[str, list[dict]] = {name: [] for name in args.formats}
    cpu_before, round_loads = cpu_seconds(), []
    for round_ in range(args.rounds):
        round_start = cpu_seconds()
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        rng = np.random.default_rng([args.seed, 2, round_])
        batches = rng.integers(0, args.structures, (1 + args.workers, args.batches, args.batch_size))
        order = args.formats[round_ % len(args.formats) :] + args.formats[: round_ % len(args.formats)]
        for name in order:
            fmt = FORMATS[name]
            path = folder / (name.replace(" ", "-") + fmt.suffix)
            measured = measure(fmt, path, data, batches, args, expected)
            results[name].append(measured)
            shown = {key: (number(v) if not isinstance(v, str) else v) for key, v in measured.items()}
            print(f"  round {round_ + 1}, {name}: {shown}", file=sys.stderr, flush=True)
        round_loads.append(others_share(round_start, cpu_seconds()))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)

    load = machine_load(cpu_before, round_loads, args.workers)
    report = notes(args, results, time.perf_counter() - began, load) + "\n\n" + table(results, args.workers) + "\n"
    print("\n" + report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(report)


if __name__ == "__main__":
    main()
