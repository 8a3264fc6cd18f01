"""Datasets larger than memory: conversion speed, start-up time and resident memory of
`mtt train` on converted datasets of 10 thousand to a million structures, the training
throughput of a converted dataset against the same structures read into memory, and what
each of two ranks reads.

    python benchmarks/large_data.py [--sizes 10000,100000,1000000] [--runs 3] [--quick]
                                    [--parts generate,convert,startup,throughput,ranks]

Why: a converted dataset (``mtt data convert``, a folder of .npy arrays read as memory
maps) is streamed by DataLoader workers, so that the memory of a run should not grow with
the dataset. This measures whether it does, and what streaming costs.

How:

1. generate: synthetic datasets written straight in the converted format
   (``mtt.data.convert.write_dataset``), without an XYZ file: a pool of 2000 fcc cells
   of Cu, Ag, Au, Ni, Pd, Pt and Al (4 to 64 atoms), rattled (0.1 Å) and strained
   (±3 %), labelled with ASE's EMT (energy, forces, stress), then each structure of the
   dataset is one of them under a random rotation, with its labels rotated: exact labels
   of real physics. A few are checked against EMT on the spot. They are kept in
   ``.bench/large_data/`` (1M structures are about 1.7 GB) and reused.
2. convert: the smallest size written as extended XYZ, converted by `mtt data convert`
   (its default processes), alternating with ``ase.io.read(path, ':')`` of the same file.
3. startup: `mtt train` on each size (SOAP-BPNN, small descriptor, batch 16), stopped by
   SIGTERM about 10 s after its first optimisation step (mtt writes a checkpoint and exits
   with 75). /proc/<pid>/status of the main process and of its children (the DataLoader
   workers) is read every 0.2 s: peak VmRSS (which counts the pages of the memory maps
   in the page cache) and RssAnon (the process's own memory). Goals: peak memory at the
   largest size at most 1.5 x that at the smallest, first step in under 30 s.
4. throughput: 2 epochs on the smallest size, converted against the same structures in
   extended XYZ (read into memory by mtt), alternating; structures/s of each epoch
   (training and validation, from metrics.csv). Goal: converted / in memory >= 0.9. Twice:
   with the default memory budget (``cache_memory_mb``, which holds streamed structures once
   read) and with none (every structure read at every epoch: the cost of streaming itself).
5. ranks: `torchrun --nproc-per-node 2` on the smallest size, 1 epoch, batch 8 per rank:
   each rank should read half of the training set.

Sizes alternate from run to run; tables give medians [min, max]. OMP_NUM_THREADS is left
as it is. Run it with nothing else heavy on the machine: every figure here is a wall time
or a memory peak. The full run (3 runs of 10k, 100k and 1M) should take about an hour on
an idle 2-core machine (part 4 is most of it; generating 1M structures takes about
a minute, 1.7 GB on disk); ``--quick`` (500 and 2000 structures, 1 run) one to four
minutes. Results: printed, and written to ``.bench/large_data/results.md`` and
``results.json`` after every part.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ase.io
import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.stress import full_3x3_to_voigt_6_stress
from harness import BENCH, EMT_TARGETS, alternate, epoch_times, free_port, markdown_table, median_min_max, mtt_train
from harness import spread as median_range

from mtt.data.convert import write_dataset
from mtt.data.readers import TargetInfo

OUT = BENCH / "large_data"
GENERATOR_VERSION = 1  # in the cached datasets' names: change it when the generator changes
SEED = 12345
POOL_SIZE = 2000
CHUNK = 20_000  # structures generated at a time
ELEMENTS = ("Cu", "Ag", "Au", "Ni", "Pd", "Pt", "Al")
# (cubic conventional cell?, repetitions): 4 to 64 atoms
CELLS = (
    (True, (1, 1, 1)),
    (False, (2, 2, 2)),
    (True, (2, 1, 1)),
    (False, (3, 2, 2)),
    (True, (2, 2, 1)),
    (False, (3, 3, 2)),
    (False, (3, 3, 3)),
    (True, (2, 2, 2)),
    (False, (4, 3, 3)),
    (True, (3, 2, 2)),
    (False, (4, 4, 4)),
    (True, (4, 2, 2)),
)
TARGET = TargetInfo(name="energy", quantity="energy", unit="eV", forces=True, stress=True)
DATASET_BLOCK = """\
systems: {path}
targets:
  energy: {targets}
