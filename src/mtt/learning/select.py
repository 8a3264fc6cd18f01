"""Which frames of the MD are labelled: the most uncertain above the threshold, no two of
them near-duplicates (the MD visits the same region many frames in a row).

Molecules and clusters are compared by their sorted interatomic distances, whatever the
order or orientation of their atoms. Periodic cells are not: the distribution of a bulk
cell's distances hardly changes from one thermal frame to another, so frames of unrelated
MD runs would look alike. Two frames of a cell are near-duplicates only when they come
from the same MD run and its atoms moved little between them (minimum images, the drift
of the whole cell removed)."""

from __future__ import annotations

import ase
import numpy as np
from vesin import NeighborList

#: the interatomic distances compared between structures: the first shells
FINGERPRINT_CUTOFF = 6.0


def fingerprint(atoms: ase.Atoms) -> tuple:
    """A periodic cell's MD run, atoms and positions; else the structure's elements with
    their counts and its sorted interatomic distances up to the cutoff per element pair
    (the same for any order of its atoms)."""
    if atoms.pbc.any():
        return ("cell", atoms.info.get("start"), tuple(atoms.numbers)), atoms.get_scaled_positions(), atoms.cell[:]
    indices, distances = NeighborList(cutoff=FINGERPRINT_CUTOFF, full_list=False).compute(
        atoms.positions, np.asarray(atoms.cell), bool(atoms.pbc.any()), quantities="Pd"
    )
    numbers = atoms.numbers
    pairs = np.sort(numbers[indices], axis=1)
    by_pair = {}
    for pair in {tuple(p) for p in pairs.tolist()}:
        chosen = (pairs[:, 0] == pair[0]) & (pairs[:, 1] == pair[1])
        by_pair[pair] = np.sort(distances[chosen])
    composition = tuple(sorted(zip(*np.unique(numbers, return_counts=True))))
    return composition, by_pair


def difference(a: tuple, b: tuple) -> float:
    """RMS difference (Å) of two fingerprints: of a cell's atoms' positions, of a molecule's
    distances (a pair with more distances under the cutoff in one of them is compared on the
    common ones); ``inf`` for other atoms or, for cells, another MD run."""
    if a[0][0] == "cell" or b[0][0] == "cell":
        if a[0] != b[0] or a[0][1] is None:
            return float("inf")
        shift = b[1] - a[1]
        shift -= np.round(shift)  # the nearest image of each atom
        moved = shift @ a[2]
        moved -= moved.mean(0)  # the drift of the whole cell is no change of structure
        return float(np.sqrt((moved**2).sum(1).mean()))
    if a[0] != b[0] or a[1].keys() != b[1].keys():
        return float("inf")
    squares, count = 0.0, 0
    for pair, distances in a[1].items():
        other = b[1][pair]
        n = min(len(distances), len(other))
        squares += float(((distances[:n] - other[:n]) ** 2).sum())
        count += n
    return float(np.sqrt(squares / count)) if count else float("inf")


def select(candidates: list[ase.Atoms], threshold: float, max_count: int, min_difference: float) -> list[ase.Atoms]:
    """Up to ``max_count`` of ``candidates`` (their info's force_uncertainty above
    ``threshold``), the most uncertain first, skipping near-duplicates of those taken."""
    above = [a for a in candidates if a.info["force_uncertainty"] > threshold]
    above.sort(key=lambda a: -a.info["force_uncertainty"])
    chosen, prints = [], []
    for atoms in above:
        if len(chosen) == max_count:
            break
        mark = fingerprint(atoms)
        if all(difference(mark, other) >= min_difference for other in prints):
            chosen.append(atoms)
            prints.append(mark)
    return chosen
