"""Shallow ensembles trained with the model: the members attached to it, and the term of
the loss that trains them.

Each member is the architecture's own last layer plus a trainable deviation ``D_m``
(:class:`mtt.architectures.base.ShallowEnsemble`), centred over the members: the mean of
the members' energies ``E_m = E + f @ D_m`` is the model's energy, which the usual loss
terms train as before. The extra term scores the members' spread against each
structure's error, and that of their forces ``-dE_m/dx`` against each force component's
error, by the Gaussian negative log-likelihood or the continuous ranked probability score
(Kellner and Ceriotti, arXiv 2402.16621). It trains the members alone: through the trunk
it would fit the spread by bending the features instead of the errors (on the xTB ethanol
of ``benchmarks/uncertainty.py``, the forces' RMSE went from 67 to 390 meV/Å and more),
and without the forces the members' force spread says little of the force errors (rank
correlation 0.14 there). So the model's own weights are those of a run without it. Like
every other term, each part is a mean over its elements (structures, force components)
that takes the distributed share of the energy's or the forces' own term, so that N ranks
train what one process trains.
"""

from __future__ import annotations

import math

import torch

from ..architectures.base import ShallowEnsemble
from ..data.batching import Batch
from ..errors import OptionsError
from .hypers import ShallowEnsembleHypers
from .loss import Term, errors, with_reference
from .predictions import Predictions

WHERE = "architecture.training.shallow_ensemble"


def attach_shallow_ensemble(model: torch.nn.Module, hypers: ShallowEnsembleHypers, architecture: str) -> None:
    """Give ``model`` the trainable members of ``hypers``; refuses a model without
    last-layer features or without an energy per structure, before anything is trained."""
    features = model.uncertainty.inverse.shape[0]
    if features == 0:
        raise OptionsError(
            f"{WHERE} needs the model's last-layer features, and the '{architecture}' architecture offers "
            "none (Model.per_atom_outputs_and_features).",
            hint="Use an architecture that offers them (soap_bpnn, equivariant_mp), or remove shallow_ensemble.",
        )
    if not any(model.uncertainty_names):
        raise OptionsError(
            f"{WHERE} trains members of energies per structure, and this model has no such target.",
            hint="Remove shallow_ensemble, or learn an energy per structure.",
        )
    like = model.uncertainty.inverse
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), like.dtype)
    members = ShallowEnsemble(model.n_columns, features, hypers.members)
    model.shallow_ensemble = members.to(device=like.device, dtype=dtype)


def has_shallow_ensemble(model: torch.nn.Module) -> bool:
    return isinstance(getattr(model, "shallow_ensemble", None), ShallowEnsemble)


def trained_directions(model: torch.nn.Module, column: int) -> torch.Tensor:
    """The centred members' deviations of output ``column`` in energy per summed feature,
    (features, members), in float64: the ensemble before its spread is calibrated."""
    deviations = model.shallow_ensemble.deviations[column].detach().double()
    scale = model.composition.scales[column].double()
    return (deviations - deviations.mean(1, keepdim=True)).cpu() * scale.cpu()


def gaussian_nll(error: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """Per element, the Gaussian negative log-likelihood of ``error`` without its constant."""
    return 0.5 * (error**2 / variance + torch.log(variance))


def gaussian_crps(error: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """Per element, the continuous ranked probability score of a centred Gaussian of
    ``variance`` for ``error`` (in the error's units; 0 for a sharp exact prediction)."""
    sigma = torch.sqrt(variance)
    z = error / sigma
    density = torch.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    return sigma * (z * (2 * torch.special.ndtr(z) - 1) + 2 * density - 1 / math.sqrt(math.pi))


class EnsembleLossTerm:
    """The shallow ensemble's term of the loss: for every energy target with members, a part
    for its values and one for its forces (when trained and ``forces`` is on), keyed by the
    label of the target's own term of that kind, whose distributed share each takes."""

    #: variances below this (in units of the normalised error, squared) are raised to it:
    #: members that collapse onto one another would make the likelihood infinite
    FLOOR = 1e-12

    def __init__(self, hypers: ShallowEnsembleHypers, terms: list[Term], spreads: dict[str, float]):
        self.terms = [t for t in terms if t.kind == "values" or (t.kind == "forces" and hypers.forces)]
        self.weight = hypers.weight
        self.score = {"nll": gaussian_nll, "crps": gaussian_crps}[hypers.loss]
        self.spreads = spreads

    def per_term(self, predictions: Predictions, batch: Batch) -> dict[str, torch.Tensor]:
        """Each part's weighted mean score over the elements that have its reference."""
        values = {}
        for term in self.terms:
            members = predictions.members.get(term.target)
            if members is None:
                continue
            error = errors(term, predictions, batch) / self.spreads[term.label]
            if error.numel() == 0:  # no structure of the batch has it (variants)
                values[term.label] = error.sum()
                continue
            if term.kind == "forces":
                gradients = member_gradients(members, batch.positions, create_graph=True)
                deviations = -torch.cat(gradients, 1).permute(1, 2, 0)  # (atoms, 3, members)
            elif term.per_atom:  # normalised as the values term's errors are
                deviations = members / batch.n_atoms[:, None].to(members.dtype)
            else:
                deviations = members
            deviations = with_reference(term, deviations, batch) / self.spreads[term.label]
            variance = deviations.reshape(error.numel(), -1).var(1).clamp(min=self.FLOOR)
            values[term.label] = self.weight * self.score(error.detach(), variance).mean()
        return values


def member_gradients(
    members: torch.Tensor, inputs: list[torch.Tensor], create_graph: bool = False
) -> list[torch.Tensor]:
    """The gradient of each ensemble member's energies, ``members`` (structures, members),
    summed over structures, against each of ``inputs``: (members, *input's shape) each.
    One backward pass a member through the retained graph: on batches of structures this
    is several times faster than one batched pass (``is_grads_batched``), whose batching
    rules for the gathers and scatters of the models expand every member's cotangents.
    ``create_graph``: differentiable, for a loss of the members' forces."""
    columns = [
        torch.autograd.grad(members[:, k].sum(), inputs, retain_graph=True, create_graph=create_graph)
        for k in range(members.shape[1])
    ]
    return [torch.stack([column[i] for column in columns]) for i in range(len(inputs))]
