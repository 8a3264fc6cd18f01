"""What several benchmarks share: where things are, the ``mtt train`` command, what they read
from an mtt run folder, the virtual environment of a tool that mtt is compared with, the peak
memory of a run, ASE MD rates in a fresh process, alternating runs, medians with min and max,
and Markdown tables.

The scripts in benchmarks/ import it from beside them; the entry script of a benchmark's own
folder (device_check/main.py) puts benchmarks/ on ``sys.path`` first. It needs the standard
library only: storage_formats.py runs in a virtual environment without torch or mtt.
"""

from __future__ import annotations

import csv
import re
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# -- where things are ---------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]  # the checkout
BENCH = ROOT / ".bench"  # what benchmarks keep between runs (git ignores it)
EMT = ROOT / "examples" / "data" / "emt_metals.xyz"
EMT_GENERATOR = ROOT / "examples" / "data" / "generate_emt_dataset.py"
#: the energy target blocks of the EMT data and of the shared ethanol data (rMD17, kcal/mol)
EMT_TARGETS = "{key: energy, unit: eV, forces: on, stress: on}"
ETHANOL_TARGETS = "{key: energy, unit: kcal/mol, forces: forces}"
#: the torch that mtt's own environment has, installed in the compared tools' environments too
TORCH = "torch==2.13.0"


def _shared_data() -> Path:
    """shared/data beside the checkout, or beside the main checkout of a git worktree."""
    try:
        common = subprocess.run(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:  # no git (the GPU machine may have none)
        common = ""
    candidates = [ROOT.parent / "shared" / "data"] + (
        [Path(common).parent.parent / "shared" / "data"] if common else []
    )
    return next((c for c in candidates if c.is_dir()), candidates[0])


#: the shared DFT and xTB datasets (ethanol, QM9, carbon), which do not travel with the repository
DATA = _shared_data()


# -- mtt train -----------------------------------------------------------------------------------
def mtt_train(
    options: str = "options.yaml",
    overrides: Sequence[str] = (),
    *,
    ranks: int | None = None,
    port: int | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The command of ``mtt train``: one process, or ``ranks`` ranks under torchrun (with
    ``distributed=true``, and torchrun's rendezvous at ``port`` when it is given)."""
    if ranks is None:
        return [python, "-m", "mtt", "train", options, *overrides]
    rendezvous = [f"--master-port={port}"] if port is not None else []
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        *rendezvous,
        "-m",
        "mtt",
        "train",
        options,
        "distributed=true",
        *overrides,
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- an mtt run folder ---------------------------------------------------------------------------
def run_folder(cwd: Path) -> Path:
    """The run folder (outputs/<date>/<time>) of the one ``mtt train`` run in ``cwd``."""
    return next(Path(cwd).glob("outputs/*/*"))


def metrics(folder: Path) -> list[dict[str, str]]:
    """The rows of metrics.csv, one an epoch."""
    with open(folder / "metrics.csv") as file:
        return list(csv.DictReader(file))


def epoch_times(folder: Path) -> list[float]:
    """The wall time of each epoch (training and validation), from metrics.csv."""
    return [float(row["time [s]"]) for row in metrics(folder)]


def seconds_per_epoch(folder: Path) -> float:
    """Median wall time of an epoch (training and validation), from metrics.csv; the
    first epoch is left out when there are others (it pays one-off warm-up costs)."""
    times = epoch_times(folder)
    return statistics.median(times[1:] or times)


def peak_memory_mb(folder: Path) -> float:
    """Peak resident memory of the run (the largest rank), as train.log reports it (its
    summary's "peak memory", or "peak resident memory" before the summary existed)."""
    text = (folder / "train.log").read_text()
    return float(re.search(r"peak (?:resident )?memory:\s+(\d+) MB", text).group(1))


def test_line(folder: Path) -> str:
    """``test set (N structures): energy per atom rmse ...``, as train.log has it (the
    terminal shows the test errors in the summary's table instead)."""
    lines = (folder / "train.log").read_text().splitlines()
    return next(line.split(" INFO ", 1)[-1] for line in lines if " INFO test set (" in line)


def test_errors(line: str) -> dict[str, tuple[float, str | None]]:
    """``test set (10 structures): energy per atom rmse 27.62 meV/atom, ...`` as
    ``{"energy per atom rmse": (27.62, "meV/atom"), ...}``."""
    errors = {}
    for item in line.split(": ", 1)[1].split(", "):
        match = re.fullmatch(r"(.+?) ([-+0-9.eE]+|nan|inf)(?: (\S+))?", item.strip())
        if match:
            name, value, unit = match.groups()
            errors[name] = (float(value), unit)
    return errors


#: energies to meV (forces: meV/Å), from the units that mtt and the compared tools print
MEV = {"mev": 1.0, "ev": 1000.0, "kcal/mol": 43.364104, "hartree": 27211.386}


def in_mev(value: float | str, unit: str) -> float:
    """An energy (per atom) or a force in ``unit`` (meV/atom, eV/Å, kcal/mol, ...), in meV or meV/Å."""
    unit = unit.lower()
    while unit not in MEV:
        suffix = next((s for s in ("/atom", "/a", "/å", "/angstrom") if unit.endswith(s)), None)
        if suffix is None:
            raise KeyError(f"no conversion to meV from {unit!r}")
        unit = unit.removesuffix(suffix)
    return float(value) * MEV[unit]


# -- the tools mtt is compared with --------------------------------------------------------------
def tool_venv(folder: Path, marker: str, *installs: list[str]) -> Path:
    """The python of the virtual environment ``folder``, created unless its ``bin/marker``
    (a command the tool installs) is there: pip upgraded, then each of ``installs`` in turn,
    one ``pip install`` each."""
    python = folder / "bin" / "python"
    if (folder / "bin" / marker).exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    for packages in installs:
        subprocess.run(pip + packages, check=True)
    return python


# run with ``python -c PEAK_MEMORY command...``: runs the command, then prints its peak resident
# memory (RUSAGE_CHILDREN, kB) as ``PEAK <kB>`` on stderr
PEAK_MEMORY = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]).returncode; "
    "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r)"
)


