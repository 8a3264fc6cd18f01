"""mtt against mace-torch, side by side: test errors, training throughput, fixed cost, memory,
parameter count and ASE MD speed, on the shared ethanol datasets.

    python benchmarks/compare_mace.py [--repeats 2] [--epochs-1000 8] [--epochs-small 100]
                                      [--splits xtb-1000 xtb-50 rmd17-80] [--tools mtt mace]
                                      [--md-steps 100] [--md-rounds 3] [--fresh]
                                      [--mtt-architecture equivariant_mp] [--mtt-model-yaml HYPERS]

Run it with mtt's own environment (``python`` of the worktree's .venv) and nothing else on the
machine. The first run creates .bench/mace, a virtual environment with torch 2.13.0 (CPU, the
same torch as mtt's) and mace-torch 0.3.16.

The splits are written once, in eV and eV/Å under the keys REF_energy and REF_forces (which
ASE's reader leaves in ``atoms.info``/``atoms.arrays``), to .bench/compare_mace/splits/, and both
tools read those files:

  xtb-1000  (a) ethanol_xtb_2000.xyz shuffled with a fixed seed: 1000 training, 100 validation,
            900 test structures
  xtb-50    (b) the first 50 of those training structures, the same validation and test sets
  rmd17-80  (c) ethanol_reduced_100.xyz (rMD17, kcal/mol converted to eV) in file order:
            structures 0-79 training, 80-89 validation, 90-99 test

MACE is a small model, as measured in the issue: ``--hidden_irreps 32x0e+32x1o --r_max 5
--batch_size 10 --default_dtype float32`` and its recommended two-stage schedule with EMA
(``--swa --ema --ema_decay 0.99``), ``--E0s average`` (MACE needs some E0s), otherwise MACE's
defaults, but for ``--valid_batch_size 20``: mtt evaluates in batches of twice the training
batch by default, and both tools validate in the same batches (MACE's default is 10).
mtt trains the architecture of MTT_OPTIONS (``--mtt-architecture``, default equivariant_mp,
with the model hyperparameters of ``--mtt-model-yaml``, a YAML mapping or a YAML file) with
batch 10, float32 and the trainer's defaults. If mtt does not know the architecture, the
script says so and measures MACE alone.

Run r uses the seed 42 + r for both tools (the splits stay the same: the seed moves the initial
weights and the order of the batches). The tools alternate (their order too, from one run to
the next) and never train at once; the table gives medians with [min-max] over the runs and the
ratio mtt / MACE. The figures of each tool on each split:

- test errors of forces (meV/Å) and energy per atom (meV/atom), MAE and RMSE. mtt's from the
  ``test set (N structures):`` line of ``mtt train``; MACE's from its stage-two model
  (``mace_stagetwo.model``) run by ``mace_eval_configs`` over the test file, since MACE's own
  error table has RMSEs only, rounded to 0.1 meV: its RMSEs are checked against that table.
- s/epoch and training throughput in structures/s: training structures / the mean wall time of
  epochs 2 to N, validation included (mtt: the ``time [s]`` column of metrics.csv; MACE: the
  span of the millisecond stamps of its per-epoch validation lines). The first epoch's extra
  work (caches, warm-up) counts as fixed cost: the wall time of the training command minus
  N times the mean epoch. MACE's fixed cost holds its end of run: two error tables (stage one
  and two models) over the training, validation and test sets, compiled models and plots.
- peak resident memory of the training process (RUSAGE_CHILDREN, in MB).
- parameters: MACE's ``model.parameters()`` (what mace's own count_parameters sums; 0.3.16
  logs it only with LoRA), and mtt's model rebuilt from the checkpoint's ``model_state``,
  ``parameters()`` likewise (buffers such as the composition baseline are not counted).
- ASE MD steps/s of the exported models (mtt's model.pt through metatomic-ase's
  MetatomicCalculator, MACE's model through mace.calculators.MACECalculator), VelocityVerlet
  0.5 fs from 300 K, 10 warm-up steps then ``--md-steps`` timed steps on one ethanol molecule
  and a quarter of that on 99 atoms: 11 ethanol molecules with random rotations at sites of a
  2x2x3 grid in a periodic 12 Å box, from a fixed seed, no two molecules' atoms within 2 Å.
  After the trainings of a split, each tool's model runs both systems in one process, the
  tools alternating, ``--md-rounds`` times. Then again with ``MALLOC_MMAP_MAX_=0
  MALLOC_TRIM_THRESHOLD_=1073741824`` in both tools' environment ("malloc settings"): what
  mtt's docs suggest for engines on CPUs, which mtt's own commands do by themselves (mtt's
  exported models raise glibc's dynamic thresholds on their own, in the first rows too).

Sizing (2 CPU cores, no GPU, an idle machine): MACE takes about 20 s an epoch on 1000 ethanol
structures and 2 s on 80 (measured here: 1.9-2.1 s; the issue had 1.35-1.5 s), a little less on
50 training and 100 validation ones, and 50-80 s of fixed cost a run. With the defaults (8
epochs of xtb-1000, 100 epochs of each small split, 2 runs) MACE trains for about
2 x (240 + 240 + 250) s = 24 min; if mtt's architecture costs about as much, the trainings take
some 50 minutes, and MD (3 rounds x 2 tools x 3 splits x 2 runs of about 15 s each) another 9:
about an hour, once. Later runs reuse MACE's (see below) and take about half of that.
``--splits rmd17-80 --epochs-small 200`` is the issue's setting (MACE reached 45 meV/Å force
RMSE and 0.9 meV/atom energy RMSE); 8 epochs of xtb-1000 (800 optimiser steps) is a budget for
speed more than for accuracy. Any other process on the machine slows the timings many times
over (the script warns when the load average says so); the errors do not depend on it.

Finished runs are reused: each run's figures are cached as JSON in its folder under
.bench/compare_mace/ (with its models, for MD), keyed by tool, split, seed, epochs and a hash
of the options text (mtt: the options file and the state of mtt's sources, the tree of src/
at HEAD and its uncommitted changes; MACE: its command line and version), and so are its MD rates
(keyed by the MD settings). A rerun trains only what is missing, and runs MD only for the
models without cached rates (then the other tool's rounds are not run again, and the two sets of
rates come from different times); ``--fresh`` ignores the cache.
The time each part took is printed at the end (cached parts count as 0).

This is a benchmark, not a test: nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

import ase
import ase.io
import numpy as np
import yaml
from ase import units
from harness import (
    BENCH,
    DATA,
    ROOT,
    TORCH,
    alternate,
    ase_md_rates,
    epoch_times,
    in_mev,
    markdown_table,
    mtt_train,
    run_folder,
    spread,
    test_errors,
    test_line,
    timed_run,
    tool_venv,
)

VENV = BENCH / "mace"
WORK = BENCH / "compare_mace"
MACE = "mace-torch==0.3.16"
TOOLS = ("mtt", "mace")

SPLIT_SEED = 0  # shuffles ethanol_xtb_2000.xyz (four trajectories, in order) before splitting
SPLITS = {  # name: (file, its energy unit in eV, training, validation, test frames as ranges)
    "xtb-1000": ("ethanol_xtb_2000.xyz", 1.0, (0, 1000), (1000, 1100), (1100, 2000)),
    "xtb-50": ("ethanol_xtb_2000.xyz", 1.0, (0, 50), (1000, 1100), (1100, 2000)),
    "rmd17-80": ("ethanol_reduced_100.xyz", units.kcal / units.mol, (0, 80), (80, 90), (90, 100)),
}
SHUFFLED = {"ethanol_xtb_2000.xyz"}  # files whose frames are shuffled before the ranges are taken

# ============================================================================================
# mtt's options: the architecture under test. Its name and model hyperparameters come from
# --mtt-architecture and --mtt-model-yaml; the default model block ({}) is the architecture's
# defaults. For a like-for-like comparison, give equivariant_mp MACE's size here or with
# --mtt-model-yaml once its hyperparameters exist (MACE: cutoff 5 Å, 32 channels, l up to 1).
MTT_ARCHITECTURE = "equivariant_mp"
MTT_MODEL_HYPERS: dict = {}
MTT_OPTIONS = """
seed: {seed}
base_precision: 32
architecture:
  name: {architecture}
  model: {model}
  training:
    batch_size: 10
    num_epochs: {epochs}
    log_interval: 1
    checkpoint_interval: 100000
