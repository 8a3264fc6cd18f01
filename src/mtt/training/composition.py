"""Fit the per-element baseline and the spread of every term before training."""

from __future__ import annotations

import torch

from ..data.dataset import DatasetInfo
from ..data.readers import Structure
from ..errors import OptionsError
from .loss import Term


def fit_baseline(
    model: torch.nn.Module,
    structures: list[Structure],
    info: DatasetInfo,
    terms: list[Term],
    fixed: dict[str, dict[int, float]],
    scale_targets: bool | str,
) -> dict[str, float]:
    """Least-squares per-element values of each target, stored in the model.

    Returns the spread of each loss term, which normalises the loss: the standard
    deviation of the per-atom values after the baseline, and the RMS of the reference
    forces and stress. Energies of a target with forces are divided by the force RMS
    (times 1 Å) instead, so per-atom energy and force errors weigh in the same eV units:
    dividing energies by their much smaller spread lets them drown the forces. With
    ``scale_targets`` the network output is scaled by the per-atom spread, or with
    ``"forces"`` by the RMS of the forces (times 1 Å) for energies learned with forces.
    """
    types = info.atomic_types
    counts = torch.zeros((len(structures), len(types)), dtype=torch.float64)
    column = {t: i for i, t in enumerate(types)}
    for row, structure in enumerate(structures):
        for atomic_type, n in zip(*torch.unique(structure.types, return_counts=True)):
            counts[row, column[int(atomic_type)]] = float(n)
    n_atoms = counts.sum(dim=1)

    spreads = {}
    for index, target in enumerate(info.targets.values()):
        values = torch.cat([s.values[target.name] for s in structures]).double()
        weights = torch.zeros(len(types), dtype=torch.float64)
        given = fixed.get(target.name, {})
        unknown = set(given) - set(types)
        if unknown:
            raise OptionsError(
                f"'architecture.training.fixed_composition_weights.{target.name}' has atomic "
                f"numbers {sorted(unknown)} that are not in the training set {types}."
            )
        free = [i for i, t in enumerate(types) if t not in given]
        for atomic_type, value in given.items():
            weights[column[atomic_type]] = value
        rest = values - counts @ weights
        if free:
            solution = torch.linalg.lstsq(counts[:, free], rest[:, None], driver="gelsd").solution
            weights[free] = solution[:, 0]
        residual = (values - counts @ weights) / n_atoms
        spread = float(residual.std()) if len(residual) > 1 else 0.0
        spread = spread if spread > 1e-12 else 1.0
        model.composition.weights[:, index] = weights
        scale = spread if scale_targets else 1.0
        if scale_targets == "forces" and target.forces:
            reference = torch.cat([s.forces[target.name].reshape(-1) for s in structures])
            rms = float(reference.pow(2).mean().sqrt())
            scale = rms if rms > 1e-12 else spread
        model.composition.scales[index] = scale
        spreads[target.name] = spread

    result = {}
    for term in terms:
        if term.kind == "values":
            result[term.label] = spreads[term.target]
        else:
            reference = torch.cat([getattr(s, term.kind)[term.target].reshape(-1) for s in structures])
            rms = float(reference.pow(2).mean().sqrt())
            result[term.label] = rms if rms > 1e-12 else 1.0
    for target in info.targets.values():
        if target.forces:
            force_label = next(t.label for t in terms if t.target == target.name and t.kind == "forces")
            value_label = next(t.label for t in terms if t.target == target.name and t.kind == "values")
            result[value_label] = result[force_label]
    return result
