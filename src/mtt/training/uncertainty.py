"""Last-layer uncertainties of a trained model, fitted after training (LLPR).

The covariance of the training structures' summed last-layer features is accumulated in
float64, each rank over its part of the set and summed over ranks, so that N ranks give
the numbers of one process. Its regularisation and the factor of every energy output are
then chosen on the validation set by the Gaussian negative log-likelihood of its errors:
for a regularisation, the factor that minimises it is ``sqrt(mean(error**2 / v))``, with
``v = f @ (C + r I)^-1 @ f``, and the regularisation kept is the one of the lowest
likelihood over a grid of decades.

An atom's local uncertainty has a posterior of its own: the covariance of the training
atoms' features, regularised and scaled by the same likelihood, with a structure's
variance taken as the sum of its atoms' (the structures' posterior leaves an atom's share
of the energy unconstrained where sums over a structure's atoms hardly vary).

The ensemble, whose members' forces give the force uncertainty, is sampled from a
posterior: last-layer weight deviations ``A @ z`` with ``A = (P + r I)^-1/2`` and ``z``
of identity covariance (seeded: the same on every rank). Without forces ``P`` is ``C``;
with forces it is the precision of the energies and forces both, ``C`` plus a share of
the training forces' Gram matrix of feature Jacobians (sketched from random displacements
of each structure), the share and ``r`` chosen by the likelihood of the validation force
errors under the posterior's exact variances. The energies'
posterior alone leaves the directions the forces constrained loose and ranks the force
errors poorly. The spread is then scaled, by the same likelihood, to the validation
forces' errors when the run has forces (what an MD needs), else to the energies' as the
uncertainty is. A model trained with a shallow ensemble has its trained members instead
of sampled ones, their spread scaled the same way (on the energies, by the members' own
variance).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..architectures import blame_architecture
from ..data.batching import Batch
from ..data.structure_sets import StructureSet
from ..errors import OptionsError
from .hypers import TrainerHypers
from .shallow_ensemble import has_shallow_ensemble, member_gradients, trained_directions
from .state import TrainingState
from .trainer import Trainer

#: regularisations tried, times the mean eigenvalue of the covariance
REGULARISATIONS = [10.0**k for k in range(-10, 2)]
#: shares of the forces in the posterior the ensemble is sampled from, tried
FORCE_SHARES = [0.0, 0.001, 0.01, 0.1, 0.5, 0.9]
#: random displacements per training structure for the forces' Gram matrix (see :func:`_force_gram`)
FORCE_PROBES = 8


@dataclass
class UncertaintyFit:
    """What fitting cost and found, for the summary and the log."""

    seconds: float
    features: int
    structures: int
    regularisation: float  # relative to the covariance's mean eigenvalue
    factors: dict[str, float]
    nll: float  # per validation structure, summed over the energy outputs
    members: int = 0  # of the ensemble
    on_forces: bool = False  # whether the ensemble's spread was calibrated on forces
    trained_members: bool = False  # a shallow ensemble's, rather than sampled from the posterior
    force_share: float | None = None  # of the posterior the ensemble was sampled from
    force_regularisation: float | None = None
    force_nll: float = math.nan  # per validation force component, summed over the energy outputs

    def describe(self) -> str:
        if not self.factors:
            return "not fitted: the validation set has no energies to calibrate it on"
        regularised = " (fewer than its features: regularised)" if self.structures < self.features else ""
        spread = "validation forces" if self.on_forces else "validation energies"
        return (
            f"{', '.join(self.factors)} from {self.features} last-layer features, fitted in "
            f"{self.seconds:.1f} s on {self.structures} training structures{regularised}, calibrated "
            f"on the validation set (NLL {self.nll:.3g} per structure, regularisation "
            f"{self.regularisation:g} of the mean eigenvalue); {self.describe_ensemble()}, its spread "
            f"calibrated on the {spread}"
        )

    def describe_ensemble(self) -> str:
        if self.trained_members:
            return f"the ensemble: the shallow ensemble of {self.members} trained members"
        if self.force_share is None:
            return f"an ensemble of {self.members} sampled from it"
        return (
            f"an ensemble of {self.members} sampled from the posterior of the energies and forces "
            f"(forces' share {self.force_share:g}, regularisation {self.force_regularisation:g}, "
            f"NLL {self.force_nll:.3g} per validation force component)"
        )


def energy_columns(model: torch.nn.Module) -> dict[str, int]:
    """The outputs with an uncertainty, and their column."""
    return {
        name: model.output_starts[i]
        for i, (name, uncertain) in enumerate(zip(model.output_names, model.uncertainty_names))
        if uncertain
    }


def offers_uncertainty(model: torch.nn.Module) -> bool:
    return model.uncertainty.inverse.shape[0] > 0 and bool(energy_columns(model))


def wants_uncertainty(model: torch.nn.Module, hypers: TrainerHypers, architecture: str) -> bool:
    """Whether this run fits uncertainties (``uncertainty``: null, when offered); refuses
    ``true`` for a model that cannot have them, before anything is trained."""
    if hypers.uncertainty is False:
        return False
    offered = offers_uncertainty(model)
    if hypers.uncertainty and not offered:
        if model.uncertainty.inverse.shape[0] > 0:
            why = "this model has no energy target per structure, the one kind of target it is fitted for"
        else:
            why = (
                f"the '{architecture}' architecture offers no last-layer features to take it from "
                "(Model.per_atom_outputs_and_features)"
            )
        raise OptionsError(
            f"architecture.training.uncertainty is true, but {why}.",
            hint="Use an architecture that offers them (soap_bpnn, equivariant_mp), or set uncertainty: null.",
        )
    return offered


def fit_best_model_uncertainty(
    trainer: Trainer, model: torch.nn.Module, state: TrainingState, train: StructureSet, validation: StructureSet
) -> UncertaintyFit:
    """Fit the uncertainty of the run's best model into ``state.best_model_state`` (what is
    exported); ``model`` keeps its latest weights, which a restart continues from."""
    latest = {name: value.detach().clone() for name, value in model.state_dict().items()}
    model.load_state_dict(state.best_model_state)
    fitted = fit_uncertainty(trainer, model, train, validation)
    for name, value in model.uncertainty.state_dict(prefix="uncertainty.").items():
        state.best_model_state[name] = value.detach().clone()
    model.load_state_dict(latest)
    return fitted


@dataclass
class SetFeatures:
    """This rank's part of a set, in float64."""

    rows: torch.Tensor  # (structures, features): each structure's summed last-layer features
    errors: torch.Tensor  # (structures, energy outputs)
    present: torch.Tensor  # (structures, energy outputs): whether each has a reference
    atom_covariance: torch.Tensor  # (features, features): sum over the atoms of f f^T
    #: (structures, features): sum over a structure's atoms of their features' squared
    #: components along ``atom_basis`` (when given)
    atom_projections: torch.Tensor | None