training_set: {train}
validation_set: {validation}
test_set: {test}
"""
MTT_DATASET = (
    "{{systems: {{read_from: {file}, length_unit: angstrom}}, targets: {{energy: "
    "{{key: REF_energy, unit: eV, forces: {{key: REF_forces}}}}}}}}"
)
# ============================================================================================

# MACE's command line (the small model); the files, seed and epochs are added per run
MACE_ARGUMENTS = [
    "--name",
    "mace",
    "--model",
    "MACE",
    "--hidden_irreps",
    "32x0e+32x1o",
    "--r_max",
    "5.0",
    "--batch_size",
    "10",
    "--valid_batch_size",
    "20",
    "--default_dtype",
    "float32",
    "--device",
    "cpu",
    "--swa",
    "--ema",
    "--ema_decay",
    "0.99",
    "--E0s",
    "average",
    "--energy_key",
    "REF_energy",
    "--forces_key",
    "REF_forces",
]
MACE_MODEL = "mace_stagetwo.model"  # the model after stage two, which MACE recommends

# the parameters of a trained model, run in the tool's environment with the model's path
MTT_PARAMETERS = (
    "import sys; from mtt.export import model_from_state; from mtt.training.state import TrainingState; "
    "model = model_from_state(TrainingState.load(sys.argv[1]))[0]; "
    "print(sum(p.numel() for p in model.parameters()))"
)
MACE_PARAMETERS = (
    "import sys, torch; model = torch.load(sys.argv[1], map_location='cpu', weights_only=False); "
    "print(sum(p.numel() for p in model.parameters()))"
)

# the MD of one tool's exported model (harness.MD_RATE) on each system file in turn
MD = """
{calculator}
def systems():
    for path, steps in {systems!r}:
        atoms = ase.io.read(path)
        atoms.calc = calculator()
        yield atoms, steps
