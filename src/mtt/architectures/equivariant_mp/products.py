"""The many-body product of each layer: symmetric polynomials of the one-particle basis.

Each atom's one-particle basis A (per channel: the harmonics of degree 0 to L, natural
parity) is raised to products of up to ``correlation`` factors and projected onto the
equivariant features of each output degree, as in ACE (Drautz 2019) and MACE's product
block (Batatia et al., NeurIPS 2022). The projections are the symmetric, equivariant
tensors U[i_1 ... i_nu, M]: a basis of them is built once, numerically, by coupling the
degrees of the factors two by two with Clebsch-Gordan coefficients through every
intermediate degree, symmetrising over the factors and keeping an orthonormal basis of
what that spans. The weights of the basis functions are learned per element and channel.

Each monomial of A that the basis uses is a prefix (its first ``correlation - 1`` factors)
times a last factor. The prefixes are built for every atom at once, one factor at a time,
sharing the products of their first factors where that saves work; the last factor is
never multiplied out: one batched product per element contracts the prefixes with the
weighted basis, laid out by (last factor, output component, prefix), and a weighted sum
over the last factors gives the atoms' features. The monomials themselves, several times
more numerous than the prefixes, are never stored, nor their gradients. The weights are
contracted with the basis once per element and step, so that no per-atom copy of the basis
is ever made.

No ``from __future__ import annotations`` here: TorchScript compiles :class:`SymmetricProduct`.
"""

import itertools
import math
from typing import List, Tuple

import numpy as np
import torch

from ..spherical import clebsch_gordan


def _coupling_trees(degrees: tuple, out: int) -> List[np.ndarray]:
    """Every coupling of factors of ``degrees`` (in this order) into degree ``out``, each
    as a tensor over the factors' m and the output's M: left to right, through every
    intermediate degree."""
    partial = [(degrees[0], np.eye(2 * degrees[0] + 1))]  # (degree, tensor over m_1 ... m_k, mu)
    for position, degree in enumerate(degrees[1:], start=2):
        reachable = out + sum(degrees[position:])  # the rest can still bring it down to ``out``
        grown = []
        for current, tensor in partial:
            for coupled in range(abs(current - degree), min(current + degree, reachable) + 1):
                coupling = clebsch_gordan(current, degree, coupled)
                grown.append((coupled, np.tensordot(tensor, coupling, axes=([-1], [0]))))
        partial = grown
    return [tensor for degree, tensor in partial if degree == out]


def symmetric_basis(max_l: int, correlation: int, out: int) -> np.ndarray:
    """An orthonormal basis of the symmetric equivariant tensors of ``correlation`` factors
    of the one-particle basis (degrees 0 to ``max_l``, natural parity, (max_l + 1)^2
    components) onto degree ``out`` (natural parity): (functions, components^correlation,
    2 out + 1), possibly with no function."""
    size = (max_l + 1) ** 2
    shape = (size,) * correlation + (2 * out + 1,)
    candidates = []
    for degrees in itertools.combinations_with_replacement(range(max_l + 1), correlation):
        if (sum(degrees) + out) % 2:  # parity: the product of the factors' (-1)^l must be (-1)^out
            continue
        for tree in _coupling_trees(degrees, out):
            full = np.zeros(shape)
            full[tuple(slice(l * l, (l + 1) ** 2) for l in degrees) + (slice(None),)] = tree
            symmetric = sum(
                np.transpose(full, order + (correlation,)) for order in itertools.permutations(range(correlation))
            )
            candidates.append(symmetric.reshape(-1))
    if not candidates:
        return np.zeros((0,) + shape)
    _, singular, rows = np.linalg.svd(np.stack(candidates), full_matrices=False)
    kept = rows[singular > 1e-8 * singular[0]]
    kept[np.abs(kept) < 1e-12] = 0.0
    return kept.reshape((-1,) + shape)


