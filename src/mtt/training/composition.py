"""Fit the per-element baseline and the spread of every term before training."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..architectures.base import output_name
from ..data.dataset import DatasetInfo
from ..data.structure_sets import StructureSet
from ..distributed import DistributedEnvironment, share
from ..errors import OptionsError
from .loss import Term

#: structures whose statistics are summed at once: bounds the memory of a pass
CHUNK = 65536


def _summed(
    structures: StructureSet,
    environment: DistributedEnvironment,
    chunk_sums: Callable[[int, int], torch.Tensor],
    size: int,
) -> torch.Tensor:
    """The sum over every chunk of the set of ``chunk_sums(start, stop)`` (a float64 vector):
    each rank sums its own chunks, then the ranks' sums are added."""
    starts = share(list(range(0, len(structures), CHUNK)), environment.rank, environment.world_size)
    total = torch.zeros(size, dtype=torch.float64)
    for start in starts:
        total += chunk_sums(start, min(start + CHUNK, len(structures)))
    return environment.all_reduce_sum(total)


def fit_baseline(
    model: torch.nn.Module,
    structures: StructureSet,
    info: DatasetInfo,
    terms: list[Term],
    fixed: dict[str, dict[int, float]],
    scale_targets: bool | str,
    environment: DistributedEnvironment,
) -> dict[str, float]:
    """Least-squares per-element values of each target, stored in the model.

    Returns the spread of each loss term, which normalises the loss: the standard
    deviation of the per-atom values after the baseline, and the RMS of the reference
    forces and stress. Energies of a target with forces are divided by the force RMS
    (times 1 Å) instead, so per-atom energy and force errors weigh in the same eV units:
    dividing energies by their much smaller spread lets them drown the forces. With
    ``scale_targets`` the network output is scaled by the per-atom spread, or with
    ``"forces"`` by the RMS of the forces (times 1 Å) for energies learned with forces.

    A per-atom target's baseline is the mean of each element's values; a vector has none
    (a constant vector would not rotate with the structure), and its spread is its RMS.

    The structures are never held at once: the least-squares problem is solved from its
    normal equations (atom counts are integers, so their products are exact), summed
    chunk by chunk and over ranks, and the spreads from sums of squares.
    """
    types = info.atomic_types
    targets = list(info.targets.values())
    squared = [(t.target, t.kind) for t in terms if t.kind != "values"]
    n = len(types)
    # the layout of the sums of the first pass: name -> (offset, size)
    # per target: structures with it count, as some lack it when datasets with different
    # targets make the set (variants)
    layout: dict[str, tuple[int, int]] = {}
    size = 0
    for target in targets:
        width = target.width
        parts = [("gram", n * n), ("atoms", n), ("count", 1)]
        parts += [("sums", n * width), ("squares", n * width)] if target.per_atom else [("rhs", n * width)]
        for part, length in parts:
            layout[f"{part}.{target.name}"] = (size, length)
            size += length
    layout["squared"] = (size, 2 * len(squared))
    size += 2 * len(squared)

    def first_pass(start: int, stop: int) -> torch.Tensor:
        chunk = structures.statistics(types, start, stop)
        counts = chunk.counts
        total = np.zeros(size)

        def put(name: str, value: np.ndarray) -> None:
            offset, length = layout[name]
            total[offset : offset + length] = value.reshape(-1)

        for target in targets:
            name = target.name
            if name not in chunk.values and name not in chunk.atom_sums:  # no structure of the chunk has it
                put(f"atoms.{name}", np.zeros(n))
                continue
            has = chunk.present.get(name, np.ones(len(counts), dtype=bool))
            mine = counts[has]
            put(f"gram.{name}", mine.T @ mine)
            put(f"atoms.{name}", mine.sum(axis=0))
            put(f"count.{name}", np.array([float(has.sum())]))
            if target.per_atom:
                put(f"sums.{name}", chunk.atom_sums[name])
                put(f"squares.{name}", chunk.atom_squares[name])
            else:
                put(f"rhs.{name}", mine.T @ _columns(chunk.values[name])[has])
        put("squared", np.array([v for key in squared for v in chunk.squares.get(key, (0.0, 0))], dtype=np.float64))
        return torch.from_numpy(total)

    sums = _summed(structures, environment, first_pass, size).numpy()

    def part(name: str, width: int = 1) -> np.ndarray:
        offset, length = layout[name]
        return sums[offset : offset + length].reshape(-1, width) if width > 1 else sums[offset : offset + length]

    weights_of = {}
    for target in targets:
        name, width = target.name, target.width
        gram = part(f"gram.{name}").reshape(n, n)
        atoms_of_type = part(f"atoms.{name}")
        given = fixed.get(name, {})
        unknown = set(given) - set(types)
        if unknown:
            raise OptionsError(
                f"'architecture.training.fixed_composition_weights.{name}' has atomic "
                f"numbers {sorted(unknown)} that are not in the training set {types}."
            )
        weights = np.zeros((n, width))
        if target.vector:
            weights_of[name] = weights
            continue
        free = [i for i, t in enumerate(types) if t not in given]
        for atomic_type, value in given.items():
            weights[types.index(atomic_type)] = value
        if target.per_atom:  # each element's mean
            element_sums = part(f"sums.{name}").reshape(n, width)
            for i in free:
                if atoms_of_type[i] > 0:
                    weights[i] = element_sums[i] / atoms_of_type[i]
        elif free:
            rhs = part(f"rhs.{name}").reshape(n, width)
            right = rhs[free] - gram[np.ix_(free, range(n))] @ weights
            matrix, vector = torch.from_numpy(gram[np.ix_(free, free)]), torch.from_numpy(right)
            solution = torch.linalg.lstsq(matrix, vector, rcond=1e-12, driver="gelsd").solution
            weights[free] = solution.numpy()
        weights_of[name] = weights
    rms = {}
    offset = layout["squared"][0]
    for k, key in enumerate(squared):
        total, count = sums[offset + 2 * k], sums[offset + 2 * k + 1]
        rms[key] = float(np.sqrt(total / count)) if count else 0.0

    per_structure = [t for t in targets if not t.per_atom]

    def second_pass(start: int, stop: int) -> torch.Tensor:
        chunk = structures.statistics(types, start, stop)
        atoms = chunk.counts.sum(axis=1)[:, None]
        parts = []
        for target in per_structure:
            if target.name not in chunk.values:  # no structure of the chunk has it
                parts += [0.0, 0.0]
                continue
            residual = (_columns(chunk.values[target.name]) - chunk.counts @ weights_of[target.name]) / atoms
            residual = residual[chunk.present.get(target.name, np.ones(len(atoms), dtype=bool))]
            parts += [residual.sum(), np.square(residual).sum()]
        return torch.tensor(parts, dtype=torch.float64)

    residuals = _summed(structures, environment, second_pass, 2 * len(per_structure)).numpy()
    spreads = {}
    for target in targets:
        atoms_of_type = part(f"atoms.{target.name}")
        if target.per_atom:  # from each element's sums: sum over atoms of (value - the element's)^2
            weights = weights_of[target.name]
            element_sums = part(f"sums.{target.name}").reshape(n, -1)
            element_squares = part(f"squares.{target.name}").reshape(n, -1)
            total = float((element_sums - atoms_of_type[:, None] * weights).sum())
            squares = float((element_squares - 2 * weights * element_sums + atoms_of_type[:, None] * weights**2).sum())
            count = float(atoms_of_type.sum()) * target.width
        else:
            index = per_structure.index(target)
            total, squares = residuals[2 * index], residuals[2 * index + 1]
            count = float(part(f"count.{target.name}")[0]) * target.width
        if target.vector:  # about zero, not about the mean: no direction is preferred
            variance = squares / count if count else 0.0
        else:
            variance = (squares - total * total / count) / (count - 1) if count > 1 else 0.0
        spread = float(np.sqrt(max(variance, 0.0)))
        spread = spread if spread > 1e-12 else 1.0
        start = model.output_starts[model.output_names.index(output_name(target.name))]  # a fine-tuned model has more
        columns = slice(start, start + target.width)
        model.composition.weights[:, columns] = torch.from_numpy(weights_of[target.name])
        scale = spread if scale_targets else 1.0
        if scale_targets == "forces" and target.forces:
            force_rms = rms[(target.name, "forces")]
            scale = force_rms if force_rms > 1e-12 else spread
        model.composition.scales[columns] = scale
        spreads[target.name] = spread

    result = {}
    for term in terms:
        if term.kind == "values":
            result[term.label] = spreads[term.target]
        else:
            value = rms[(term.target, term.kind)]
            result[term.label] = value if value > 1e-12 else 1.0
    for target in info.targets.values():
        if target.forces:
            force_label = next(t.label for t in terms if t.target == target.name and t.kind == "forces")
            value_label = next(t.label for t in terms if t.target == target.name and t.kind == "values")
            result[value_label] = result[force_label]
    return result


def _columns(values: np.ndarray) -> np.ndarray:
    """Per-structure values as (structures, width): converted datasets store scalars as (k,)."""
    return values.reshape(len(values), -1)