"""
CALCULATORS = {
    "mtt": "from metatomic_ase import MetatomicCalculator\n"
    "calculator = lambda: MetatomicCalculator('model.pt', extensions_directory='extensions')",
    "mace": "from mace.calculators import MACECalculator\n"
    f"calculator = lambda: MACECalculator(model_paths='{MACE_MODEL}', device='cpu', default_dtype='float32')",
}

FIGURES = [
    "test F MAE meV/A",
    "test F RMSE meV/A",
    "test E MAE meV/atom",
    "test E RMSE meV/atom",
    "s/epoch",
    "structures/s",
    "fixed s",
    "peak MB",
    "parameters",
    "MD 9 atoms steps/s",
    "MD 99 atoms steps/s",
    "MD 9 atoms steps/s, malloc settings",
    "MD 99 atoms steps/s, malloc settings",
]
#: MD runs twice: with the engine's environment as it is, and with the two glibc settings
#: that "Using a trained model" suggests for engines on CPUs (for both tools alike; mtt's
#: own commands set them by themselves, an engine's process does not)
MD_SETTINGS = {
    "": {},
    ", malloc settings": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1073741824"},
}


class ArchitectureMissing(Exception):
    """mtt does not know the architecture under test."""


# -- set-up -----------------------------------------------------------------------------------


def setup_mace() -> None:
    tool_venv(VENV, "mace_run_train", [TORCH], [MACE])  # torch first: the CPU build, not CUDA's


def _labelled(atoms: ase.Atoms, factor: float) -> ase.Atoms:
    """A bare copy with the reference energy and forces in eV, eV/Å, under REF_ keys."""
    copy = ase.Atoms(atoms.numbers, atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    copy.info["REF_energy"] = atoms.get_potential_energy() * factor  # ASE keeps them in atoms.calc
    copy.arrays["REF_forces"] = atoms.get_forces() * factor
    return copy


def write_splits() -> dict[str, dict[str, Path]]:
    """Each split's train/validation/test files (written again each time: they are the same)."""
    files = {}
    for name, (file, factor, *ranges) in SPLITS.items():
        frames = ase.io.read(DATA / file, ":")
        order = (
            np.random.default_rng(SPLIT_SEED).permutation(len(frames)) if file in SHUFFLED else np.arange(len(frames))
        )
        folder = WORK / "splits" / name
        folder.mkdir(parents=True, exist_ok=True)
        files[name] = {}
        for part, (start, stop) in zip(("train", "validation", "test"), ranges):
            path = files[name][part] = folder / f"{part}.xyz"
            ase.io.write(path, [_labelled(frames[i], factor) for i in order[start:stop]], format="extxyz")
    return files


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def ethanol_box(
    molecule: ase.Atoms, count: int = 11, box: float = 12.0, seed: int = 0, closest: float = 2.0
) -> ase.Atoms:
    """``count`` copies of ``molecule`` at sites of a 2x2x3 grid (6, 6 and 4 Å apart) in a
    periodic cubic box, each turned by a random rotation, drawn again until no atom is within
    ``closest`` Å of another molecule's."""
    shape = np.array([2, 2, 3])
    rng = np.random.default_rng(seed)
    grid = (np.stack(np.meshgrid(*map(np.arange, shape), indexing="ij"), -1).reshape(-1, 3) + 0.5) * box / shape
    centred = molecule.positions - molecule.positions.mean(axis=0)
    atoms = ase.Atoms(cell=[box] * 3, pbc=True)
    for site in grid[rng.choice(len(grid), count, replace=False)]:
        for _ in range(1000):
            candidate = atoms + ase.Atoms(molecule.numbers, centred @ _random_rotation(rng).T + site)
            if len(atoms) == 0:
                break
            distances = candidate.get_all_distances(mic=True)[len(atoms) :, : len(atoms)]
            if distances.min() >= closest:
                break
        else:
            raise RuntimeError("could not place the molecules without overlaps")
        atoms = candidate
    return atoms