"""
OPTIONS = """\
seed: 0
architecture:
  name: soap_bpnn
  model: {{soap: {{max_radial: 3, max_angular: 2}}}}
  training: {{batch_size: {batch}, num_epochs: {epochs}, log_interval: 1{extra}}}
training_set: {training_set}
validation_set: {validation}
test_set: 0.0
"""
FIRST_STEP = re.compile(r"first optimisation step done ([\d.]+) s after mtt started")
MTT = [sys.executable, "-m", "mtt"]


# -- statistics and tables ------------------------------------------------------------------
def spread(values: list[float], digits: int = 1) -> str:
    """``median [min, max]`` of the values, the value alone when there is one, or a dash when there are none."""
    values = [v for v in values if v is not None]
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return median_range(values, f"{{:,.{digits}f}}".format)


def median(values: list[float]) -> float | None:
    found = median_min_max(values)
    return found[0] if found else None


def ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}" if value is not None and reference else "-"


@dataclass
class Report:
    """What is printed, kept to be written as results.md, with the raw figures as JSON."""

    sections: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict)

    def add(self, text: str) -> None:
        print("\n" + text, flush=True)
        self.sections.append(text)
        self.save()

    def save(self) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "results.md").write_text("\n\n".join(self.sections) + "\n")
        (OUT / "results.json").write_text(json.dumps(self.raw, indent=1, default=str))


def progress(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- 1. the synthetic datasets ----------------------------------------------------------------
@dataclass
class Pool:
    """The base structures, their atoms concatenated, with EMT's labels."""

    types: np.ndarray  # (atoms,)
    positions: np.ndarray  # (atoms, 3)
    forces: np.ndarray  # (atoms, 3)
    n_atoms: np.ndarray  # (structures,)
    first_atom: np.ndarray  # (structures,)
    cells: np.ndarray  # (structures, 3, 3)
    energy: np.ndarray  # (structures,)
    stress: np.ndarray  # (structures, 3, 3), eV/Å^3


def base_structure(rng: np.random.Generator) -> Atoms:
    """An fcc cell of a random element and size, strained (±3 %) and rattled (0.1 Å)."""
    cubic, repeat = CELLS[rng.integers(len(CELLS))]
    atoms = bulk(str(rng.choice(ELEMENTS)), "fcc", cubic=cubic).repeat(repeat)
    strain = rng.uniform(-0.03, 0.03, (3, 3))
    atoms.set_cell(atoms.cell[:] @ (np.eye(3) + (strain + strain.T) / 2), scale_atoms=True)
    atoms.positions += rng.normal(0.0, 0.1, atoms.positions.shape)
    return atoms


def emt_labels(atoms: Atoms) -> tuple[float, np.ndarray, np.ndarray]:
    """EMT's energy (eV), forces (eV/Å) and 3x3 stress (eV/Å^3) of ``atoms``."""
    atoms = atoms.copy()
    atoms.calc = EMT()
    return atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False)


_POOL: list[Pool] = []


