"""The pieces of an equivariant message-passing layer, in plain torch.

Features are (atoms, channels, components), the components those of degrees l = 0 to L of
natural parity ((-1)^l: scalars, vectors, rank-2 tensors...), laid out as the harmonics of
:class:`~mtt.architectures.spherical.SphericalHarmonics` (l^2 + l + m). Atoms come sorted
by element, with the count of each, so that what depends on an element (the product's
weights, the skip connection) works on one slice per element.

Inside a layer, the one-particle basis is (components, channels, atoms) and the product's
features (channels, components, atoms): with atoms innermost from the interaction's mixing
to the product and on to the next linear map, every batched product, and each of its
gradients, reads rows of unit stride (a gradient that comes with its batch axis innermost
makes ``bmm`` slow, on two threads most of all).

No ``from __future__ import annotations`` here: TorchScript compiles these modules.
"""

import math
from typing import List, Tuple

import numpy as np
import torch

from ..spherical import clebsch_gordan
from .radial import RadialNetwork


def degree_of_components(max_l: int) -> List[int]:
    """The degree l of each component of features up to ``max_l``."""
    return [l for l in range(max_l + 1) for _ in range(2 * l + 1)]


class EquivariantLinear(torch.nn.Module):
    """Mixes channels, with one weight matrix per degree (which keeps the features equivariant)."""

    def __init__(self, channels_in: int, channels_out: int, max_l: int):
        super().__init__()
        self.channels_in = channels_in
        self.weights = torch.nn.Parameter(torch.randn(max_l + 1, channels_in, channels_out))
        self.register_buffer("degree", torch.tensor(degree_of_components(max_l)), persistent=False)

    def component_weights(self) -> torch.Tensor:
        """Each component's matrix, its degree's: (components, in, out)."""
        return self.weights.index_select(0, self.degree) / math.sqrt(self.channels_in)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.bmm(features.permute(2, 0, 1), self.component_weights()).permute(1, 2, 0)

    def from_channels_first(self, features: torch.Tensor) -> torch.Tensor:
        """The same from features (channels, components, atoms), e.g. the product's."""
        return torch.bmm(self.component_weights().transpose(1, 2), features.transpose(0, 1)).permute(2, 1, 0)


class ElementLinear(torch.nn.Module):
    """An :class:`EquivariantLinear` with weights of its own for each element (atoms sorted by element)."""

    def __init__(self, channels: int, max_l: int, n_elements: int):
        super().__init__()
        self.channels = channels
        self.weights = torch.nn.Parameter(torch.randn(n_elements, max_l + 1, channels, channels))
        self.register_buffer("degree", torch.tensor(degree_of_components(max_l)), persistent=False)

    def forward(self, features: torch.Tensor, counts: List[int]) -> torch.Tensor:
        # (elements, components, in, out)
        weights = self.weights.index_select(1, self.degree) / math.sqrt(self.channels)
        outputs: List[torch.Tensor] = []
        # (components, out, atoms) for each element, as the product's features after their linear map
        for element, (own, weight) in enumerate(zip(torch.split(features, counts), weights.unbind(0))):
            if counts[element] > 0:
                outputs.append(torch.bmm(weight.transpose(1, 2), own.permute(2, 1, 0)))
        return torch.cat(outputs, dim=2).permute(2, 1, 0)


def coupling_paths(in_l: int, max_l: int) -> List[Tuple[int, int, int]]:
    """The paths (l_in, l_harmonic, l_out) of a message: features of degree l_in times the
    harmonics of the bond of degree l_harmonic, coupled to l_out <= max_l of natural parity."""
    return [
        (l_in, l_sh, l_out)
        for l_in in range(in_l + 1)
        for l_sh in range(max_l + 1)
        for l_out in range(abs(l_in - l_sh), min(l_in + l_sh, max_l) + 1)
        if (l_in + l_sh + l_out) % 2 == 0
    ]


