"""Loss and error metrics over the terms of every target (values, forces, stress)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
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
    on_atoms: bool = False  # one value per atom (a per-atom target, or forces)
    width: int = 1  # numbers per structure or atom


def term_label(target: str, kind: str) -> str:
    """The name of a term in the loss options and the metrics: the target's name for its
    values; 'forces' and 'stress' for those of 'energy', '<target>_forces' for others'."""
    if kind == "values":
        return target
    return kind if target == "energy" else f"{target}_{kind}"


def terms_of(info: DatasetInfo) -> list[Term]:
    terms = []
    for target in info.targets.values():
        extensive = target.quantity == "energy"
        terms.append(Term(target.name, "values", target.name, target.unit, extensive, target.per_atom, target.width))
        if target.forces:
            terms.append(Term(target.name, "forces", term_label(target.name, "forces"), "eV/A", False))
        if target.stress:
            terms.append(Term(target.name, "stress", term_label(target.name, "stress"), "eV/A^3", False))
    return terms


def with_reference(term: Term, values: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The rows of ``values`` (one per structure, or per atom for forces and per-atom
    targets) of the structures that have ``term``'s reference: with datasets of different
    targets (variants), some structures of a batch lack it."""
    present = batch.present.get((term.target, term.kind))
    if present is None:
        return values
    rows = present.repeat_interleave(batch.n_atoms) if term.kind == "forces" or term.on_atoms else present
    return values[rows]


def errors(term: Term, predictions: Predictions, batch: Batch) -> torch.Tensor:
    """Prediction minus reference, flattened; per atom for energies; only of the structures
    that have the reference."""
    predicted = getattr(predictions, term.kind)[term.target]
    reference = getattr(batch, term.kind).get(term.target)
    if reference is None:  # no structure of the batch has it (variants)
        return predicted.new_zeros(0)
    difference = (predicted - reference).reshape(len(predicted), -1)
    if term.per_atom:
        difference = difference / batch.n_atoms[:, None].to(difference.dtype)
    return with_reference(term, difference, batch).reshape(-1)


def term_weights(given: dict[str, float], terms: list[Term], defaults: dict[str, float]) -> dict[str, float]:
    """Each term's weight: the user's, else the architecture's default, else 1."""
    return {t.label: given.get(t.label, defaults.get(t.label, 1.0)) for t in terms}


def describe_weights(given: dict[str, float], terms: list[Term], defaults: dict[str, float], architecture: str) -> str:
    """The weights other than 1 in a line, the architecture's defaults named as such ('' if none)."""
    weights = term_weights(given, terms, defaults)
    return ", ".join(
        f"{label} {weight:g}" + ("" if label in given else f" ({architecture}'s default)")
        for label, weight in weights.items()
        if weight != 1.0
    )


class Loss:
    """Weighted sum of per-term losses on errors divided by each term's spread."""

    def __init__(
        self,
        hypers: LossHypers,
        terms: list[Term],
        spreads: dict[str, float],
        where: str = "architecture.training.loss",
        defaults: dict[str, float] | None = None,
    ):
        """``defaults``: the architecture's weights of the terms that ``hypers`` leave out
        (``Architecture.loss_weights``); the others weigh 1."""
        labels = [t.label for t in terms]
        for option, given in (("weights", hypers.weights), ("types", hypers.types)):
            unknown = set(given) - set(labels)
            if unknown:
                from ..errors import OptionsError, did_you_mean

                name = sorted(unknown)[0]
                raise OptionsError(
                    f"'{where}.{option}.{name}' names no learned quantity." + did_you_mean(name, labels),
                    hint=f"Learned quantities: {', '.join(labels)}.",
                )
        self.terms = terms
        self.weights = term_weights(hypers.weights, terms, defaults or {})
        self.spreads = spreads
        functions = {
            "mse": torch.nn.functional.mse_loss,
            "mae": torch.nn.functional.l1_loss,
            "huber": lambda a, b, reduction="mean": torch.nn.functional.huber_loss(
                a, b, delta=hypers.huber_delta, reduction=reduction
            ),
        }
        self.functions = {t.label: functions[hypers.types.get(t.label, hypers.type)] for t in terms}

    def per_term(self, predictions: Predictions, batch: Batch) -> dict[str, torch.Tensor]:
        """Each weighted term of the loss of a batch."""
        values = {}
        for term in self.terms:
            error = errors(term, predictions, batch) / self.spreads[term.label]
            if error.numel() == 0:  # no structure of the batch has it (variants): nothing to learn
                values[term.label] = error.sum()
                continue
            values[term.label] = self.weights[term.label] * self.functions[term.label](error, torch.zeros_like(error))
        return values

    def weighted_sum(self, label: str, error: torch.Tensor) -> float:
        """The weighted sum (not mean) of one term's loss over ``error``'s elements, so that
        sums over batches and ranks give the loss of a whole set."""
        scaled = error / self.spreads[label]
        return self.weights[label] * float(self.functions[label](scaled, torch.zeros_like(scaled), reduction="sum"))

    def __call__(self, predictions: Predictions, batch: Batch) -> torch.Tensor:
        """The loss of a batch."""
        return sum(self.per_term(predictions, batch).values())


def term_shares(
    terms: list[Term],
    mine: Sequence[int],
    everyone: Sequence[int],
    n_atoms: np.ndarray,
    presence: Callable[[Term], np.ndarray | None],
    world_size: int,
) -> dict[str, float]:
    """Factors that make the average over ranks of their losses the loss of the whole batch.

    Each term is a mean over its own elements (structures, atoms, force components...), so a
    rank weighs its mean by its share of those elements in the global batch, times the number
    of ranks that the gradient average divides by. ``mine`` and ``everyone`` are the
    structures of this rank and of the global batch; their atom counts (``n_atoms``) and which
    of them have each term's reference (``presence``, None when all do) give those shares
    without reading the other ranks' structures.
    """

    def elements(term: Term, indices: Sequence[int]) -> int:
        has = presence(term)
        chosen = [i for i in indices if has is None or has[i]]
        atoms = int(n_atoms[chosen].sum()) if chosen else 0
        if term.kind == "forces":
            return 3 * atoms
        if term.kind == "stress":
            return 9 * len(chosen)
        return term.width * (atoms if term.on_atoms else len(chosen))

    shares = {}
    for term in terms:
        total = elements(term, everyone)
        shares[term.label] = world_size * elements(term, mine) / total if total else 0.0
    return shares


class Metrics:
    """Accumulates squared and absolute errors to give RMSE and MAE over a whole set, and
    each term's weighted loss as a sum over its elements, so that the loss of a set is the
    same whatever the batches and the number of ranks."""

    #: the last element of :meth:`as_tensor`: tells this layout from that of mtt 0.1.0
    #: (three sums per term, then the loss and its count), kept in mid-epoch checkpoints
    LAYOUT = 2.0

    def __init__(self, terms: list[Term]):
        self.terms = terms
        self.sums = {t.label: torch.zeros(4, dtype=torch.float64) for t in terms}
        self.loss_updates = 0  # batches whose loss was added

    def update(self, predictions: Predictions, batch: Batch, loss: "Loss | None" = None) -> None:
        with torch.no_grad():
            for term in self.terms:
                error = errors(term, predictions, batch).detach().double().cpu()
                loss_sum = loss.weighted_sum(term.label, error) if loss is not None else 0.0
                self.sums[term.label] += torch.tensor(
                    [float(error.pow(2).sum()), float(error.abs().sum()), float(error.numel()), loss_sum],
                    dtype=torch.float64,
                )
        if loss is not None:
            self.loss_updates += 1

    def as_tensor(self) -> torch.Tensor:
        """All sums in one tensor, so distributed runs can reduce them in one call."""
        parts = [self.sums[t.label] for t in self.terms]
        parts.append(torch.tensor([float(self.loss_updates), self.LAYOUT], dtype=torch.float64))
        return torch.cat(parts)

    def load_tensor(self, tensor: torch.Tensor) -> None:
        """Sums from :meth:`as_tensor` (reduced over ranks: the layout mark is then summed too)."""
        n = len(self.terms)
        if len(tensor) == 3 * n + 3 and not (len(tensor) == 4 * n + 2 and float(tensor[-1]) > 0):
            # mtt 0.1.0's layout: the loss was a mean over structures, which is not kept
            for i, term in enumerate(self.terms):
                self.sums[term.label] = torch.cat([tensor[3 * i : 3 * i + 3], tensor.new_zeros(1)]).double()
            self.loss_updates = 0
            return
        for i, term in enumerate(self.terms):
            self.sums[term.label] = tensor[4 * i : 4 * i + 4].clone().double()
        self.loss_updates = int(tensor[-2])

    def results(self) -> dict[str, float]:
        """RMSE and MAE of each term, keyed like 'energy_per_atom_rmse', and the loss."""
        out = {}
        loss = 0.0
        for term in self.terms:
            squared, absolute, count, loss_sum = self.sums[term.label].tolist()
            key = f"{term.label}_per_atom" if term.per_atom else term.label
            out[f"{key}_rmse"] = math.sqrt(squared / count) if count else math.nan
            out[f"{key}_mae"] = absolute / count if count else math.nan
            loss += loss_sum / count if count else 0.0  # a set without the target (variants)
        if self.loss_updates:
            out["loss"] = loss
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
        return math.prod(v for k, v in results.items() if k.endswith(suffix) and not math.isnan(v))