def make_pool() -> Pool:
    """The base structures (made once per process; about half a minute of EMT)."""
    if _POOL:
        return _POOL[0]
    started = time.perf_counter()
    rng = np.random.default_rng([SEED, 0])
    structures = [base_structure(rng) for _ in range(POOL_SIZE)]
    labels = [emt_labels(atoms) for atoms in structures]
    n_atoms = np.array([len(atoms) for atoms in structures], dtype=np.int64)
    pool = Pool(
        types=np.concatenate([atoms.numbers for atoms in structures]).astype(np.int32),
        positions=np.concatenate([atoms.positions for atoms in structures]),
        forces=np.concatenate([forces for _, forces, _ in labels]),
        n_atoms=n_atoms,
        first_atom=np.concatenate([[0], np.cumsum(n_atoms)[:-1]]),
        cells=np.stack([atoms.cell[:] for atoms in structures]),
        energy=np.array([energy for energy, _, _ in labels]),
        stress=np.stack([stress for _, _, stress in labels]),
    )
    progress(
        f"pool of {POOL_SIZE} EMT structures ({n_atoms.min()} to {n_atoms.max()} atoms) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    _POOL.append(pool)
    return pool


def random_rotations(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` rotation matrices, uniformly distributed (QR of Gaussian matrices)."""
    q, r = np.linalg.qr(rng.normal(size=(count, 3, 3)))
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
    q[np.linalg.det(q) < 0] *= -1.0  # reflections to rotations (3x3: -Q has the other sign)
    return q


def choices(n: int) -> np.ndarray:
    """The base structure of each of the ``n`` structures."""
    return np.random.default_rng([SEED, 1, n]).integers(0, POOL_SIZE, n)


def fill_chunk(arrays: dict[str, np.ndarray], pool: Pool, base: np.ndarray, start: int, first_atom: int) -> None:
    """Rows ``start`` to ``start + len(base)`` (atoms from ``first_atom``): the base structures
    ``base``, each under its own random rotation R, with positions, cell and forces
    multiplied by R (as rows: x @ R.T) and the stress R S R.T."""
    rng = np.random.default_rng([SEED, 2, start])
    rotations = random_rotations(rng, len(base))
    counts = pool.n_atoms[base]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])  # first atom of each, within the chunk
    total = int(counts.sum())
    atom_index = np.repeat(pool.first_atom[base] - offsets, counts) + np.arange(total)
    per_atom = np.repeat(rotations, counts, axis=0)
    atoms = slice(first_atom, first_atom + total)
    rows = slice(start, start + len(base))
    forces = np.einsum("aij,aj->ai", per_atom, pool.forces[atom_index])
    stress = np.einsum("mij,mjk,mlk->mil", rotations, pool.stress[base], rotations)
    arrays["types"][atoms] = pool.types[atom_index]
    arrays["positions"][atoms] = np.einsum("aij,aj->ai", per_atom, pool.positions[atom_index])
    arrays["forces.energy"][atoms] = forces
    arrays["cells"][rows] = np.einsum("mkj,mij->mki", pool.cells[base], rotations)
    arrays["pbc"][rows] = True
    arrays["n_atoms"][rows] = counts
    arrays["first_atom"][rows] = first_atom + offsets
    arrays["values.energy"][rows] = pool.energy[base]
    arrays["squares.forces.energy"][rows] = np.add.reduceat((forces**2).sum(axis=1), offsets)
    arrays["stress.energy"][rows] = stress
    arrays["squares.stress.energy"][rows] = (stress**2).sum(axis=(1, 2))


def generate(n: int, path: Path) -> None:
    """Write ``n`` rotated EMT structures at ``path``, a converted dataset, a chunk at a time."""
    pool = make_pool()
    base = choices(n)
    n_atoms = pool.n_atoms[base]
    starts = np.concatenate([[0], np.cumsum(n_atoms)[:-1]])

    def fill(folder: Path, layout: dict[str, tuple[str, tuple]]) -> None:
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r+") for name in layout}
        for start in range(0, n, CHUNK):
            stop = min(start + CHUNK, n)
            fill_chunk(arrays, pool, base[start:stop], start, int(starts[start]))
        for array in arrays.values():
            array.flush()

    write_dataset(path, n, int(n_atoms.sum()), [TARGET], [f"benchmarks/large_data.py generate({n})"], fill)


def check_against_emt(path: Path, indices: list[int]) -> float:
    """The largest difference between the stored labels of structures ``indices`` and EMT's
    labels of the stored structure (energy in eV, forces eV/Å, stress eV/Å^3)."""
    worst = 0.0
    arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in STORED}
    for index in indices:
        atoms, energy, forces, stress = stored_structure(arrays, index)
        expected = emt_labels(atoms)
        for got, want in zip((energy, forces, stress), expected):
            worst = max(worst, float(np.abs(np.asarray(got) - want).max()))
    return worst


STORED = ("types", "positions", "cells", "n_atoms", "first_atom", "values.energy", "forces.energy", "stress.energy")


def stored_structure(arrays: dict[str, np.ndarray], index: int) -> tuple[Atoms, float, np.ndarray, np.ndarray]:
    start = int(arrays["first_atom"][index])
    atoms = slice(start, start + int(arrays["n_atoms"][index]))
    structure = Atoms(
        numbers=arrays["types"][atoms], positions=arrays["positions"][atoms], cell=arrays["cells"][index], pbc=True
    )
    return (
        structure,
        float(arrays["values.energy"][index]),
        np.array(arrays["forces.energy"][atoms]),
        np.array(arrays["stress.energy"][index]),
    )


def dataset_path(n: int) -> Path:
    return OUT / f"emt-v{GENERATOR_VERSION}-{n}.mttdata"


def ensure_dataset(n: int, report: Report) -> Path:
    """The dataset of ``n`` structures, generated unless it is there already."""
    path = dataset_path(n)
    figures = report.raw.setdefault("generate", {})
    if (path / "dataset.json").is_file():
        figures[str(n)] = {"cached": True, "bytes": folder_bytes(path)}
        return path
    progress(f"generating {n:,} structures at {path}")
    started = time.perf_counter()
    generate(n, path)
    seconds = time.perf_counter() - started
    worst = check_against_emt(path, [0, n // 2, n - 1])
    figures[str(n)] = {"cached": False, "seconds": seconds, "bytes": folder_bytes(path), "emt_deviation": worst}
    progress(f"  {seconds:.1f} s, {folder_bytes(path) / 1e6:,.0f} MB; labels against EMT: max deviation {worst:.1e}")
    if worst > 1e-6:
        raise SystemExit(f"the generated labels of {path} differ from EMT's by {worst}: the generator is wrong")
    return path


def folder_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


# -- 2. conversion ---------------------------------------------------------------------------
def write_xyz(dataset: Path, path: Path) -> None:
    """Every structure of ``dataset`` as extended XYZ, its labels as a SinglePointCalculator's."""
    if path.is_file():
        return
    arrays = {name: np.load(dataset / f"{name}.npy", mmap_mode="r") for name in STORED}
    partial = path.with_suffix(".partial.xyz")
    with open(partial, "w") as file:
        for index in range(len(arrays["n_atoms"])):
            atoms, energy, forces, stress = stored_structure(arrays, index)
            atoms.calc = SinglePointCalculator(
                atoms, energy=energy, forces=forces, stress=full_3x3_to_voigt_6_stress(stress)
            )
            ase.io.write(file, atoms, format="extxyz")
    partial.rename(path)


def xyz_of(n: int) -> Path:
    """The dataset of ``n`` structures as extended XYZ (written once)."""
    path = OUT / f"emt-v{GENERATOR_VERSION}-{n}.xyz"
    if not path.is_file():
        progress(f"writing {path}")
        write_xyz(dataset_path(n), path)
    return path


def convert_once(xyz: Path, work: Path) -> dict:
    """`mtt data convert` of ``xyz``: its wall time, and what it says of itself."""
    (work / "dataset.yaml").write_text(DATASET_BLOCK.format(path=xyz, targets=EMT_TARGETS))
    output = work / "converted.mttdata"
    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    result = subprocess.run(
        [*MTT, "data", "convert", "dataset.yaml", "-o", str(output)], cwd=work, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"mtt data convert failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-3000:]}")
    said = re.search(r"in ([\d.]+) s \(([\d,]+) structures/s, (\d+) process", result.stdout)
    return {
        "wall_s": wall,
        "mtt_s": float(said.group(1)) if said else None,
        "processes": int(said.group(3)) if said else None,
        "bytes": folder_bytes(output),
        "output": result.stdout.strip(),
    }


def ase_read_seconds(xyz: Path) -> float:
    started = time.perf_counter()
    frames = ase.io.read(xyz, ":")
    seconds = time.perf_counter() - started
    del frames
    return seconds


def compare_converted(converted: Path, generated: Path) -> dict[str, float]:
    """Largest difference between the XYZ file's conversion and the generated dataset, by
    array (extended XYZ keeps 8 decimals of positions and forces)."""
    differences = {}
    for name in STORED:
        a = np.load(converted / f"{name}.npy", mmap_mode="r")
        b = np.load(generated / f"{name}.npy", mmap_mode="r")
        differences[name] = float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())
    return differences


def part_convert(n: int, runs: int, report: Report) -> None:
    xyz = xyz_of(n)
    figures: dict[str, list] = {"wall_s": [], "mtt_s": [], "ase_read_s": []}
    with tempfile.TemporaryDirectory(dir=OUT) as work:
        work = Path(work)
        for run in range(runs):
            for what in alternate(("convert", "ase"), run):
                if what == "convert":
                    done = convert_once(xyz, work)
                    figures["wall_s"].append(done["wall_s"])
                    figures["mtt_s"].append(done["mtt_s"])
                    figures["processes"], figures["bytes"] = done["processes"], done["bytes"]
                    figures["mtt_output"] = done["output"]
                else:
                    figures["ase_read_s"].append(ase_read_seconds(xyz))
            progress(f"conversion run {run + 1} of {runs} done")
        figures["max_difference_to_generated"] = compare_converted(work / "converted.mttdata", dataset_path(n))
    figures["xyz_bytes"] = xyz.stat().st_size
    report.raw["convert"] = figures
    rate = lambda seconds: [n / s for s in seconds if s]  # noqa: E731
    rows = [
        ["`mtt data convert` (wall, with start-up)", spread(figures["wall_s"]), spread(rate(figures["wall_s"]), 0)],
        ["`mtt data convert` (as it reports)", spread(figures["mtt_s"]), spread(rate(figures["mtt_s"]), 0)],
        [
            "`ase.io.read(path, ':')`, for reference",
            spread(figures["ase_read_s"]),
            spread(rate(figures["ase_read_s"]), 0),
        ],
    ]
    differences = ", ".join(f"{k} {v:.1e}" for k, v in figures["max_difference_to_generated"].items())
    report.add(
        f"## Conversion of {n:,} structures from extended XYZ\n\n"
        + markdown_table(["", "seconds", "structures/s"], rows)
        + f"\n\n{figures['processes']} processes; {runs} runs, alternating with ASE's read. Size on disk: "
        f"{figures['bytes'] / 1e6:,.1f} MB converted against {figures['xyz_bytes'] / 1e6:,.1f} MB of XYZ "
        f"({figures['bytes'] / figures['xyz_bytes']:.2f}). Converted against generated, largest difference: "
        f"{differences}."
    )


# -- 3. start-up and memory ---------------------------------------------------------------------
def status_kb(pid: int) -> dict[str, int]:
    """The memory figures of /proc/<pid>/status, in kB (empty when the process is gone)."""
    figures = {}
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    figures[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return figures


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (from any of its threads)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
    except FileNotFoundError:
        return []
    return found


@dataclass
class Watch:
    """Peaks of the memory of a training process and of its children, in MB."""

    main_rss: float = 0.0
    main_hwm: float = 0.0
    main_anon: float = 0.0
    main_file: float = 0.0
    worker_anon: float = 0.0  # the largest worker
    workers_anon: float = 0.0  # all workers together
    workers: int = 0

    def sample(self, pid: int) -> None:
        main = status_kb(pid)
        if main:
            self.main_rss = max(self.main_rss, main.get("VmRSS", 0) / 1024)
            self.main_hwm = max(self.main_hwm, main.get("VmHWM", 0) / 1024)
            self.main_anon = max(self.main_anon, main.get("RssAnon", 0) / 1024)
            self.main_file = max(self.main_file, main.get("RssFile", 0) / 1024)
        anon = [status_kb(child).get("RssAnon", 0) / 1024 for child in children(pid)]
        if anon:
            self.workers = max(self.workers, len(anon))
            self.worker_anon = max(self.worker_anon, max(anon))
            self.workers_anon = max(self.workers_anon, sum(anon))


def train_log(work: Path) -> Path | None:
    return next(work.glob("outputs/*/*/train.log"), None)


def watch_training(
    work: Path, command: list[str], after_first_step: float, timeout: float, env: dict | None = None
) -> dict:
    """Run ``command`` in ``work``, sample its memory every 0.2 s, and send it SIGTERM
    ``after_first_step`` seconds after its train.log says that the first step is done."""
    watch = Watch()
    started = time.perf_counter()
    first_step = first_seen = stopped_at = None
    with open(work / "output.txt", "w") as output:
        process = subprocess.Popen(command, cwd=work, stdout=output, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            watch.sample(process.pid)
            now = time.perf_counter()
            if first_step is None:
                log = train_log(work)
                found = FIRST_STEP.search(log.read_text()) if log is not None else None
                if found:
                    first_step, first_seen = float(found.group(1)), now - started
            if first_seen is not None and stopped_at is None and now - started >= first_seen + after_first_step:
                process.send_signal(signal.SIGTERM)
                stopped_at = now - started
            if now - started > timeout and stopped_at is None:
                process.send_signal(signal.SIGTERM)
                stopped_at = now - started
            if now - started > timeout + 120:
                process.kill()
            time.sleep(0.2)
        returncode = process.wait()
    watch.sample(process.pid)
    text = (work / "output.txt").read_text()
    log = train_log(work)
    return {
        "returncode": returncode,
        "first_step_s": first_step,
        "first_step_seen_s": first_seen,
        "sigterm_at_s": stopped_at,
        "wall_s": time.perf_counter() - started,
        "main_rss_mb": watch.main_rss,
        "main_hwm_mb": watch.main_hwm,
        "main_anon_mb": watch.main_anon,
        "main_file_mb": watch.main_file,
        "worker_anon_mb": watch.worker_anon,
        "workers_anon_mb": watch.workers_anon,
        "workers": watch.workers,
        "train_log": log.read_text() if log is not None else "",
        "output_tail": text[-3000:],
    }


def options_text(training_set: str, epochs: int, validation: float, batch: int = 16, extra: str = "") -> str:
    return OPTIONS.format(training_set=training_set, epochs=epochs, validation=validation, batch=batch, extra=extra)


def xyz_training_set(xyz: Path) -> str:
    """The training_set block of an extended XYZ file, inline."""
    return f"{{systems: {xyz}, targets: {{energy: {EMT_TARGETS}}}}}"


def startup_run(n: int, after_first_step: float, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(dir=OUT) as work:
        work = Path(work)
        (work / "options.yaml").write_text(options_text(str(dataset_path(n)), epochs=1, validation=0.01))
        result = watch_training(work, mtt_train(), after_first_step, timeout)
    if result["first_step_s"] is None or result["returncode"] not in (0, 75):
        print(
            f"\n!! mtt train on {n:,} structures: exit status {result['returncode']}, first step "
            f"{result['first_step_s']}\n{result['output_tail']}",
            file=sys.stderr,
        )
    return result


def part_startup(sizes: list[int], runs: int, after_first_step: float, timeout: float, report: Report) -> None:
    results: dict[int, list[dict]] = {n: [] for n in sizes}
    for run in range(runs):
        for n in alternate(sizes, run):
            progress(f"start-up run {run + 1} of {runs}: {n:,} structures")
            result = startup_run(n, after_first_step, timeout)
            results[n].append(result)
            progress(
                f"  first step {result['first_step_s']} s, exit {result['returncode']}, main RSS "
                f"{result['main_rss_mb']:.0f} MB (anon {result['main_anon_mb']:.0f}), workers' anon "
                f"{result['worker_anon_mb']:.0f} MB"
            )
    report.raw["startup"] = {
        str(n): [{k: v for k, v in r.items() if k not in ("train_log", "output_tail")} for r in rs]
        for n, rs in results.items()
    }
    columns = [
        ("first step (s)", "first_step_s"),
        ("main peak VmRSS (MB)", "main_rss_mb"),
        ("main peak RssAnon (MB)", "main_anon_mb"),
        ("largest worker RssAnon (MB)", "worker_anon_mb"),
        ("all workers RssAnon (MB)", "workers_anon_mb"),
    ]
    reference = sizes[0]
    rows = []
    for n in sizes:
        row = [f"{n:,}"]
        for _, key in columns:
            values = [r[key] for r in results[n]]
            row.append(spread(values))
        for _, key in columns[:4]:
            row.append(ratio(median([r[key] for r in results[n]]), median([r[key] for r in results[reference]])))
        statuses = sorted({r["returncode"] for r in results[n]})
        row.append(", ".join(str(s) for s in statuses))
        rows.append(row)
    headers = ["structures"] + [c for c, _ in columns] + [f"{c.split(' (')[0]} / {reference:,}" for c, _ in columns[:4]]
    largest = sizes[-1]
    peak = lambda n, key: median([r[key] for r in results[n]])  # noqa: E731
    first = peak(largest, "first_step_s")
    memory = ratio(peak(largest, "main_rss_mb"), peak(reference, "main_rss_mb"))
    anon = ratio(peak(largest, "main_anon_mb"), peak(reference, "main_anon_mb"))
    goals = (
        f"Goals at {largest:,}: peak VmRSS of the main process {memory} x that at {reference:,} (goal <= 1.5), "
        f"RssAnon {anon} x; first step after {first if first is not None else '-'} s (goal < 30 s)."
    )
    report.add(
        "## Start-up and memory of `mtt train` on converted datasets\n\n"
        + markdown_table(headers + ["exit status"], rows)
        + f"\n\n{runs} run(s) per size, sizes alternating; each stopped by SIGTERM {after_first_step:.0f} s after "
        "its first optimisation step (exit status 75; 0 when the epoch ended first). Memory read from "
        "/proc/<pid>/status every 0.2 s: VmRSS counts the memory-mapped dataset pages in the page cache, "
        "RssAnon only the process's own memory; workers are the main process's children. First step: as "
        "train.log says (seconds after mtt started). " + goals
    )


# -- 4. throughput: converted against in memory ------------------------------------------------
def epochs_of(work: Path) -> dict:
    """Epoch times from metrics.csv, set sizes and the data-loading line from train.log."""
    folder = train_log(work).parent
    times = epoch_times(folder)
    text = (folder / "train.log").read_text()
    sizes = re.search(r"(\d+) training, (\d+) validation, (\d+) test structures", text)
    loading = re.search(r"data loading: (.*)", text)
    full = re.search(r"cache of precomputed inputs is full \(([\d.]+) MB, (\d+) structures\)", text)
    return {
        "epoch_s": times,
        "train": int(sizes.group(1)),
        "validation": int(sizes.group(2)),
        "loading": loading.group(1).strip() if loading else None,
        "cache_full": f"{full.group(2)} structures kept in {full.group(1)} MB" if full else None,
    }


#: the memory budgets compared: the default (which holds streamed structures once read, and
#: SOAP-BPNN's kept descriptor), and none (every structure read, and every descriptor computed,
#: at every step: what streaming itself costs)
BUDGETS = {"default budget": "", "cache_memory_mb: 0": ", cache_memory_mb: 0"}


def throughput_run(kind: str, n: int, budget: str, epochs: int = 2) -> dict:
    training_set = str(dataset_path(n)) if kind == "converted" else xyz_training_set(xyz_of(n))
    with tempfile.TemporaryDirectory(dir=OUT) as work:
        work = Path(work)
        text = options_text(training_set, epochs=epochs, validation=0.05, extra=BUDGETS[budget])
        (work / "options.yaml").write_text(text)
        started = time.perf_counter()
        result = subprocess.run(mtt_train(), cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if result.returncode != 0:
            raise SystemExit(f"mtt train ({kind}, {n:,}) failed ({result.returncode}):\n{result.stderr[-3000:]}")
        figures = epochs_of(work)
    figures["wall_s"] = wall
    structures = figures["train"] + figures["validation"]
    figures["rates"] = [structures / seconds for seconds in figures["epoch_s"]]
    return figures


def part_throughput(n: int, runs: int, report: Report) -> None:
    xyz_of(n)
    kinds = ("converted", "in memory")
    results: dict[str, dict[str, list[dict]]] = {budget: {kind: [] for kind in kinds} for budget in BUDGETS}
    for run in range(runs):
        for budget in BUDGETS:
            for kind in alternate(kinds, run):
                progress(f"throughput run {run + 1} of {runs}, {budget}: {kind}")
                results[budget][kind].append(throughput_run(kind, n, budget))
                rates = results[budget][kind][-1]["rates"]
                progress(f"  structures/s by epoch: {', '.join(f'{r:.0f}' for r in rates)}")
    report.raw["throughput"] = results
    rows = []
    notes = []
    for budget, by_kind in results.items():
        for kind, figures in by_kind.items():
            rows.append(
                [
                    budget,
                    kind,
                    spread([f["rates"][1] for f in figures]),
                    spread([f["rates"][0] for f in figures]),
                    spread([f["wall_s"] for f in figures]),
                ]
            )
        rates = {k: [median([f["rates"][e] for f in v]) for e in (0, 1)] for k, v in by_kind.items()}
        ratios = [ratio(rates["converted"][e], rates["in memory"][e]) for e in (1, 0)]
        rows.append([budget, "converted / in memory", *ratios, ""])
        full = sorted({f"{k}: {f['cache_full']}" for k, runs_ in by_kind.items() for f in runs_ if f["cache_full"]})
        loading = by_kind["converted"][0]["loading"]
        notes.append(
            f"- {budget}: {'cache full in ' + '; '.join(full) if full else 'nothing dropped from the cache'}. "
            f"Converted, first run: `{loading or '-'}`"
        )
    first = results["default budget"]["converted"][0]
    report.add(
        f"## Throughput on {n:,} structures: converted against in memory\n\n"
        + markdown_table(["budget", "training set", "epoch 2 structures/s", "epoch 1 structures/s", "run wall s"], rows)
        + f"\n\n{first['train']:,} training and {first['validation']:,} validation structures per epoch (both "
        f"counted in structures/s, from metrics.csv's epoch time); {runs} runs each, alternating. Epoch 1 includes "
        "reading every structure and computing the descriptor that is kept; epoch 2 is the steady state. Goal: "
        "converted / in memory >= 0.9 at epoch 2. With the default budget, streamed structures are held once read "
        "(before kept descriptors); with none, every structure is read and every descriptor computed at every step.\n\n"
        + "\n".join(notes)
    )


# -- 5. two ranks --------------------------------------------------------------------------------
def part_ranks(n: int, report: Report) -> None:
    progress(f"two ranks on {n:,} structures")
    with tempfile.TemporaryDirectory(dir=OUT) as work:
        work = Path(work)
        (work / "options.yaml").write_text(options_text(str(dataset_path(n)), epochs=1, validation=0.01, batch=8))
        started = time.perf_counter()
        result = subprocess.run(mtt_train(ranks=2, port=free_port()), cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if result.returncode != 0:
            raise SystemExit(f"torchrun with 2 ranks failed ({result.returncode}):\n{result.stderr[-3000:]}")
        figures = epochs_of(work)
    read = re.search(r"structures read by each rank in the first epoch: ([\d, ]+);", figures["loading"] or "")
    per_rank = [int(x) for x in read.group(1).split(",")] if read else []
    figures.update({"wall_s": wall, "per_rank": per_rank})
    report.raw["ranks"] = figures
    half = figures["train"] / 2
    verdict = (
        f"each rank read {' and '.join(str(c) for c in per_rank)} of {figures['train']:,} training structures "
        f"({'half each, as expected' if per_rank and all(abs(c - half) <= 8 for c in per_rank) else 'NOT half each'})"
    )
    report.add(
        f"## Two ranks on {n:,} structures (torchrun, batch 8 per rank, 1 epoch)\n\n"
        f"`data loading: {figures['loading']}`\n\n{verdict}; {wall:.0f} s in all."
    )


# -- main ------------------------------------------------------------------------------------------
PARTS = ("generate", "convert", "startup", "throughput", "ranks")


def header(sizes: list[int], runs: int) -> str:
    load = os.getloadavg()
    threads = os.environ.get("OMP_NUM_THREADS")
    return (
        f"# Datasets larger than memory ({time.strftime('%Y-%m-%d %H:%M')})\n\n"
        f"Sizes {', '.join(f'{n:,}' for n in sizes)}; {runs} run(s); {len(os.sched_getaffinity(0))} cores; "
        f"OMP_NUM_THREADS {threads!r} (left as it is); load average at the start {load[0]:.2f}. "
        "Nothing else heavy should run at the same time: every figure is a wall time or a memory peak."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Datasets larger than memory: conversion, start-up, memory.")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="dataset sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement (throughput: 2 at most)")
    parser.add_argument("--quick", action="store_true", help="500 and 2000 structures, 1 run: a test of the script")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts to run, of {', '.join(PARTS)}")
    parser.add_argument("--after-first-step", type=float, default=10.0, help="seconds before SIGTERM")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds before a start-up run is stopped")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    runs = args.runs
    if args.quick:
        sizes, runs, args.after_first_step = [500, 2000], 1, 3.0
    parts = [p.strip() for p in args.parts.split(",")]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    smallest = sizes[0]
    OUT.mkdir(parents=True, exist_ok=True)
    report = Report()
    report.raw["settings"] = {"sizes": sizes, "runs": runs, "parts": parts, "after_first_step": args.after_first_step}
    report.add(header(sizes, runs))
    for n in sizes:  # every part needs them
        ensure_dataset(n, report)
    if "generate" in parts:
        rows = []
        for n in sizes:
            figures = report.raw["generate"][str(n)]
            made = (
                "cached"
                if figures["cached"]
                else f"{figures['seconds']:.1f} s, EMT check {figures['emt_deviation']:.0e}"
            )
            rows.append([f"{n:,}", f"{figures['bytes'] / 1e6:,.1f}", made])
        report.add(
            "## Generated datasets\n\n"
            + markdown_table(["structures", "MB on disk", "generated"], rows)
            + f"\n\nIn {OUT}; rotated copies of {POOL_SIZE} EMT structures of 4 to 64 atoms."
        )
    if "convert" in parts:
        part_convert(smallest, runs, report)
    if "startup" in parts:
        part_startup(sizes, runs, args.after_first_step, args.timeout, report)
    if "throughput" in parts:
        part_throughput(smallest, min(runs, 2), report)
    if "ranks" in parts:
        part_ranks(smallest, report)
    print(f"\nwritten to {OUT / 'results.md'} and {OUT / 'results.json'}")


if __name__ == "__main__":
    main()