def _multiplicity(indices: tuple) -> int:
    """How many orderings of ``indices`` are distinct: a symmetric tensor's weight on a monomial."""
    return math.factorial(len(indices)) // math.prod(math.factorial(indices.count(i)) for i in set(indices))


def _plan(padded: List[tuple], size: int, shared: bool) -> List[Tuple[List[Tuple[int, int]], bool]]:
    """The levels that build the products of components ``padded`` (each as many factors
    long) one factor at a time: for each level, (row of the level before, new factor) of
    each of its rows, and whether the rows of the level before must be gathered (they are
    the level's own order otherwise). Level 0 is the components (and the constant 1); the
    last level is the products in their order. ``shared``: each level holds the distinct
    prefixes only, computed once for every product that starts with them."""
    correlation = len(padded[0])
    plan = []
    if not shared:  # every product's prefix in its own row: level 1 is a gather of components
        for length in range(2, correlation + 1):
            parents = [factors[0] if length == 2 else row for row, factors in enumerate(padded)]
            plan.append(([(parent, factors[length - 1]) for parent, factors in zip(parents, padded)], length == 2))
        return plan
    previous = {(component,): component for component in range(size + 1)}
    for length in range(2, correlation + 1):
        prefixes = [factors[:length] for factors in padded]
        level = prefixes if length == correlation else sorted(set(prefixes))
        rows = [(previous[prefix[:-1]], prefix[-1]) for prefix in level]
        plan.append((rows, length == 2 or [parent for parent, _ in rows] != list(range(len(rows)))))
        previous = {prefix: row for row, prefix in enumerate(level)}
    return plan


def _cheaper_plan(padded: List[tuple], size: int) -> List[Tuple[List[Tuple[int, int]], bool]]:
    """Shared prefixes save multiplications where many products share them, and cost one more
    gather per level where few do: the plan with fewer rows gathered and multiplied."""

    def row_operations(plan: List[Tuple[List[Tuple[int, int]], bool]]) -> int:
        return sum(len(rows) * (3 if gathers else 2) for rows, gathers in plan)

    return min((_plan(padded, size, shared) for shared in (True, False)), key=row_operations)