def _features_of_set(
    trainer: Trainer,
    model: torch.nn.Module,
    structures: StructureSet,
    columns: dict[str, int],
    atom_basis: torch.Tensor | None = None,
) -> SetFeatures:
    rows, errors, present, projections = [], [], [], []
    width = model.uncertainty.inverse.shape[0]
    atom_covariance = torch.zeros((width, width), dtype=torch.float64)
    model.eval()
    for read in trainer.loader(structures, model).batches(trainer.set_batches(structures)):
        batch = trainer.batch(read)
        flat = batch.flat
        with torch.no_grad(), blame_architecture(trainer.architecture):
            raw, features = model.per_atom_outputs_and_features(flat)
            per_atom = model.composition(flat.types, raw)
        n = len(batch)
        atoms = features.double()
        atom_covariance += (atoms.T @ atoms).cpu()
        summed = torch.zeros((n, features.shape[1]), dtype=torch.float64, device=features.device)
        rows.append(summed.index_add(0, flat.structure, atoms).cpu())
        if atom_basis is not None:
            squares = (atoms @ atom_basis.to(atoms.device)) ** 2
            projections.append(torch.zeros_like(summed).index_add(0, flat.structure, squares).cpu())
        totals = torch.zeros((n, per_atom.shape[1]), dtype=torch.float64, device=per_atom.device)
        totals = totals.index_add(0, flat.structure, per_atom.double()).cpu()
        error, has = [], []
        for name, column in columns.items():
            target = name.removeprefix("mtt::")
            reference = batch.values.get(target)
            if reference is None:
                error.append(torch.zeros(n, dtype=torch.float64))
                has.append(torch.zeros(n, dtype=torch.bool))
                continue
            error.append(totals[:, column] - reference[:, 0].double().cpu())
            has.append(batch.has(target, "values").cpu())
        errors.append(torch.stack(error, 1))
        present.append(torch.stack(has, 1))
    if not rows:
        empty = torch.zeros((0, width), dtype=torch.float64)
        return SetFeatures(
            empty,
            torch.zeros((0, len(columns)), dtype=torch.float64),
            torch.zeros((0, len(columns)), dtype=torch.bool),
            atom_covariance,
            empty if atom_basis is not None else None,
        )
    return SetFeatures(
        torch.cat(rows),
        torch.cat(errors),
        torch.cat(present),
        atom_covariance,
        torch.cat(projections) if atom_basis is not None else None,
    )


