"""Generate a small labelled dataset of Cu, Au and Pt structures with ASE's EMT.

Every structure is a fully periodic cell labelled with the Effective Medium
Theory (EMT) calculator shipped with ASE (``ase.calculators.emt.EMT``):

- bulk fcc supercells of Cu, Au or Pt (4-32 atoms, mostly 4-16);
- binary alloys (Cu/Au, Cu/Pt, Au/Pt) made by random substitution in a bulk
  fcc supercell whose lattice constant follows Vegard's law;
- fcc(111) slabs with vacuum along z, kept periodic in all three directions
  so that the stress is defined for every structure.

Each structure is randomly strained (symmetric strain with components drawn
uniformly in +-3 %, shear included) and its atoms are rattled with a Gaussian
displacement of standard deviation between 0.05 and 0.1 Angstrom.

Units: energies in eV, forces in eV/Angstrom, stress in eV/Angstrom^3 (full
3x3 tensor, ASE sign convention: ``atoms.get_stress(voigt=False)``), lengths
in Angstrom.

The labels are written to extended XYZ as ``energy`` and ``stress`` in the
per-structure info and ``forces`` in the per-atom arrays, with no calculator
attached. When the file is read back with ``ase.io.read(path, ":")``, ASE
recognises these names and moves them into a ``SinglePointCalculator``: they
are then found in ``atoms.calc.results["energy"]``,
``atoms.calc.results["forces"]`` and ``atoms.calc.results["stress"]`` (the
stress as a 6-component Voigt vector; use ``atoms.get_stress(voigt=False)``
for the 3x3 tensor), and not in ``atoms.info`` / ``atoms.arrays``.

Regenerate the shipped file (100 structures, seed 0) from the repository root
with::

    python examples/data/generate_emt_dataset.py --n-structures 100 --seed 0

which writes ``examples/data/emt_metals.xyz`` next to this script.
"""

import argparse
from pathlib import Path
from typing import List, Optional, Tuple

import ase.io
import numpy as np
from ase import Atoms
from ase.build import bulk, fcc111
from ase.calculators.emt import EMT

ELEMENTS = ("Cu", "Au", "Pt")
ALLOY_PAIRS = (("Cu", "Au"), ("Cu", "Pt"), ("Au", "Pt"))
LATTICE_CONSTANTS = {"Cu": 3.61, "Au": 4.08, "Pt": 3.92}  # Angstrom

# (cubic conventional cell?, repetitions): 4, 8, 8, 12, 16 and 32 atoms
BULK_CELLS: Tuple[Tuple[bool, Tuple[int, int, int]], ...] = (
    (True, (1, 1, 1)),
    (False, (2, 2, 2)),
    (True, (2, 1, 1)),
    (False, (3, 2, 2)),
    (True, (2, 2, 1)),
    (True, (2, 2, 2)),
)
# (in-plane repetitions, number of layers): 12 and 16 atoms
SLAB_CELLS: Tuple[Tuple[Tuple[int, int], int], ...] = (((2, 2), 3), ((2, 2), 4))
SLAB_VACUUM = 6.0  # Angstrom on each side of the slab

KINDS = ("bulk", "alloy", "slab")
KIND_WEIGHTS = (0.6, 0.25, 0.15)

MAX_STRAIN = 0.03
RATTLE_STD_RANGE = (0.05, 0.1)  # Angstrom


def bulk_cell_sizes() -> List[int]:
    """Number of atoms of each entry of ``BULK_CELLS``."""
    return [(4 if cubic else 1) * int(np.prod(rep)) for cubic, rep in BULK_CELLS]


def slab_cell_sizes() -> List[int]:
    """Number of atoms of each entry of ``SLAB_CELLS``."""
    return [nx * ny * layers for (nx, ny), layers in SLAB_CELLS]


def make_bulk(rng: np.random.Generator, symbol: str, a: float, max_atoms: int) -> Atoms:
    """Random fcc supercell of ``symbol`` with lattice constant ``a``."""
    allowed = [i for i, n in enumerate(bulk_cell_sizes()) if n <= max_atoms]
    cubic, repeat = BULK_CELLS[rng.choice(allowed)]
    return bulk(symbol, "fcc", a=a, cubic=cubic).repeat(repeat)