def timed_run(command: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``command`` in ``cwd`` under the memory wrapper, its output captured: (the finished
    process, wall seconds, peak resident memory in MB, nan if it was not printed)."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK_MEMORY, *command], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    peak = re.search(r"PEAK (\d+)", result.stderr)
    return result, wall, int(peak.group(1)) / 1024 if peak else float("nan")


# -- ASE MD --------------------------------------------------------------------------------------
# ``setup`` defines ``systems()``, which yields (atoms with their calculator, timed steps); each
# runs velocity Verlet at 0.5 fs from 300 K, ``warmup`` steps untimed, then prints
# ``RATE <atoms> <steps/s>``
MD_RATE = """
import time, ase.io, numpy as np
from ase import units
from ase.md.verlet import VelocityVerlet
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
{setup}
for atoms, steps in systems():
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dynamics = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    dynamics.run({warmup})
    start = time.perf_counter()
    dynamics.run(steps)
    print("RATE", len(atoms), steps / (time.perf_counter() - start))
"""


def ase_md_rates(
    setup: str, warmup: int, *, python: str = sys.executable, cwd: Path | None = None, env: dict | None = None
) -> list[float]:
    """Steps/s of ASE MD of each system of ``setup`` (see MD_RATE), in one fresh process."""
    script = MD_RATE.format(setup=textwrap.dedent(setup).strip(), warmup=warmup)
    output = subprocess.run([python, "-c", script], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout
    return [float(line.split()[2]) for line in output.splitlines() if line.startswith("RATE")]


# -- alternating runs, medians, tables -----------------------------------------------------------
def alternate(items: Sequence, round_: int) -> list:
    """``items`` in their order in even rounds and the other way round in odd ones, so that
    no item always runs first (the machine's slow phases last minutes)."""
    return list(items) if round_ % 2 == 0 else list(items)[::-1]


def median_min_max(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(median, min, max) of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def spread(
    values: Sequence[float | None], number: Callable[[float], str] = "{:.3g}".format, separator: str = ", "
) -> str:
    """``median [min, max]`` of the values that are not None, each written by ``number``
    (``separator`` between min and max); a dash when there are none."""
    found = median_min_max(values)
    if found is None:
        return "-"
    median, low, high = found
    return f"{number(median)} [{number(low)}{separator}{number(high)}]"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence], align: str = "") -> str:
    """A Markdown table; ``align`` gives each column's alignment, ``l`` or ``r`` (default: left)."""
    rules = ["---:" if side == "r" else "---" for side in align.ljust(len(headers), "l")]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