def _likelihood_sums(
    projected: torch.Tensor, eigenvalues: torch.Tensor, scale: float, errors: torch.Tensor, present: torch.Tensor
) -> torch.Tensor:
    """Per regularisation and output, this rank's sum of error^2 / v, of log v and the
    count, where ``v = sum_j projected_j / (eigenvalue_j + regularisation * scale)``."""
    sums = torch.zeros((len(REGULARISATIONS), errors.shape[1], 3), dtype=torch.float64)
    if not len(projected):
        return sums
    for k, relative in enumerate(REGULARISATIONS):
        variances = (projected / (eigenvalues + relative * scale)).sum(1).clamp(min=1e-300)
        for c in range(errors.shape[1]):
            mask = present[:, c]
            v, e = variances[mask], errors[mask, c]
            sums[k, c] = torch.tensor([float((e**2 / v).sum()), float(torch.log(v).sum()), float(mask.sum())])
    return sums


def _most_likely(sums: torch.Tensor) -> tuple[int, list[float] | None, float]:
    """The regularisation (its index) of the lowest negative log-likelihood summed over the
    outputs, each output's factor ``sqrt(mean(error^2 / v))`` there, and that likelihood
    per structure; no factors when no output has errors."""
    best, best_nll, best_factors = len(REGULARISATIONS) - 1, math.inf, None
    for k in range(len(REGULARISATIONS)):
        factors, nll = [], 0.0
        for c in range(sums.shape[1]):
            ratio, logs, n = sums[k, c].tolist()
            if n == 0 or ratio <= 0:
                factors.append(0.0)
                continue
            alpha2 = ratio / n
            nll += 0.5 * (n * math.log(2 * math.pi * alpha2) + logs + n) / n
            factors.append(math.sqrt(alpha2))
        if nll < best_nll and any(factors):
            best, best_nll, best_factors = k, nll, factors
    return best, best_factors, best_nll


