"""The SOAP power spectrum in plain torch, equal to featomic's to spline accuracy.

featomic defines the descriptor: its radial integrals are tabulated once, when the model
is built, on a fine grid (values and exact derivatives from featomic itself) and read back
with a cubic Hermite spline; the real spherical harmonics are fixed polynomials of the
unit vector. Everything that runs per structure is then a handful of torch operations
whose gradients autograd knows, so that

- forces and stress (and, in training, their derivatives with respect to the weights) come
  from torch's own autograd, without a round trip through a C++ extension per call, and
- an exported model is plain TorchScript: it needs no extension to be loaded and its
  derivatives are right in any process.

The features are ordered as featomic's ``SoapPowerSpectrum`` after
``keys_to_properties(neighbor_1_type, neighbor_2_type)``: (species pair, l, n1, n2).
"""

from __future__ import annotations

import logging
import math
from typing import List, Optional, Tuple

import numpy as np
import torch
from metatomic.torch import NeighborListOptions

from ..spherical import SphericalHarmonics, reference_harmonics

# Grid spacing of the radial table, in Å; the cubic Hermite spline with exact derivatives
# then agrees with featomic's own splines to about 1e-9 (tested against featomic).
RADIAL_GRID_SPACING = 0.005


def featomic_hypers(radius: float, width: float, max_angular: int, max_radial: int, gaussian_width: float) -> dict:
    """featomic's parameters of the SOAP spherical expansion these features reproduce."""
    return {
        "cutoff": {"radius": radius, "smoothing": {"type": "ShiftedCosine", "width": width}},
        "density": {"type": "Gaussian", "width": gaussian_width},
        "basis": {
            "type": "TensorProduct",
            "max_angular": max_angular,
            "radial": {"type": "Gto", "max_radial": max_radial},
        },
    }