class Interaction(torch.nn.Module):
    """Each atom's one-particle basis A: the sum over neighbours j of R_p(r_ij) times the
    features of j coupled with the harmonics of the bond, path by path (MACE's
    channel-wise tensor product, as NequIP's convolution), divided by the average number
    of neighbours, then mixed across channels and paths for each degree up to ``max_l``."""

    def __init__(self, in_l: int, max_l: int, channels: int, radial_functions: int, radial_hidden: List[int]):
        super().__init__()
        self.channels = channels
        self.in_l = in_l
        self.max_l = max_l
        paths = coupling_paths(in_l, max_l)
        self.n_paths = len(paths)
        n_harmonics = (max_l + 1) ** 2
        # the coupling of every input component with the harmonics onto every path's
        # components, one block of columns per path (input degree 0: the harmonics themselves)
        n_columns = sum(2 * l_out + 1 for _, _, l_out in paths)
        coupling = np.zeros(((in_l + 1) ** 2, n_harmonics, n_columns))
        path_of_column: List[int] = []
        for p, (l_in, l_sh, l_out) in enumerate(paths):
            width = 2 * l_out + 1
            column = len(path_of_column)
            rows, of_bond = slice(l_in * l_in, (l_in + 1) ** 2), slice(l_sh * l_sh, (l_sh + 1) ** 2)
            coupling[rows, of_bond, column : column + width] = clebsch_gordan(l_in, l_sh, l_out)
            path_of_column += [p] * width
        # (harmonics, input components x columns): contracted with each pair's harmonics
        # first, whatever the channels; a constant, rebuilt from the hyperparameters
        self.register_buffer(
            "coupling", torch.tensor(coupling).permute(1, 0, 2).reshape(n_harmonics, -1), persistent=False
        )
        self.n_columns = n_columns
        self.radial = RadialNetwork(radial_functions, radial_hidden, channels * self.n_paths)
        # which path's radial weight each column takes, as a 0/1 matrix (a product, cheaper than a gather)
        spread = torch.zeros((self.n_paths, len(path_of_column)), dtype=torch.float64)
        spread[torch.tensor(path_of_column), torch.arange(len(path_of_column))] = 1.0
        self.register_buffer("path_to_columns", spread, persistent=False)
        # the mixing of each output degree across channels and paths: one matrix per degree,
        # rows (channel, path), the degrees' blocks one after the other
        paths_per_degree = [sum(1 for _, _, l_out in paths if l_out == l) for l in range(max_l + 1)]
        self.mixing = torch.nn.Parameter(torch.randn(sum(paths_per_degree) * channels, channels))
        # applied to every output component at once, as one batched product: each component
        # takes its degree's paths (padded to the largest count with a zero column, index
        # ``n_columns``) and its degree's matrix (padded with a zero row, index ``len(mixing)``),
        # scaled by 1 / sqrt(channels x paths of the degree)
        self.padded_paths = max(paths_per_degree)
        columns: List[int] = []
        for l_out in range(max_l + 1):
            for m in range(2 * l_out + 1):
                mine = [p for p, (_, _, l) in enumerate(paths) if l == l_out]
                starts = [path_of_column.index(p) for p in mine]
                columns += [start + m for start in starts] + [n_columns] * (self.padded_paths - len(mine))
        self.register_buffer("component_columns", torch.tensor(columns), persistent=False)
        rows: List[int] = []
        scales: List[float] = []
        first_row = 0
        for count in paths_per_degree:
            for channel in range(channels):
                rows += [first_row + channel * count + p for p in range(count)]
                rows += [len(self.mixing)] * (self.padded_paths - count)
                scales += [1.0 / math.sqrt(channels * count)] * self.padded_paths
            first_row += count * channels
        self.register_buffer("degree_rows", torch.tensor(rows), persistent=False)
        self.register_buffer("degree_scales", torch.tensor(scales, dtype=torch.float64)[:, None], persistent=False)
        self.register_buffer(
            "degree_of_component",
            torch.tensor([l for l in range(max_l + 1) for _ in range(2 * l + 1)]),
            persistent=False,
        )

    def forward(
        self,
        features: torch.Tensor,
        harmonics: torch.Tensor,
        radial_basis: torch.Tensor,
        first: torch.Tensor,
        second: torch.Tensor,
        average_neighbors: torch.Tensor,
    ) -> torch.Tensor:
        weights = self.radial(radial_basis).reshape(-1, self.channels, self.n_paths)
        weights = weights @ self.path_to_columns.to(weights.dtype)  # (half pairs, channels, columns)
        # per pair and channel, the sender's features coupled with the bond's harmonics,
        # every path's components one after the other, in one product
        per_pair = (harmonics @ self.coupling.to(harmonics.dtype)).reshape(len(harmonics), -1, self.n_columns)
        coupled = torch.bmm(features.index_select(0, second), per_pair)
        # the radial basis is the half list's: both directions of a pair take its weights,
        # one direction at a time (a broadcast over both would sum its gradient over the
        # directions with a slow reduction; a concatenation's second derivative would copy
        # the pairs' tensor)
        half = len(weights)
        outgoing, incoming = coupled.reshape(2, half, self.channels * self.n_columns).unbind(0)
        weights = weights.reshape(half, -1)
        # the sum over neighbours on rows (atoms, channels x columns): its gradient, a
        # gather of rows, copies whole rows
        summed = torch.zeros((len(features), weights.shape[1]), dtype=weights.dtype, device=weights.device)
        summed = summed.index_add(0, first[:half], outgoing * weights).index_add(0, first[half:], incoming * weights)
        summed = summed.reshape(len(features), self.channels, self.n_columns)
        # (components, channels, channels x padded paths) times (components, channels x padded paths, atoms)
        n_components = len(self.degree_of_component)
        padded = torch.nn.functional.pad(summed, (0, 1)).index_select(2, self.component_columns)
        padded = padded.reshape(len(features), self.channels, n_components, self.padded_paths).permute(2, 1, 3, 0)
        padded = padded.reshape(n_components, self.channels * self.padded_paths, len(features))
        mixing = torch.nn.functional.pad(self.mixing, (0, 0, 0, 1)).index_select(0, self.degree_rows)
        # the mean over neighbours too: the sum divided by the average number of neighbours
        mixing = mixing * (self.degree_scales.to(mixing.dtype) / average_neighbors)
        mixing = mixing.reshape(-1, self.channels * self.padded_paths, self.channels)
        # the one-particle basis, (components, channels, atoms)
        return torch.bmm(mixing.index_select(0, self.degree_of_component).transpose(1, 2), padded)