def _eigen(covariance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Eigenvalues (clamped at 0), eigenvectors and mean eigenvalue (1 when all vanish)."""
    eigenvalues, vectors = torch.linalg.eigh(covariance)
    eigenvalues = eigenvalues.clamp(min=0.0)
    return eigenvalues, vectors, float(eigenvalues.mean()) or 1.0


def fit_uncertainty(
    trainer: Trainer, model: torch.nn.Module, train: StructureSet, validation: StructureSet
) -> UncertaintyFit:
    """Fit ``model.uncertainty`` (its best weights loaded) on every rank."""
    started = time.monotonic()
    environment = trainer.environment
    columns = energy_columns(model)
    train_set = _features_of_set(trainer, model, train, columns)
    features = train_set.rows
    covariance = environment.all_reduce_sum(features.T @ features)
    count = int(environment.all_reduce_sum(torch.tensor([float(len(features))], dtype=torch.float64))[0])
    eigenvalues, vectors, scale = _eigen(covariance)
    atom_eigenvalues, atom_vectors, atom_scale = _eigen(environment.all_reduce_sum(train_set.atom_covariance))
    validation_set = _features_of_set(trainer, model, validation, columns, atom_basis=atom_vectors)
    rows, errors, present = validation_set.rows, validation_set.errors, validation_set.present
    projected = (rows @ vectors) ** 2 if len(rows) else rows
    sums = environment.all_reduce_sum(_likelihood_sums(projected, eigenvalues, scale, errors, present))
    best, best_factors, best_nll = _most_likely(sums)
    local_sums = _likelihood_sums(validation_set.atom_projections, atom_eigenvalues, atom_scale, errors, present)
    local_best, local_factors, _ = _most_likely(environment.all_reduce_sum(local_sums))
    local_relative = REGULARISATIONS[local_best]
    relative = REGULARISATIONS[best]
    inverse = (vectors / (eigenvalues + relative * scale)) @ vectors.T
    energies = (eigenvalues, vectors, scale, relative)
    ensemble = _fit_ensemble(trainer, model, train, validation, columns, covariance, energies)
    factors = best_factors or [0.0] * len(columns)
    on_forces = bool((ensemble.spread_sums[:, 1] > 0).any())
    if ensemble.trained and not on_forces:
        # without forces, the spread that fits the energies is the members' own
        ensemble.spread_sums = environment.all_reduce_sum(_energy_spread_sums(rows, errors, present, ensemble.members))
    with torch.no_grad():
        model.uncertainty.inverse.copy_(inverse)
        model.uncertainty.factors.zero_()
        model.uncertainty.local_inverse.copy_(
            (atom_vectors / (atom_eigenvalues + local_relative * atom_scale)) @ atom_vectors.T
        )
        model.uncertainty.local_factors.zero_()
        for column, factor in zip(columns.values(), local_factors or []):
            model.uncertainty.local_factors[column] = factor
        size = ensemble.members[0].shape[1]
        members = torch.zeros((model.n_columns, len(eigenvalues), size), dtype=torch.float64)
        for c, (column, factor) in enumerate(zip(columns.values(), factors)):
            model.uncertainty.factors[column] = factor
            ratio, n = ensemble.spread_sums[c].tolist()
            spread = math.sqrt(ratio / n) if n > 0 and ratio > 0 and factor > 0 else factor
            members[column] = spread * ensemble.members[c]
        model.uncertainty.ensemble = members.to(model.uncertainty.inverse.device)
    return UncertaintyFit(
        time.monotonic() - started,
        covariance.shape[0],
        count,
        relative,
        {name.removeprefix("mtt::"): factor for name, factor in zip(columns, best_factors or [])},
        best_nll if best_factors else math.nan,
        size,
        on_forces,
        ensemble.trained,
        ensemble.force_share,
        ensemble.force_regularisation,
        ensemble.force_nll,
    )


@dataclass
class FittedEnsemble:
    """The ensemble before its spread is scaled: every energy output's unit-scale members
    (features, members), and this set's sums for the spread (see :func:`_force_sums`)."""

    members: list[torch.Tensor]
    spread_sums: torch.Tensor  # (outputs, 2)
    trained: bool
    force_share: float | None = None  # of the posterior sampled, when chosen on forces
    force_regularisation: float | None = None
    force_nll: float = math.nan  # per validation force component


def _fit_ensemble(
    trainer: Trainer,
    model: torch.nn.Module,
    train: StructureSet,
    validation: StructureSet,
    columns: dict[str, int],
    covariance: torch.Tensor,
    energies: tuple[torch.Tensor, torch.Tensor, float, float],
) -> FittedEnsemble:
    """A shallow ensemble's trained members, or members sampled from the last-layer
    posterior. With forces, that posterior is the one of the energies and the forces both
    (what training fitted), ``(1 - s) C + s G tr(C) / tr(G)`` with ``G`` the training
    forces' sum of ``j j^T``: of the forces' shares ``s`` and regularisations, the one whose
    variances give the validation force errors the highest likelihood; else, or with
    ``uncertainty_forces: false``, the energies' (``energies``: eigenvalues, eigenvectors,
    mean eigenvalue, regularisation)."""
    environment = trainer.environment
    if has_shallow_ensemble(model):
        members = [trained_directions(model, column) for column in columns.values()]
        _, spread = _force_sums(trainer, model, validation, columns, [], [members])
        return FittedEnsemble(members, environment.all_reduce_sum(spread)[0], trained=True)
    generator = torch.Generator().manual_seed(trainer.seed)
    normal = _centred_normal(covariance.shape[0], trainer.hypers.uncertainty_ensemble_size, generator)
    eigenvalues, vectors, scale, relative = energies
    energies_members = [_root(eigenvalues, vectors, relative * scale) @ normal] * len(columns)

    def energies_posterior() -> FittedEnsemble:
        _, spread = _force_sums(trainer, model, validation, columns, [], [energies_members])
        return FittedEnsemble(energies_members, environment.all_reduce_sum(spread)[0], trained=False)

    if not (trainer.info.needs_forces and trainer.hypers.uncertainty_forces):
        return energies_posterior()
    gram = environment.all_reduce_sum(_force_gram(trainer, model, train, columns))
    if float(gram.trace()) <= 0:
        return energies_posterior()
    weight = float(covariance.trace()) / float(gram.trace())
    posteriors = [_eigen((1 - share) * covariance + share * weight * gram) for share in FORCE_SHARES]
    ensembles = [
        [_root(values, basis, relative * mean) @ normal] * len(columns)
        for values, basis, mean in posteriors
        for relative in REGULARISATIONS
    ]
    likelihood, spread = _force_sums(trainer, model, validation, columns, posteriors, ensembles)
    likelihood, spread = environment.all_reduce_sum(likelihood), environment.all_reduce_sum(spread)
    chosen, chosen_nll = None, math.inf
    for p in range(len(posteriors)):
        k, factors, nll = _most_likely(likelihood[p])
        if factors is not None and nll < chosen_nll:
            chosen, chosen_nll = (p, k), nll
    if chosen is None:  # no validation forces: the members' spread has nothing to fit either
        return FittedEnsemble(energies_members, torch.zeros_like(spread[0]), trained=False)
    p, k = chosen
    index = p * len(REGULARISATIONS) + k
    return FittedEnsemble(ensembles[index], spread[index], False, FORCE_SHARES[p], REGULARISATIONS[k], chosen_nll)


def _root(eigenvalues: torch.Tensor, vectors: torch.Tensor, regularisation: float) -> torch.Tensor:
    """The symmetric square root of the regularised inverse: unlike the eigenvectors
    themselves, it does not depend on the basis eigh picks in a degenerate subspace, so
    every rank has the same."""
    return (vectors / torch.sqrt(eigenvalues + regularisation)) @ vectors.T


def _force_jacobians(
    trainer: Trainer, model: torch.nn.Module, structures: StructureSet, columns: dict[str, int]
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per batch of a set: the Jacobian of each structure's summed last-layer features
    against its atoms' positions, one row per force component (components, features); each
    energy output's force errors (components, outputs) and whether each has a reference.
    Float64, on the CPU. One backward pass a feature."""
    model.eval()
    for read in trainer.loader(structures, model).batches(trainer.set_batches(structures)):
        batch = trainer.batch(read)
        flat, positions = batch.flat, batch.positions[0]
        components = 3 * len(positions)
        errors, present = [], []
        with blame_architecture(trainer.architecture):
            raw, features = model.per_atom_outputs_and_features(flat)
            per_atom = model.composition(flat.types, raw)
            # a structure's features depend on its atoms alone: one sum over the batch will do
            jacobian = member_gradients(features.sum(0, keepdim=True), [positions])[0]
            for name, column in columns.items():
                target = name.removeprefix("mtt::")
                reference = batch.forces.get(target)
                if reference is None:
                    errors.append(torch.zeros(components, dtype=torch.float64))
                    present.append(torch.zeros(components, dtype=torch.bool))
                    continue
                predicted = -torch.autograd.grad(per_atom[:, column].sum(), positions, retain_graph=True)[0]
                errors.append((predicted.double() - reference.double()).reshape(-1).cpu())
                present.append(batch.has(target, "forces").cpu()[flat.structure.cpu()].repeat_interleave(3))
        yield jacobian.double().reshape(len(jacobian), -1).T.cpu(), torch.stack(errors, 1), torch.stack(present, 1)


def _force_gram(
    trainer: Trainer, model: torch.nn.Module, structures: StructureSet, columns: dict[str, int]
) -> torch.Tensor:
    """This rank's estimate of the sum of ``j j^T`` over the set's force components with a
    reference (``j`` a row of the Jacobian ``J`` of a structure's summed last-layer features
    against its positions): what the training forces tell of the last layer.

    Sketched: ``(J r)(J r)^T`` averaged over :data:`FORCE_PROBES` random displacements ``r``
    of each structure (every component +-1, so ``E[r r^T] = I``) is unbiased, and summed over
    a training set as close to the exact sum as the posterior needs, at a few backward
    passes a batch instead of one a feature. ``J r`` is the derivative, along ``r``, of
    ``J^T u`` against ``u``: a second backward pass, which every architecture that trains
    on forces has. The displacements depend on the seed and the structure's index alone,
    so any number of ranks sum the same."""
    model.eval()
    width = model.uncertainty.inverse.shape[0]
    gram = torch.zeros((width, width), dtype=torch.float64)
    # halves of the evaluation batches, the training batch's size: the second-order graph is
    # as large as a training step's
    items = [half for batch in trainer.set_batches(structures) for half in _halves(batch) if half]
    for indices, read in zip(items, trainer.loader(structures, model).batches(items)):
        batch = trainer.batch(read)
        flat, positions = batch.flat, batch.positions[0]
        with blame_architecture(trainer.architecture):
            features = model.per_atom_outputs_and_features(flat)[1]
            cotangent = torch.zeros_like(features, requires_grad=True)
            pulled = torch.autograd.grad(features, positions, cotangent, create_graph=True)[0]
            displacements = [_displacements(trainer.seed, index, len(s.types)) for index, s in zip(indices, read)]
            kept = _has_forces(batch, columns)
            for probe in torch.cat(displacements).to(positions).unbind(-1):
                along = torch.autograd.grad(pulled, cotangent, probe, retain_graph=True)[0].detach().double().cpu()
                summed = torch.zeros((flat.n_structures, width), dtype=torch.float64)
                summed = summed.index_add(0, flat.structure.cpu(), along)[kept]
                gram += summed.T @ summed / FORCE_PROBES
    return gram


def _halves(indices: list[int]) -> tuple[list[int], list[int]]:
    middle = (len(indices) + 1) // 2
    return indices[:middle], indices[middle:]


def _displacements(seed: int, index: int, atoms: int) -> torch.Tensor:
    """(atoms, 3, probes) of +-1: the random displacements of one structure for the sketch."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randint(0, 2, (atoms, 3, FORCE_PROBES), generator=generator, dtype=torch.float64) * 2 - 1


def _has_forces(batch: Batch, columns: dict[str, int]) -> torch.Tensor:
    """(structures,): whether a structure of the batch has reference forces for an energy output."""
    has = torch.zeros(len(batch), dtype=torch.bool)
    for name in columns:
        has |= batch.has(name.removeprefix("mtt::"), "forces").cpu()
    return has


def _force_sums(
    trainer: Trainer,
    model: torch.nn.Module,
    structures: StructureSet,
    columns: dict[str, int],
    posteriors: list[tuple[torch.Tensor, torch.Tensor, float]],
    ensembles: list[list[torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's sums over the set's force components, per energy output: for each
    posterior (eigenvalues, eigenvectors, mean eigenvalue), those of
    :func:`_likelihood_sums` with ``v`` a component's variance under it; for each ensemble
    (every output's unit-scale members, (features, members)), error**2 / (the members'
    variance) and the count, whose ratio is the square of the spread that fits best."""
    likelihood = torch.zeros((len(posteriors), len(REGULARISATIONS), len(columns), 3), dtype=torch.float64)
    spread = torch.zeros((len(ensembles), len(columns), 2), dtype=torch.float64)
    if not trainer.info.needs_forces:
        return likelihood, spread
    for jacobian, errors, present in _force_jacobians(trainer, model, structures, columns):
        for p, (eigenvalues, vectors, scale) in enumerate(posteriors):
            projected = (jacobian @ vectors) ** 2
            likelihood[p] += _likelihood_sums(projected, eigenvalues, scale, errors, present)
        for e, members in enumerate(ensembles):
            for c, unit in enumerate(members):
                variance = (jacobian @ unit).var(1)
                mask = present[:, c] & (variance > 0)
                spread[e, c, 0] += float((errors[mask, c] ** 2 / variance[mask]).sum())
                spread[e, c, 1] += float(mask.sum())
    return likelihood, spread


def _centred_normal(features: int, members: int, generator: torch.Generator) -> torch.Tensor:
    """(features, members) draws to scale into an ensemble: their sample covariance over
    the members is the identity in expectation, like independent standard normals', but
    along ``members - 1`` orthonormal random directions, which makes it less noisy, and the
    members sum to exactly zero, so that the ensemble's mean is the model's own prediction."""
    rotations = [
        torch.linalg.qr(torch.randn((features, features), generator=generator, dtype=torch.float64))[0]
        for _ in range(-(-(members - 1) // features))
    ]
    directions = torch.cat(rotations, 1)[:, : members - 1]
    # an orthonormal basis of the members' zero-sum vectors, in random orientation
    start = torch.cat([torch.ones((members, 1), dtype=torch.float64),
                       torch.randn((members, members - 1), generator=generator, dtype=torch.float64)], 1)  # fmt: skip
    zero_sum = torch.linalg.qr(start)[0][:, 1:]
    return math.sqrt(features) * directions @ zero_sum.T


def _energy_spread_sums(
    rows: torch.Tensor, errors: torch.Tensor, present: torch.Tensor, directions: list[torch.Tensor]
) -> torch.Tensor:
    """This rank's part, per energy output, of the sum over the set's structures of
    error**2 / (the unit-scale ensemble's variance of their energies), and their count:
    :func:`_force_sums` for the energies of a run without forces."""
    sums = torch.zeros((len(directions), 2), dtype=torch.float64)
    for c, members in enumerate(directions):
        variance = (rows @ members).var(1)
        mask = present[:, c] & (variance > 0)
        sums[c, 0] = float((errors[mask, c] ** 2 / variance[mask]).sum())
        sums[c, 1] = float(mask.sum())
    return sums


def calibration_figures(errors: torch.Tensor, deviations: torch.Tensor) -> dict[str, float]:
    """How well predicted standard deviations describe the errors of a set: the Spearman
    rank correlation of |error| and deviation, the mean Gaussian negative log-likelihood,
    and the miscalibration area (between the fraction of errors inside each central
    interval of the predicted Gaussians and that interval's probability; 0 is perfect)."""
    errors, deviations = errors.double().reshape(-1), deviations.double().reshape(-1).clamp(min=1e-300)

    def ranks(values: torch.Tensor) -> torch.Tensor:
        result = torch.empty_like(values)
        result[torch.argsort(values)] = torch.arange(len(values), dtype=values.dtype)
        return result

    a, b = ranks(errors.abs()), ranks(deviations)
    a, b = a - a.mean(), b - b.mean()
    spearman = float((a * b).sum() / torch.sqrt((a * a).sum() * (b * b).sum()).clamp(min=1e-300))
    nll = float((0.5 * torch.log(2 * math.pi * deviations**2) + errors**2 / (2 * deviations**2)).mean())
    probabilities = torch.linspace(0.0, 1.0, 101, dtype=torch.float64)
    widths = torch.special.ndtri((1 + probabilities[1:-1]) / 2)
    inside = (errors.abs()[None, :] <= widths[:, None] * deviations[None, :]).double().mean(1)
    observed = torch.cat([torch.zeros(1, dtype=torch.float64), inside, torch.ones(1, dtype=torch.float64)])
    area = float(torch.trapezoid((observed - probabilities).abs(), probabilities))
    return {"spearman": spearman, "nll": nll, "miscalibration_area": area}


def binned_calibration(
    errors: torch.Tensor, deviations: torch.Tensor, bins: int = 10
) -> list[tuple[float, float, int]]:
    """(mean predicted deviation, observed RMSE, structures) in bins of equal counts of
    the predicted deviation: a calibrated uncertainty has the two equal in every bin. A bin
    holds at least five structures, or its RMSE says little."""
    order = torch.argsort(deviations.reshape(-1))
    result = []
    for chunk in torch.tensor_split(order, max(1, min(bins, len(order) // 5))):
        if len(chunk):
            predicted = float(torch.sqrt((deviations.reshape(-1)[chunk].double() ** 2).mean()))
            observed = float(torch.sqrt((errors.reshape(-1)[chunk].double() ** 2).mean()))
            result.append((predicted, observed, len(chunk)))
    return result