def make_alloy(rng: np.random.Generator, max_atoms: int) -> Atoms:
    """Random binary substitutional alloy on an fcc lattice (Vegard's law)."""
    host, guest = ALLOY_PAIRS[rng.integers(len(ALLOY_PAIRS))]
    fraction = rng.uniform(0.2, 0.8)
    a = (1 - fraction) * LATTICE_CONSTANTS[host] + fraction * LATTICE_CONSTANTS[guest]
    atoms = make_bulk(rng, host, a, max_atoms)
    n_guest = max(1, round(fraction * len(atoms)))
    symbols = atoms.get_chemical_symbols()
    for index in rng.choice(len(atoms), size=n_guest, replace=False):
        symbols[index] = guest
    atoms.set_chemical_symbols(symbols)
    return atoms


def make_slab(rng: np.random.Generator, max_atoms: int) -> Atoms:
    """Fully periodic fcc(111) slab with vacuum along z."""
    symbol = ELEMENTS[rng.integers(len(ELEMENTS))]
    allowed = [i for i, n in enumerate(slab_cell_sizes()) if n <= max_atoms]
    (nx, ny), layers = SLAB_CELLS[rng.choice(allowed)]
    slab = fcc111(
        symbol,
        size=(nx, ny, layers),
        a=LATTICE_CONSTANTS[symbol],
        vacuum=SLAB_VACUUM,
        periodic=True,
    )
    del slab.info["adsorbate_info"]  # a dict, which extxyz cannot store
    return slab


def strain_and_rattle(rng: np.random.Generator, atoms: Atoms) -> None:
    """Apply a random symmetric strain (shear included) and rattle the atoms."""
    strain = rng.uniform(-MAX_STRAIN, MAX_STRAIN, size=(3, 3))
    strain = 0.5 * (strain + strain.T)
    atoms.set_cell(atoms.cell[:] @ (np.eye(3) + strain), scale_atoms=True)
    std = rng.uniform(*RATTLE_STD_RANGE)
    atoms.positions += rng.normal(0.0, std, size=atoms.positions.shape)


def label(atoms: Atoms) -> None:
    """Store EMT energy, forces and stress as plain info/arrays keys."""
    atoms.calc = EMT()
    energy = atoms.get_potential_energy()
    forces = atoms.get_forces()
    stress = atoms.get_stress(voigt=False)
    atoms.calc = None
    atoms.info["energy"] = float(energy)
    atoms.info["stress"] = stress
    atoms.arrays["forces"] = forces


def generate(n_structures: int, seed: int, max_atoms: Optional[int] = None) -> List[Atoms]:
    """Generate ``n_structures`` labelled structures, deterministic in ``seed``."""
    if max_atoms is None:
        max_atoms = max(bulk_cell_sizes() + slab_cell_sizes())
    if max_atoms < min(bulk_cell_sizes()):
        raise ValueError(f"--max-atoms must be at least {min(bulk_cell_sizes())}")

    kinds, weights = list(KINDS), np.array(KIND_WEIGHTS)
    if min(slab_cell_sizes()) > max_atoms:
        kinds, weights = kinds[:-1], weights[:-1]
    weights = weights / weights.sum()

    rng = np.random.default_rng(seed)
    structures = []
    for _ in range(n_structures):
        kind = kinds[rng.choice(len(kinds), p=weights)]
        if kind == "bulk":
            symbol = ELEMENTS[rng.integers(len(ELEMENTS))]
            atoms = make_bulk(rng, symbol, LATTICE_CONSTANTS[symbol], max_atoms)
        elif kind == "alloy":
            atoms = make_alloy(rng, max_atoms)
        else:
            atoms = make_slab(rng, max_atoms)
        strain_and_rattle(rng, atoms)
        label(atoms)
        structures.append(atoms)
    return structures


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-structures", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().with_name("emt_metals.xyz"),
    )
    parser.add_argument(
        "--max-atoms",
        type=int,
        default=None,
        help="largest number of atoms per structure (default: no limit, i.e. 32)",
    )
    args = parser.parse_args()

    structures = generate(args.n_structures, args.seed, args.max_atoms)
    ase.io.write(args.output, structures, format="extxyz")
    print(f"wrote {len(structures)} structures to {args.output}")


if __name__ == "__main__":
    main()