def write_md_systems() -> list[tuple[str, int]]:
    """One ethanol molecule and the 99-atom box, as files; returns (path, atoms) pairs."""
    folder = WORK / "md"
    folder.mkdir(parents=True, exist_ok=True)
    molecule = ase.io.read(DATA / "ethanol_xtb_2000.xyz", "0")
    molecule = ase.Atoms(molecule.numbers, molecule.positions)
    systems = [(folder / "ethanol.xyz", molecule), (folder / "ethanol_box_99.xyz", ethanol_box(molecule))]
    for path, atoms in systems:
        ase.io.write(path, atoms, format="extxyz")
    return [(str(path), len(atoms)) for path, atoms in systems]


# -- one training run --------------------------------------------------------------------------


def _mtt_source_state() -> str:
    """The committed tree of mtt's sources and their uncommitted changes: mtt's cached runs
    follow its code (and not commits elsewhere, such as this script's)."""
    tree = subprocess.run(["git", "rev-parse", "HEAD:src"], cwd=ROOT, capture_output=True, text=True).stdout
    diff = subprocess.run(["git", "diff", "HEAD", "--", "src"], cwd=ROOT, capture_output=True, text=True).stdout
    return tree.strip() + hashlib.sha256(diff.encode()).hexdigest()


def mtt_options(
    files: dict[str, Path], seed: int, epochs: int, architecture: str, model: dict, dataset: str | None = None
) -> str:
    """mtt's options.yaml for a run; ``dataset`` (default MTT_DATASET) is each split's block."""
    datasets = {part: (dataset or MTT_DATASET).format(file=path) for part, path in files.items()}
    return MTT_OPTIONS.format(seed=seed, epochs=epochs, architecture=architecture, model=json.dumps(model), **datasets)


