"""mtt against mace-torch on five generated systems: test errors, the user's whole run, memory,
and mtt at float32 against float64.

    python benchmarks/mace_systems.py [--systems ...] [--epochs 60] [--seeds 42 43]
                                      [--tools mtt mace mtt64] [--fresh]
                                      [--architecture equivariant_mp]
                                      [--loss-weights forces=10] [--final-loss-weights forces=1]

Run it with mtt's own environment (``python`` of the worktree's .venv) and nothing else on the
machine. MACE's virtual environment, its command line and mtt's options are those of
``compare_mace.py`` (MACE's 32x0e+32x1o at float32; equivariant_mp at its defaults, batch 10);
"mtt64" is the same mtt run at ``base_precision: 64``. ``--architecture soap_bpnn`` runs
SOAP-BPNN at its defaults instead (its float32 against float64), and ``--loss-weights`` and
``--final-loss-weights`` set mtt's ``loss.weights`` and ``final_stage.loss_weights``.

The systems are generated once (cached in .bench/mace_systems/data/, kept apart from the runs):
each is Langevin MD at 500 K (0.5 fs, friction 0.01/fs, 200 steps of warm-up, a frame every 10
steps), labelled by its reference method:

  pyridine      aromatic heterocycle C5H5N (three elements), GFN2-xTB (tblite)
  butane        flexible chain, trans-butane C4H10 (its torsions turn at 500 K), GFN2-xTB
  acetamide     four elements, CH3CONH2, GFN2-xTB
  water4        a cluster of four water molecules (no cell), GFN2-xTB
  cuau          periodic Cu-Au alloy, 8 atoms in random order on two fcc cubic cells, with
                stress, ASE's EMT; six trajectories, each in a cell strained at random by up to 3%
                (8 atoms: within 5 Å an atom of the solid has some 40 neighbours, a small
                molecule's 10, so that its runs cost about those of the molecules)

A first trajectory gives 350 frames: 300 training and 50 validation structures, at random. A
second trajectory from other velocities gives 200 test structures (cuau: the frames of the
first four cells are shuffled into training and validation, the last two cells are the test).
Molecules are labelled with tblite's defaults (GFN2-xTB, electronic temperature 300 K).

Each run (tool, system, seed, epochs) is the user's command, timed from start to exported model
(mtt: ``mtt train``, which exports model.pt; MACE: ``mace_run_train`` with its two stages,
which writes its compiled models), with the peak resident memory of its process. The test
errors are each tool's own: mtt's test line, MACE's model run by ``mace_eval_configs``.
Finished runs are cached as compare_mace's are, so a rerun trains only what is missing.

This is a benchmark, not a test: nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import ase
import ase.io
import numpy as np
from ase import units
from ase.build import bulk, molecule
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from compare_mace import (
    MACE,
    _mtt_source_state,
    cached_run,
    mace_command,
    mtt_options,
    setup_mace,
    train_mace,
    train_mtt,
)
from harness import BENCH, alternate, markdown_table, spread

WORK = BENCH / "mace_systems"
SYSTEMS = ("pyridine", "butane", "acetamide", "water4", "cuau")
TOOLS = ("mtt", "mace", "mtt64")
N_TRAIN, N_VALIDATION, N_TEST = 300, 50, 200
STRIDE, WARMUP = 10, 200

STRESS_DATASET = (
    "{{systems: {{read_from: {file}, length_unit: angstrom}}, targets: {{energy: "
    "{{key: REF_energy, unit: eV, forces: {{key: REF_forces}}, stress: {{key: REF_stress}}}}}}}}"
)
# MACE learns the stress too where the data has it: its energy, forces and stress loss
MACE_STRESS = ["--stress_key", "REF_stress", "--loss", "stress", "--compute_stress", "True"]


# -- the data ---------------------------------------------------------------------------------


def _water_cluster(rng: np.random.Generator) -> ase.Atoms:
    """Four water molecules at the corners of a 2.8 Å square, turned at random."""
    cluster = ase.Atoms()
    for corner in [(0, 0, 0), (2.8, 0, 0), (0, 2.8, 0), (2.8, 2.8, 0)]:
        water = molecule("H2O")
        water.rotate(rng.uniform(0, 360), rng.normal(size=3), center="COM")
        water.translate(np.array(corner) - water.get_center_of_mass())
        cluster += water
    return cluster


def _start(name: str, rng: np.random.Generator) -> ase.Atoms:
    if name == "pyridine":
        return molecule("C5H5N")
    if name == "butane":
        return molecule("trans-butane")
    if name == "acetamide":
        return molecule("CH3CONH2")
    if name == "water4":
        return _water_cluster(rng)
    alloy = bulk("Cu", "fcc", a=3.75, cubic=True).repeat((1, 1, 2))  # between Cu's 3.61 and Au's 4.08
    symbols = np.array(["Cu"] * 4 + ["Au"] * 4)
    rng.shuffle(symbols)
    alloy.set_chemical_symbols(symbols)
    return alloy


def _calculator(name: str):
    if name == "cuau":
        from ase.calculators.emt import EMT

        return EMT()
    from tblite.ase import TBLite

    return TBLite(method="GFN2-xTB", verbosity=0)


def _labelled(atoms: ase.Atoms) -> ase.Atoms:
    """A bare copy with the reference energy, forces (and stress) in eV, Å under REF_ keys."""
    copy = ase.Atoms(atoms.numbers, atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    copy.info["REF_energy"] = atoms.get_potential_energy()
    copy.arrays["REF_forces"] = atoms.get_forces()
    if atoms.pbc.all():
        copy.info["REF_stress"] = atoms.get_stress(voigt=False).reshape(9)
    return copy


def _trajectory(atoms: ase.Atoms, name: str, frames: int, seed: int) -> list[ase.Atoms]:
    """``frames`` labelled frames of Langevin MD at 500 K, one every STRIDE steps after WARMUP."""
    atoms = atoms.copy()
    atoms.calc = _calculator(name)
    rng = np.random.default_rng(seed)
    MaxwellBoltzmannDistribution(atoms, temperature_K=500, rng=rng)
    dynamics = Langevin(atoms, 0.5 * units.fs, temperature_K=500, friction=0.01 / units.fs, rng=rng)
    dynamics.run(WARMUP)
    collected = []
    for _ in range(frames):
        dynamics.run(STRIDE)
        collected.append(_labelled(atoms))
    return collected


def generate(name: str) -> dict[str, list[ase.Atoms]]:
    """The training, validation and test structures of a system."""
    rng = np.random.default_rng(SYSTEMS.index(name))
    start = _start(name, rng)
    if name == "cuau":
        cells = []
        for index in range(6):
            strained = start.copy()
            strain = np.eye(3) + rng.uniform(-0.03, 0.03, size=(3, 3))
            strained.set_cell(start.cell.array @ (strain + strain.T) / 2, scale_atoms=True)
            cells.append(_trajectory(strained, name, max(-(-(N_TRAIN + N_VALIDATION) // 4), N_TEST // 2), 100 + index))
        first = [frame for cell in cells[:4] for frame in cell][: N_TRAIN + N_VALIDATION]
        test = [frame for cell in cells[4:] for frame in cell][:N_TEST]
    else:
        first = _trajectory(start, name, N_TRAIN + N_VALIDATION, 100)
        test = _trajectory(start, name, N_TEST, 200)
    order = rng.permutation(len(first))
    return {
        "train": [first[i] for i in order[:N_TRAIN]],
        "validation": [first[i] for i in order[N_TRAIN:]],
        "test": test,
    }


def write_system(name: str) -> dict[str, Path]:
    """The system's files, generated unless they are there."""
    folder = WORK / "data" / name
    files = {part: folder / f"{part}.xyz" for part in ("train", "validation", "test")}
    if all(path.exists() for path in files.values()):
        return files
    started = time.perf_counter()
    parts = generate(name)
    folder.mkdir(parents=True, exist_ok=True)
    for part, frames in parts.items():
        ase.io.write(files[part], frames, format="extxyz")
    print(f"  {name}: generated in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return files


# -- the runs ---------------------------------------------------------------------------------


def run(tool: str, system: str, files: dict[str, Path], seed: int, epochs: int, args) -> tuple[dict, bool]:
    """A tool's run on a system, from the cache if it is there: (figures, cached)."""
    periodic = system == "cuau"
    if tool.startswith("mtt"):
        options = mtt_options(files, seed, epochs, args.architecture, {}, STRESS_DATASET if periodic else None)
        if tool == "mtt64":
            options = options.replace("base_precision: 32", "base_precision: 64")
        weighted = (("loss: {weights", args.loss_weights), ("final_stage: {loss_weights", args.final_loss_weights))
        for option, given in weighted:
            if given:
                weights = ", ".join(f"{name}: {value}" for name, value in given)
                line = "    log_interval: 1\n"
                options = options.replace(line, f"{line}    {option}: {{{weights}}}}}\n")
        key_text = options + _mtt_source_state()
        train = lambda folder: train_mtt(files, seed, epochs, options, folder, N_TRAIN)  # noqa: E731
    else:
        command = mace_command(files, seed, epochs) + (MACE_STRESS if periodic else [])
        key_text = " ".join(command) + MACE
        train = lambda folder: train_mace(files, seed, epochs, command, folder, N_TRAIN)  # noqa: E731
    weighted = "".join(f"-{name}{value:g}" for name, value in args.loss_weights)
    weighted += "".join(f"-final{name}{value:g}" for name, value in args.final_loss_weights)
    weighted = weighted if tool.startswith("mtt") else ""
    other = f"-{args.architecture}" if tool.startswith("mtt") and args.architecture != "equivariant_mp" else ""
    label = f"{tool}{other}{weighted}-{system}-seed{seed}-{epochs}ep"
    figures, _, cached = cached_run(WORK / "runs", label, key_text, args.fresh, train)
    return figures, cached


FIGURES = ["test F RMSE meV/A", "test E RMSE meV/atom", "wall s", "s/epoch", "peak MB"]


def print_tables(results: dict, systems: list[str], tools: list[str], epochs: int, architecture: str) -> None:
    print(f"\n{architecture} (mtt) vs {MACE}, {epochs} epochs, medians [min-max] over seeds\n")
    headers = ["system", "figure"] + [t for t in tools] + (["mtt/MACE"] if {"mtt", "mace"} <= set(tools) else [])
    headers += ["mtt32/mtt64"] if {"mtt", "mtt64"} <= set(tools) else []
    rows = []
    for system in systems:
        for name in FIGURES:
            values = {tool: results.get((system, name, tool), []) for tool in tools}
            if not any(values.values()):
                continue
            row = [system, name] + [spread(values[t], "{:.3g}".format, "-") for t in tools]
            for a, b in (("mtt", "mace"), ("mtt", "mtt64")):
                if {a, b} <= set(tools):
                    row.append(
                        f"{statistics.median(values[a]) / statistics.median(values[b]):.2f}"
                        if values[a] and values[b]
                        else "-"
                    )
            rows.append(row)
    print(markdown_table(headers, rows, align="ll" + "r" * (len(headers) - 2)))


def _term_weight(text: str) -> tuple[str, float]:
    """'forces=10' -> ('forces', 10.0)"""
    name, _, value = text.partition("=")
    return name, float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    for flag, option in (("--loss-weights", "loss.weights"), ("--final-loss-weights", "final_stage.loss_weights")):
        parser.add_argument(
            flag, nargs="+", default=[], type=_term_weight, metavar="TERM=WEIGHT", help=f"mtt's training.{option}"
        )
    parser.add_argument(
        "--architecture", default="equivariant_mp", help="mtt's architecture, at its defaults (soap_bpnn: precision)"
    )
    parser.add_argument("--data-only", action="store_true", help="generate the systems and stop")
    parser.add_argument("--fresh", action="store_true", help="ignore the cached runs (and replace them)")
    args = parser.parse_args()

    files = {system: write_system(system) for system in args.systems}
    if args.data_only:
        return
    if "mace" in args.tools:
        setup_mace()
    results: dict[tuple, list] = {}
    for index, seed in enumerate(args.seeds):
        for system in args.systems:
            for tool in alternate(args.tools, index + args.systems.index(system)):
                started = time.perf_counter()
                figures, cached = run(tool, system, files[system], seed, args.epochs, args)
                for name, value in figures.items():
                    results.setdefault((system, name, tool), []).append(value)
                print(
                    f"  {system} {tool} seed {seed}: "
                    + ("cached" if cached else f"{time.perf_counter() - started:.0f} s")
                    + f", test F RMSE {figures['test F RMSE meV/A']:.1f} meV/A, "
                    f"E RMSE {figures['test E RMSE meV/atom']:.2f} meV/atom",
                    file=sys.stderr,
                )
    print_tables(results, args.systems, args.tools, args.epochs, args.architecture)


if __name__ == "__main__":
    main()