# -- radial integrals tabulated from featomic ----------------------------------------------
def tabulate_radial(hypers: dict) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Cubic polynomial of each grid interval of featomic's radial integrals.

    A neighbour on the z axis at distance r has only m = 0 components, equal to
    R_nl(r) Y_l^0(z); featomic's values and position gradients on a grid give R_nl and its
    derivative exactly at the grid points. Returns the (intervals, 4, (L+1) N) coefficients in
    the interval's coordinate t in [0, 1], the self term (the central atom's own density,
    (N,)) and the grid spacing.
    """
    import ase

    # featomic's numpy package, not featomic.torch: a training process that never loads
    # featomic's TorchScript extension exports models that do not list it as a dependency
    from featomic import SphericalExpansion

    radius = hypers["cutoff"]["radius"]
    max_angular = hypers["basis"]["max_angular"]
    intervals = max(1, math.ceil(radius / RADIAL_GRID_SPACING))
    spacing = radius / intervals
    distances = torch.arange(intervals + 1, dtype=torch.float64) * spacing
    distances[0] = 1e-6  # the direction of a neighbour at r = 0 is undefined; R is smooth there

    # a dimer on the z axis per grid point, then a lone atom for the self term
    systems = [ase.Atoms("H2", positions=[[0.0, 0.0, 0.0], [0.0, 0.0, r]]) for r in distances.tolist()]
    systems.append(ase.Atoms("H", positions=[[0.0, 0.0, 0.0]]))
    # featomic warns (through the root logger) about the grid's closest dimers, on purpose here
    close_dimers = logging.Filter()
    close_dimers.filter = lambda record: "very close to one another" not in record.getMessage()
    logging.getLogger().addFilter(close_dimers)
    try:
        expansion = SphericalExpansion(**hypers).compute(systems, gradients=["positions"])
    finally:
        logging.getLogger().removeFilter(close_dimers)

    def as_torch(array: np.ndarray) -> torch.Tensor:  # featomic's arrays are numpy's
        return torch.from_numpy(np.array(array))

    size = intervals + 1
    n_radial = expansion.block(0).values.shape[-1]
    values = torch.zeros((size, max_angular + 1, n_radial), dtype=torch.float64)
    derivatives = torch.zeros_like(values)
    self_term = torch.zeros(n_radial, dtype=torch.float64)
    on_z_axis = reference_harmonics(np.array([[0.0, 0.0, 1.0]]), max_angular)[0]
    for l in range(max_angular + 1):
        block = expansion.block({"o3_lambda": l})
        y_l0 = float(on_z_axis[l, l])
        samples, block_values = as_torch(block.samples.values).long(), as_torch(block.values)
        on_first = samples[:, 1] == 0
        dimers = on_first & (samples[:, 0] < size)
        values[samples[dimers, 0], l] = block_values[dimers, l] / y_l0
        if l == 0:
            lone = on_first & (samples[:, 0] == size)
            self_term = block_values[lone, 0].reshape(-1) / y_l0
            values[:, 0] -= self_term  # the neighbour's part only
        gradient = block.gradient("positions")
        g = as_torch(gradient.samples.values).long()  # (sample, system, atom)
        moved = (g[:, 2] == 1) & dimers[g[:, 0]]
        rows = samples[g[moved, 0], 0]
        derivatives[rows, l] = as_torch(gradient.values)[moved, 2, l] / y_l0  # d/dz of the neighbour = d/dr

    h = spacing
    v0, v1, d0, d1 = values[:-1], values[1:], derivatives[:-1] * h, derivatives[1:] * h
    cubic = torch.stack([v0, d0, 3 * (v1 - v0) - 2 * d0 - d1, 2 * (v0 - v1) + d0 + d1], dim=1)
    return cubic.reshape(intervals, 4, -1), self_term, spacing


class SoapPowerSpectrum(torch.nn.Module):
    """featomic's SOAP power spectrum, (atoms, features), computed with torch operations."""

    def __init__(
        self,
        atomic_types: List[int],
        radius: float,
        width: float,
        max_angular: int,
        max_radial: int,
        gaussian_width: float,
    ):
        super().__init__()
        hypers = featomic_hypers(radius, width, max_angular, max_radial, gaussian_width)
        cubic, self_term, spacing = tabulate_radial(hypers)
        n_types = len(atomic_types)
        type_to_index = torch.full((max(atomic_types) + 1,), -1, dtype=torch.long)
        type_to_index[torch.tensor(atomic_types)] = torch.arange(n_types)
        pairs = [(a, b) for a in range(n_types) for b in range(n_types) if a <= b]
        # featomic couples l x l -> 0 with Clebsch-Gordan coefficients: (-1)^l / sqrt(2l + 1),
        # and counts each unlike pair of neighbour types once, with a factor sqrt(2)
        coupling = [(-1.0) ** l / math.sqrt(2 * l + 1) for l in range(max_angular + 1)]
        pair_factor = [1.0 if a == b else math.sqrt(2) for a, b in pairs]

        self.cutoff = radius
        self.spacing = spacing
        self.n_types = n_types
        self.max_angular = max_angular
        self.n_radial = max_radial + 1
        self.n_features = len(pairs) * (max_angular + 1) * (max_radial + 1) ** 2
        self.type_pairs: List[Tuple[int, int]] = pairs  # the features' pairs of types, in order
        self.neighbor_list = NeighborListOptions(cutoff=radius, full_list=False, strict=True)
        # constants, rebuilt from the hyperparameters: not part of the checkpoints
        self.register_buffer("radial_cubic", cubic, persistent=False)
        # each central atom's own density: its l = 0, m = 0 part, Y_0^0 a constant
        self.register_buffer("own_density", self_term / math.sqrt(4 * math.pi), persistent=False)
        self.spherical = SphericalHarmonics(max_angular, compact=False)
        self.register_buffer("type_to_index", type_to_index, persistent=False)
        # where each feature (pair, l, n1, n2) sits among the (l, a, n1, b, n2) products
        n = max_radial + 1
        positions, weights = [], []
        for p, (a, b) in enumerate(pairs):
            for l in range(max_angular + 1):
                for n1 in range(n):
                    for n2 in range(n):
                        positions.append((((l * n_types + a) * n + n1) * n_types + b) * n + n2)
                        weights.append(pair_factor[p] * coupling[l])
        self.register_buffer("feature_positions", torch.tensor(positions), persistent=False)
        self.register_buffer("feature_weights", torch.tensor(weights, dtype=torch.float64), persistent=False)
        # (-1)^l of each harmonic's column: the sign of the reversed vector's harmonic
        degree = torch.arange(max_angular + 1, dtype=torch.float64).repeat_interleave(2 * max_angular + 1)
        self.register_buffer("harmonic_parity", 1.0 - 2.0 * (degree % 2), persistent=False)

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return [self.neighbor_list]

    def forward(
        self, types: torch.Tensor, first: torch.Tensor, second: torch.Tensor, vectors: torch.Tensor
    ) -> torch.Tensor:
        """Features (atoms, features) of atoms with ``types`` and the half list of pairs
        ``first`` -> ``second`` (numbered as ``types``) with their ``vectors``."""
        return self.power_spectrum(self.expansion(types, first, second, vectors), len(types))

    def pair_densities(self, vectors: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each pair's radial (pairs, (L+1) N) and angular (pairs, (L+1)(2L+1)) parts."""
        distances = torch.linalg.vector_norm(vectors, dim=1)
        radial, _ = self.radial(distances, False)
        harmonics, _ = self.harmonics(vectors / distances[:, None], False)
        return radial, harmonics

    def radial(self, distances: torch.Tensor, with_derivative: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The radial integrals of each pair, (pairs, (L+1) N), and with ``with_derivative``
        their derivative with respect to the distance: the cubic spline of featomic's table
        in Horner's form, one fused multiply-add per degree."""
        position = distances / self.spacing
        interval = torch.clamp(position.detach().floor().long(), 0, self.radial_cubic.shape[0] - 1)
        t = (position - interval.to(distances.dtype))[:, None]
        cubic = self.radial_cubic.to(distances.dtype).index_select(0, interval)
        values = torch.addcmul(cubic[:, 2], t, cubic[:, 3])
        values = torch.addcmul(cubic[:, 1], t, values)
        values = torch.addcmul(cubic[:, 0], t, values)
        if not with_derivative:
            return values, None
        derivative = torch.addcmul(2 * cubic[:, 2], t, 3 * cubic[:, 3])
        derivative = torch.addcmul(cubic[:, 1], t, derivative)
        return values, derivative / self.spacing

    def harmonics(self, unit: torch.Tensor, with_gradient: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The real spherical harmonics of unit vectors, (pairs, (L+1)(2L+1)), each l padded
        to 2L + 1 columns, and with ``with_gradient`` their gradient on the sphere, (pairs,
        3, (L+1)(2L+1)) (:class:`~mtt.architectures.spherical.SphericalHarmonics`)."""
        return self.spherical.with_gradient(unit, with_gradient)

    def expansion(
        self, types: torch.Tensor, first: torch.Tensor, second: torch.Tensor, vectors: torch.Tensor
    ) -> torch.Tensor:
        """Density expansion, rows (atom, l, neighbour type), columns (n, m), padded m."""
        radial, harmonics = self.pair_densities(vectors)
        species = self.type_to_index[types.long()]
        rows, slots = self.neighbor_slots(species, first, second)
        padded_radial, padded_harmonics = self.padded(radial, harmonics, rows, len(types), slots)
        return self.expansion_of_padded(padded_radial, padded_harmonics, species)

    def neighbor_slots(
        self, species: torch.Tensor, first: torch.Tensor, second: torch.Tensor
    ) -> Tuple[torch.Tensor, int]:
        """Where each directed pair and l goes among the padded neighbour slots.

        The density expansion of each (atom, l, neighbour type) is a sum over that group's
        neighbours, done as one batched matrix product over neighbour slots padded to the
        largest group. Each pair is seen from both of its atoms: returns the row of
        (both directions of every pair, l) among (atom, l, type, slot), and the number of
        slots.
        """
        centers, neighbor_types = self.directed_pairs(species, first, second)
        slot = self.slot_in_group(centers, neighbor_types, len(species))
        slots = int(slot.max()) + 1 if len(first) > 0 else 1
        return self.slot_rows(centers, neighbor_types, slot, slots), slots

    def directed_pairs(
        self, species: torch.Tensor, first: torch.Tensor, second: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Both directions of every pair: each one's central atom and neighbour type."""
        return torch.cat([first, second]), torch.cat([species[second], species[first]])

    def slot_in_group(self, centers: torch.Tensor, neighbor_types: torch.Tensor, n_atoms: int) -> torch.Tensor:
        """Each directed pair's slot among the neighbours of its central atom of the same
        type: a structure's own, whatever batch it is in."""
        groups = centers * self.n_types + neighbor_types
        counts = torch.bincount(groups, minlength=n_atoms * self.n_types)
        order = torch.argsort(groups, stable=True)
        start = torch.cumsum(counts, 0) - counts
        slot = torch.empty_like(groups)
        slot[order] = torch.arange(len(groups), device=groups.device) - start[groups[order]]
        return slot

    def slot_rows(
        self, centers: torch.Tensor, neighbor_types: torch.Tensor, slot: torch.Tensor, slots: int
    ) -> torch.Tensor:
        """The padded row (atom, l, type, slot) of each directed pair and l."""
        size = self.max_angular + 1
        l_values = torch.arange(size, device=centers.device)[None, :]
        batch = (centers[:, None] * size + l_values) * self.n_types + neighbor_types[:, None]  # (atom, l, type)
        return (batch * slots + slot[:, None]).reshape(-1)

    def padded(
        self, radial: torch.Tensor, harmonics: torch.Tensor, rows: torch.Tensor, n_atoms: int, slots: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Pair densities written into their slots, both directions: (batches, slots, N or W).

        The reversed vector has the same radial part and flips the sign of odd l. One copy
        per tensor: after a second copy into the same tensor, autograd would clear the first
        one's slots in the whole padded gradient.
        """
        width = 2 * self.max_angular + 1
        batches = n_atoms * (self.max_angular + 1) * self.n_types
        padded_radial = torch.zeros((batches * slots, self.n_radial), dtype=radial.dtype, device=radial.device)
        padded_radial.index_copy_(0, rows, torch.cat([radial, radial]).reshape(-1, self.n_radial))
        reversed_harmonics = harmonics * self.harmonic_parity.to(harmonics.dtype)
        padded_harmonics = torch.zeros((batches * slots, width), dtype=harmonics.dtype, device=harmonics.device)
        padded_harmonics.index_copy_(0, rows, torch.cat([harmonics, reversed_harmonics]).reshape(-1, width))
        return padded_radial.reshape(batches, slots, self.n_radial), padded_harmonics.reshape(batches, slots, width)

    def expansion_of_padded(
        self, padded_radial: torch.Tensor, padded_harmonics: torch.Tensor, species: torch.Tensor
    ) -> torch.Tensor:
        """The expansion, rows (atom, l, type), from :meth:`padded`'s slots, with each
        central atom's own density (l = 0, m = 0 only)."""
        n_atoms = len(species)
        width = 2 * self.max_angular + 1
        expansion = torch.bmm(padded_radial.transpose(1, 2), padded_harmonics)
        expansion = expansion.reshape(n_atoms, -1)
        l0_m0 = self.max_angular  # Y_0^0's column
        own = self.own_density.to(expansion.dtype)
        n = torch.arange(self.n_radial, device=species.device)
        columns = ((species * self.n_radial)[:, None] + n) * width + l0_m0  # (atom, l = 0, type, n, m = 0)
        expansion = expansion.scatter_add(1, columns, own.expand(n_atoms, self.n_radial))
        return expansion.reshape(n_atoms * (self.max_angular + 1) * self.n_types, self.n_radial * width)

    def power_spectrum(self, expansion: torch.Tensor, n_atoms: int) -> torch.Tensor:
        """Features (atoms, pair x l x n1 x n2) from :meth:`expansion`'s rows (in any shape
        with those rows)."""
        size = self.max_angular + 1
        # power spectrum: sum over m of products of two neighbour types' expansions, per l,
        # for all pairs of types at once (few large products beat many small ones), then
        # gathered into featomic's order (pair, l, n1, n2) for the pairs a <= b
        blocks = expansion.reshape(n_atoms * size, self.n_types * self.n_radial, 2 * self.max_angular + 1)
        products = torch.bmm(blocks, blocks.transpose(1, 2)).reshape(n_atoms, -1)
        return products.index_select(1, self.feature_positions) * self.feature_weights.to(expansion.dtype)