class SymmetricProduct(torch.nn.Module):
    """Per atom and channel, the learned symmetric polynomials of its one-particle basis A
    onto degrees 0 to ``out_l``: B = sum over nu <= correlation of W_nu(element) U_nu A^nu.

    A symmetric tensor U contracted with nu copies of A is a combination of the monomials
    A_i1 ... A_inu with i1 <= ... <= inu, each with the number of its distinct orderings:
    the product is the sum, over the monomials that some basis function uses, of each
    element's weighted basis times the monomial's prefix times its last factor.
    """

    # for TorchScript, which cannot infer the type of an empty list (no level: correlation 1 or 2)
    level_sizes: List[int]
    gathers_parents: List[bool]

    def __init__(self, max_l: int, out_l: int, correlation: int, channels: int, n_elements: int):
        super().__init__()
        size = (max_l + 1) ** 2
        outputs = (out_l + 1) ** 2
        bases = {  # (nu, l) -> (functions, components^nu, 2l + 1)
            (nu, l): symmetric_basis(max_l, nu, l) for nu in range(1, correlation + 1) for l in range(out_l + 1)
        }
        # the monomials that some function uses, order by order
        monomials: List[tuple] = []
        for nu in range(1, correlation + 1):
            for indices in itertools.combinations_with_replacement(range(size), nu):
                if any(
                    np.abs(basis[(slice(None),) + indices]).max() > 1e-12
                    for (n, _), basis in bases.items()
                    if n == nu and len(basis)
                ):
                    monomials.append(indices)
        functions = sum(len(basis) for basis in bases.values())
        combined = np.zeros((functions, len(monomials), outputs))
        row = 0
        for (nu, l), basis in bases.items():
            for function in basis:
                for column, indices in enumerate(monomials):
                    if len(indices) == nu:
                        combined[row, column, l * l : (l + 1) ** 2] = _multiplicity(indices) * function[indices]
                # each function's weight normalised to start of order one
                combined[row] *= 3.0
                row += 1
        # each monomial (padded with a constant 1, component ``size``, to ``correlation``
        # factors) is a prefix times a last factor; the basis is laid out by (last factor,
        # output component, prefix), so that one batched product applies it to the prefixes
        padded = [tuple(indices) + (size,) * (correlation - len(indices)) for indices in monomials]
        # (prefix, last factor) of each monomial; correlation 1: the prefix is the constant
        split = [(factors[:-1] or (size,), factors[-1]) for factors in padded]
        prefixes = sorted({prefix for prefix, _ in split})
        lasts = sorted({last for _, last in split})
        prefix_row = {prefix: row for row, prefix in enumerate(prefixes)}
        last_row = {last: row for row, last in enumerate(lasts)}
        by_last_factor = np.zeros((functions, len(lasts), outputs, len(prefixes)))
        for column, (prefix, last) in enumerate(split):
            by_last_factor[:, last_row[last], :, prefix_row[prefix]] += combined[:, column, :]
        self.channels = channels
        self.outputs = outputs
        self.n_lasts = len(lasts)
        self.n_prefixes = len(prefixes)
        # the prefixes are built one factor at a time: each level multiplies rows of the
        # level before by one more factor
        plan = _cheaper_plan(prefixes, size)
        self.level_sizes = [len(level) for level, _ in plan]
        self.gathers_parents = [gather for _, gather in plan]
        parents = [parent for level, _ in plan for parent, _ in level]
        new_factors = [factor for level, _ in plan for _, factor in level]
        self.register_buffer("parents", torch.tensor(parents, dtype=torch.long), persistent=False)
        self.register_buffer("new_factors", torch.tensor(new_factors, dtype=torch.long), persistent=False)
        self.register_buffer("singles", torch.tensor([f[0] for f in prefixes], dtype=torch.long), persistent=False)
        self.register_buffer("lasts", torch.tensor(lasts, dtype=torch.long), persistent=False)
        self.register_buffer(
            "basis",
            torch.tensor(by_last_factor.reshape(functions, -1)).to(torch.get_default_dtype()),
            persistent=False,
        )
        self.weights = torch.nn.Parameter(torch.randn(n_elements, functions, channels) / functions)

    def forward(self, basis: torch.Tensor, counts: List[int]) -> torch.Tensor:
        """``basis`` (components, channels, atoms), atoms sorted by element with ``counts``
        of each; returns (channels, (out_l + 1)^2, atoms) in the same order."""
        # (channels, components, atoms): each factor of the prefixes is a gather of rows of
        # atoms, and the batched products' operands and gradients keep atoms innermost
        factors = torch.nn.functional.pad(basis.transpose(0, 1), (0, 0, 0, 1), value=1.0)
        prefixes = factors.index_select(1, self.singles) if len(self.level_sizes) == 0 else factors
        first = 0
        for size, gathers in zip(self.level_sizes, self.gathers_parents):
            if gathers:
                prefixes = prefixes.index_select(1, self.parents[first : first + size])
            prefixes = prefixes * factors.index_select(1, self.new_factors[first : first + size])
            first += size
        lasts = factors.index_select(1, self.lasts)
        outputs: List[torch.Tensor] = []
        per_element = zip(torch.split(prefixes, counts, dim=2), torch.split(lasts, counts, dim=2))
        for element, (own, last) in enumerate(per_element):
            if counts[element] == 0:
                continue
            weighted = (self.weights[element].t() @ self.basis.to(basis.dtype)).reshape(
                self.channels, self.n_lasts * self.outputs, self.n_prefixes
            )
            # (channels, last factors, outputs, atoms), summed over the last factors
            per_last = torch.bmm(weighted, own).reshape(self.channels, self.n_lasts, self.outputs, -1)
            outputs.append((per_last * last[:, :, None, :]).sum(1))
        return torch.cat(outputs, dim=2)  # (channels, outputs, atoms)