def mace_command(files: dict[str, Path], seed: int, epochs: int) -> list[str]:
    return MACE_ARGUMENTS + [
        "--train_file",
        str(files["train"]),
        "--valid_file",
        str(files["validation"]),
        "--test_file",
        str(files["test"]),
        "--seed",
        str(seed),
        "--max_num_epochs",
        str(epochs),
    ]


def _timed_run(command: list[str], folder: Path) -> tuple[str, float, float, int]:
    """Run a training under the memory wrapper: (output, wall s, peak MB, exit status)."""
    result, wall, peak_mb = timed_run(command, folder)
    return result.stdout + result.stderr, wall, peak_mb, result.returncode


def _parameters(python: str, script: str, model: Path | str, folder: Path | None = None) -> int:
    """The parameter count of a trained model, from ``script`` run in the tool's environment."""
    output = subprocess.run(
        [python, "-c", script, str(model)], cwd=folder, capture_output=True, text=True, check=True
    ).stdout
    return int(output.split()[-1])


def _epoch_figures(times: list[float], n_train: int, wall: float) -> dict:
    """Mean of epochs 2 to N (of the only one if N is 1), throughput, fixed cost and the whole run."""
    later = times[1:] or times
    per_epoch = statistics.fmean(later)
    return {
        "s/epoch": per_epoch,
        "structures/s": n_train / per_epoch,
        "fixed s": wall - per_epoch * len(times),
        "wall s": wall,
    }


def train_mtt(files, seed, epochs, options: str, folder: Path, n_train: int) -> dict:
    (folder / "options.yaml").write_text(options)
    text, wall, peak_mb, status = _timed_run(mtt_train(), folder)
    (folder / "output.txt").write_text(text)
    if status != 0:
        if "unknown architecture" in text:
            raise ArchitectureMissing(next(line for line in text.splitlines() if "unknown architecture" in line))
        raise SystemExit(f"mtt failed (see {folder / 'output.txt'}):\n{text[-3000:]}")
    run = run_folder(folder)
    errors = test_errors(test_line(run))  # train.log: the terminal shows them in its summary table
    figures = {}
    for name, key in (
        ("test E RMSE meV/atom", "energy per atom rmse"),
        ("test E MAE meV/atom", "energy per atom mae"),
        ("test F RMSE meV/A", "forces rmse"),
        ("test F MAE meV/A", "forces mae"),
    ):
        figures[name] = in_mev(*errors[key])
    figures |= _epoch_figures(epoch_times(run), n_train, wall) | {
        "peak MB": peak_mb,
        "parameters": _parameters(sys.executable, MTT_PARAMETERS, run / "model.ckpt"),
    }
    return figures


def _errors(reference: list[ase.Atoms], predicted: list[ase.Atoms]) -> dict:
    """MAE and RMSE of energy per atom (meV/atom) and force components (meV/Å)."""
    energy = np.array([(p.info["MACE_energy"] - r.info["REF_energy"]) / len(r) for r, p in zip(reference, predicted)])
    forces = np.concatenate(
        [(p.arrays["MACE_forces"] - r.arrays["REF_forces"]).ravel() for r, p in zip(reference, predicted)]
    )
    return {
        "test E MAE meV/atom": 1000 * np.abs(energy).mean(),
        "test E RMSE meV/atom": 1000 * np.sqrt((energy**2).mean()),
        "test F MAE meV/A": 1000 * np.abs(forces).mean(),
        "test F RMSE meV/A": 1000 * np.sqrt((forces**2).mean()),
    }


