"""Loss and error metrics over the terms of every target (values, forces, stress)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..data.batching import Batch
from ..data.dataset import DatasetInfo
from .hypers import LossHypers
from .predictions import Predictions


@dataclass
class Term:
    """One thing compared with the reference: a target's values, forces or stress."""

    target: str
    kind: str  # "values", "forces" or "stress"
    label: str  # name in logs and metrics: energy, forces, stress, or target names
    unit: str
    per_atom: bool  # values of energy-like targets are compared per atom


def terms_of(info: DatasetInfo) -> list[Term]:
    terms = []
    for target in info.targets.values():
        extensive = target.quantity == "energy"
        terms.append(Term(target.name, "values", target.name, target.unit, extensive))
        prefix = "" if target.name == "energy" else f"{target.name}_"
        if target.forces:
            terms.append(Term(target.name, "forces", f"{prefix}forces", "eV/A", False))
        if target.stress:
            terms.append(Term(target.name, "stress", f"{prefix}stress", "eV/A^3", False))
    return terms


def errors(term: Term, predictions: Predictions, batch: Batch) -> torch.Tensor:
    """Prediction minus reference, flattened; per atom for energies."""
    predicted = getattr(predictions, term.kind)[term.target]
    reference = getattr(batch, term.kind)[term.target]
    difference = (predicted - reference).reshape(len(predicted), -1)
    if term.per_atom:
        difference = difference / batch.n_atoms[:, None].to(difference.dtype)
    return difference.reshape(-1)


class Loss:
    """Weighted sum of per-term losses on errors divided by each term's spread."""

    def __init__(
        self,
        hypers: LossHypers,
        terms: list[Term],
        spreads: dict[str, float],
        where: str = "architecture.training.loss.weights",
    ):
        unknown = set(hypers.weights) - {t.label for t in terms}
        if unknown:
            from ..errors import OptionsError, did_you_mean

            name = sorted(unknown)[0]
            raise OptionsError(
                f"'{where}.{name}' names no learned quantity.{did_you_mean(name, [t.label for t in terms])}",
                hint=f"Learned quantities: {', '.join(t.label for t in terms)}.",
            )
        self.terms = terms
        self.weights = {t.label: hypers.weights.get(t.label, 1.0) for t in terms}
        self.spreads = spreads
        self.function = {
            "mse": torch.nn.functional.mse_loss,
            "mae": torch.nn.functional.l1_loss,
            "huber": lambda a, b: torch.nn.functional.huber_loss(a, b, delta=hypers.huber_delta),
        }[hypers.type]

    def per_term(self, predictions: Predictions, batch: Batch) -> dict[str, torch.Tensor]:
        """Each weighted term of the loss of a batch."""
        values = {}
        for term in self.terms:
            error = errors(term, predictions, batch) / self.spreads[term.label]
            values[term.label] = self.weights[term.label] * self.function(error, torch.zeros_like(error))
        return values

    def __call__(self, predictions: Predictions, batch: Batch) -> torch.Tensor:
        """The loss of a batch."""
        return sum(self.per_term(predictions, batch).values())


def term_shares(terms: list[Term], mine: list, everyone: list, world_size: int) -> dict[str, float]:
    """Factors that make the average over ranks of their losses the loss of the whole batch.

    Each term is a mean over its own elements (structures, force components...), so a rank
    weighs its mean by its share of those elements in the global batch, times the number of
    ranks that the gradient average divides by.
    """

    def elements(term: Term, structures: list) -> int:
        if term.kind == "forces":
            return 3 * sum(len(s) for s in structures)
        return len(structures) * (9 if term.kind == "stress" else 1)

    return {t.label: world_size * elements(t, mine) / elements(t, everyone) for t in terms}


class Metrics:
    """Accumulates squared and absolute errors to give RMSE and MAE over a whole set."""

    def __init__(self, terms: list[Term]):
        self.terms = terms
        self.sums = {t.label: torch.zeros(3, dtype=torch.float64) for t in terms}
        self.loss_sum = 0.0
        self.loss_count = 0

    def update(self, predictions: Predictions, batch: Batch, loss: float | None = None) -> None:
        with torch.no_grad():
            for term in self.terms:
                error = errors(term, predictions, batch).detach().double().cpu()
                self.sums[term.label] += torch.stack(
                    [error.pow(2).sum(), error.abs().sum(), torch.tensor(float(error.numel()))]
                )
        if loss is not None:
            self.loss_sum += loss * len(batch)
            self.loss_count += len(batch)

    def as_tensor(self) -> torch.Tensor:
        """All sums in one tensor, so distributed runs can reduce them in one call."""
        parts = [self.sums[t.label] for t in self.terms]
        parts.append(torch.tensor([self.loss_sum, float(self.loss_count), 0.0], dtype=torch.float64))
        return torch.cat(parts)

    def load_tensor(self, tensor: torch.Tensor) -> None:
        for i, term in enumerate(self.terms):
            self.sums[term.label] = tensor[3 * i : 3 * i + 3].clone()
        self.loss_sum, self.loss_count = float(tensor[-3]), int(tensor[-2])

    def results(self) -> dict[str, float]:
        """RMSE and MAE of each term, keyed like 'energy_per_atom_rmse'."""
        out = {}
        for term in self.terms:
            squared, absolute, count = self.sums[term.label].tolist()
            key = f"{term.label}_per_atom" if term.per_atom else term.label
            out[f"{key}_rmse"] = math.sqrt(squared / count) if count else math.nan
            out[f"{key}_mae"] = absolute / count if count else math.nan
        if self.loss_count:
            out["loss"] = self.loss_sum / self.loss_count
        return out

    def units(self) -> dict[str, str]:
        units = {"loss": ""}
        for term in self.terms:
            key = f"{term.label}_per_atom" if term.per_atom else term.label
            unit = f"{term.unit}/atom" if term.per_atom else term.unit
            units[f"{key}_rmse"] = units[f"{key}_mae"] = unit
        return units

    def selection_figure(self, metric: str) -> float:
        """The figure that picks the best model (lower is better)."""
        results = self.results()
        if metric == "loss":
            return results["loss"]
        suffix = "_rmse" if metric == "rmse_prod" else "_mae"
        return math.prod(v for k, v in results.items() if k.endswith(suffix))