def mace_log_test_rmse(text: str) -> tuple[float, float]:
    """(energy per atom, forces) RMSE of MACE's last test table (the stage-two model), in meV."""
    table = text[text.rindex("Error-table on TEST") :]
    row = re.search(r"\|\s*\S+\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|", table)
    return float(row.group(1)), float(row.group(2))


def train_mace(files, seed, epochs, command: list[str], folder: Path, n_train: int) -> dict:
    text, wall, peak_mb, status = _timed_run([str(VENV / "bin" / "mace_run_train"), *command], folder)
    (folder / "output.txt").write_text(text)
    if status != 0:
        raise SystemExit(f"MACE failed (see {folder / 'output.txt'}):\n{text[-3000:]}")
    # validation lines, stamped to the millisecond: "Initial: ..." before training, then
    # "Epoch k: ..." at the end of each epoch (training, validation and checkpoint)
    stamps = re.findall(r"^(\S+ \S+) INFO: (?:Initial|Epoch \d+): head", text, re.M)
    times = [datetime.strptime(s, "%Y-%m-%d %H:%M:%S.%f") for s in stamps]
    epochs_s = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    if len(epochs_s) != epochs:
        raise SystemExit(f"MACE logged {len(epochs_s)} epochs, not {epochs} (see {folder / 'output.txt'})")
    subprocess.run(
        [
            str(VENV / "bin" / "mace_eval_configs"),
            "--configs",
            str(files["test"]),
            "--model",
            MACE_MODEL,
            "--output",
            "test_predictions.xyz",
            "--default_dtype",
            "float32",
        ],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    figures = _errors(ase.io.read(files["test"], ":"), ase.io.read(folder / "test_predictions.xyz", ":"))
    log_energy, log_forces = mace_log_test_rmse(text)
    for ours, logged, name in (
        (figures["test E RMSE meV/atom"], log_energy, "energy"),
        (figures["test F RMSE meV/A"], log_forces, "forces"),
    ):
        if abs(ours - logged) > 0.05 + 0.01 * logged:  # the table rounds to 0.1 meV
            print(
                f"  warning: MACE's test {name} RMSE is {logged} in its log, {ours:.3f} from its predictions",
                file=sys.stderr,
            )
    figures |= _epoch_figures(epochs_s, n_train, wall) | {
        "peak MB": peak_mb,
        "parameters": _parameters(str(VENV / "bin" / "python"), MACE_PARAMETERS, MACE_MODEL, folder),
        "log test E RMSE meV/atom": log_energy,
        "log test F RMSE meV/A": log_forces,
    }
    return figures


def warn_if_busy(what: str) -> None:
    """Other processes on the machine slow torch many times over (on 2 cores, a second torch
    process made MACE's epochs 10 times slower): say so, as the timings will be off."""
    load = os.getloadavg()[0]
    if load > 0.7:
        print(
            f"  warning: load average {load:.1f} before {what}: other processes are running, "
            "timings will be slower than on an idle machine",
            file=sys.stderr,
        )


def cached_run(
    runs: Path, label: str, key_text: str, fresh: bool, train: Callable[[Path], dict]
) -> tuple[dict, Path, bool]:
    """The figures of ``train(folder)`` in ``runs/<label>-<hash of key_text>``, from the cache
    if they are there: (figures, folder, cached)."""
    key = hashlib.sha256(key_text.encode()).hexdigest()[:10]
    folder = runs / f"{label}-{key}"
    cached = folder / "figures.json"
    if cached.exists() and not fresh:
        return json.loads(cached.read_text()), folder, True
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted or --fresh run
    folder.mkdir(parents=True)
    warn_if_busy(label)
    figures = train(folder)
    cached.write_text(json.dumps(figures, indent=1))
    return figures, folder, False


def run_training(tool: str, split: str, files, seed: int, epochs: int, args) -> tuple[dict, Path, bool]:
    """A tool's run on a split, from the cache if it is there: (figures, folder, cached)."""
    n_train = SPLITS[split][2][1] - SPLITS[split][2][0]
    label = f"{tool}-{split}-seed{seed}-{epochs}ep"
    if tool == "mtt":
        options = mtt_options(files, seed, epochs, args.mtt_architecture, args.mtt_model)
        train = lambda folder: train_mtt(files, seed, epochs, options, folder, n_train)  # noqa: E731
        return cached_run(WORK / "runs", label, options + _mtt_source_state(), args.fresh, train)
    command = mace_command(files, seed, epochs)
    train = lambda folder: train_mace(files, seed, epochs, command, folder, n_train)  # noqa: E731
    return cached_run(WORK / "runs", label, " ".join(command) + MACE, args.fresh, train)


# -- MD ---------------------------------------------------------------------------------------


def md_rates(tool: str, folder: Path, systems: list[tuple[str, int]], environment: dict[str, str]) -> list[float]:
    """Steps/s of the tool's exported model on each MD system, in one process with ``environment`` added."""
    python = sys.executable if tool == "mtt" else str(VENV / "bin" / "python")
    setup = MD.format(calculator=CALCULATORS[tool], systems=systems)
    return ase_md_rates(setup, warmup=10, python=python, cwd=folder, env={**os.environ, **environment})


def run_md(folders: dict[str, Path], md_systems: list[tuple[str, int]], args) -> tuple[dict, dict]:
    """MD of each tool's model under each of MD_SETTINGS, alternating, from the cache where
    done: ({tool: {figure: rates}}, {tool: seconds})."""
    steps = [(path, args.md_steps if atoms < 50 else max(1, args.md_steps // 4)) for path, atoms in md_systems]
    rates: dict[str, dict] = {tool: {} for tool in folders}
    seconds = {tool: 0.0 for tool in folders}
    for suffix, environment in MD_SETTINGS.items():
        key_of = [steps, args.md_rounds] + ([environment] if environment else [])
        key = hashlib.sha256(json.dumps(key_of).encode()).hexdigest()[:10]
        mine: dict[str, dict] = {}
        for tool, folder in folders.items():
            cached = folder / f"md-{key}.json"
            if cached.exists() and not args.fresh:
                mine[tool] = json.loads(cached.read_text())
        todo = [tool for tool in folders if tool not in mine]
        for tool in todo:
            mine[tool] = {f"MD {atoms} atoms steps/s{suffix}": [] for _, atoms in md_systems}
        if todo:
            warn_if_busy("MD" + suffix)
        for round_ in range(args.md_rounds):
            for tool in alternate(todo, round_):
                started = time.perf_counter()
                for (_, atoms), rate in zip(md_systems, md_rates(tool, folders[tool], steps, environment)):
                    mine[tool][f"MD {atoms} atoms steps/s{suffix}"].append(rate)
                seconds[tool] += time.perf_counter() - started
        for tool in todo:
            (folders[tool] / f"md-{key}.json").write_text(json.dumps(mine[tool]))
        for tool in folders:
            rates[tool].update(mine[tool])
    return rates, seconds


# -- main -------------------------------------------------------------------------------------


def _model_hypers(text: str | None) -> dict:
    if text is None:
        return MTT_MODEL_HYPERS
    hypers = yaml.safe_load(Path(text).read_text() if Path(text).is_file() else text)
    if not isinstance(hypers, dict):
        raise SystemExit(f"--mtt-model-yaml must be a YAML mapping (or a file with one), not {text!r}")
    return hypers


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    digits = 0 if statistics.median(values) >= 1000 else 1 if statistics.median(values) >= 100 else 3
    return spread(values, f"{{:.{digits}f}}".format, "-")


def print_table(results: dict, splits: list[str], epochs: dict, args) -> None:
    print(
        f"\nmtt ({args.mtt_architecture}) vs {MACE}, {args.repeats} run(s) each (seeds 42 to "
        f"{41 + args.repeats}), medians [min-max]; epochs: "
        + ", ".join(f"{split} {epochs[split]}" for split in splits)
        + "\n"
    )
    rows = []
    for split in splits:
        for name in FIGURES:
            ours, theirs = results.get((split, name, "mtt"), []), results.get((split, name, "mace"), [])
            if not ours and not theirs:
                continue
            ratio = f"{statistics.median(ours) / statistics.median(theirs):.2f}" if ours and theirs else "-"
            rows.append([split, name, _cell(ours), _cell(theirs), ratio])
    print(markdown_table(["split", "figure", "mtt", "MACE", "mtt/MACE"], rows, align="llrrr"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=2, help="training runs of each tool per split (seeds 42, 43, ...)"
    )
    parser.add_argument("--epochs-1000", type=int, default=8, help="epochs on xtb-1000")
    parser.add_argument("--epochs-small", type=int, default=100, help="epochs on xtb-50 and rmd17-80")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=list(TOOLS))
    parser.add_argument(
        "--md-steps", type=int, default=100, help="timed MD steps on one molecule (a quarter on 99 atoms)"
    )
    parser.add_argument(
        "--md-rounds", type=int, default=3, help="MD runs of each tool's model per training run, alternating"
    )
    parser.add_argument("--mtt-architecture", default=MTT_ARCHITECTURE)
    parser.add_argument("--mtt-model-yaml", help="mtt's model hyperparameters: a YAML mapping, or a YAML file")
    parser.add_argument("--fresh", action="store_true", help="ignore the cached runs (and replace them)")
    args = parser.parse_args()
    args.mtt_model = _model_hypers(args.mtt_model_yaml)
    epochs = {split: args.epochs_1000 if split == "xtb-1000" else args.epochs_small for split in args.splits}

    spent: dict[str, float] = {}
    started = begin = time.perf_counter()
    if "mace" in args.tools:
        setup_mace()
    files = write_splits()
    md_systems = write_md_systems()
    spent["set-up (environment, splits, MD systems)"] = time.perf_counter() - started

    tools = list(args.tools)
    results: dict[tuple, list] = {}
    for repeat in range(args.repeats):
        for split in args.splits:
            folders = {}
            for tool in alternate(tools, repeat):  # alternate, and the order too
                started = time.perf_counter()
                try:
                    figures, folders[tool], cached = run_training(
                        tool, split, files[split], 42 + repeat, epochs[split], args
                    )
                except ArchitectureMissing as missing:
                    print(
                        f"  mtt does not have the architecture '{args.mtt_architecture}' ({missing}): skipping mtt",
                        file=sys.stderr,
                    )
                    tools.remove("mtt")
                    continue
                seconds = time.perf_counter() - started
                spent[f"{tool} training"] = spent.get(f"{tool} training", 0.0) + seconds
                for name, value in figures.items():
                    results.setdefault((split, name, tool), []).append(value)
                print(
                    f"  {split} {tool} run {repeat + 1}: "
                    + ("cached" if cached else f"trained in {seconds:.0f} s")
                    + f", test F RMSE {figures['test F RMSE meV/A']:.1f} meV/A, {figures['s/epoch']:.2f} s/epoch",
                    file=sys.stderr,
                )
            if not folders or args.md_rounds < 1:
                continue
            rates, seconds = run_md(folders, md_systems, args)
            for tool, figures in rates.items():
                spent[f"{tool} MD"] = spent.get(f"{tool} MD", 0.0) + seconds[tool]
                for name, values in figures.items():
                    results.setdefault((split, name, tool), []).extend(values)
            print(
                f"  {split} MD run {repeat + 1}: "
                + ", ".join(f"{tool} {seconds[tool]:.0f} s" if seconds[tool] else f"{tool} cached" for tool in folders),
                file=sys.stderr,
            )

    print_table(results, args.splits, epochs, args)
    print(
        "\ntime spent: "
        + ", ".join(f"{part} {seconds / 60:.1f} min" for part, seconds in spent.items())
        + f"; total {(time.perf_counter() - begin) / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
