"""Equivariant message passing with many-body products, after MACE.

Each layer t turns every atom's features h_i (degrees 0 to ``hidden_l``, natural parity)
into new ones in three steps (Batatia et al., "MACE: Higher Order Equivariant Message
Passing Neural Networks for Fast and Accurate Force Fields", NeurIPS 2022):

1. a one-particle basis A_i, the sum over neighbours j within the cutoff of a learned
   radial function of r_ij times h_j coupled with the spherical harmonics of the bond
   (:class:`~.layers.Interaction`; the radial basis is DimeNet's enveloped Bessel
   functions, the coupling NequIP's channel-wise tensor product);
2. the symmetric many-body products of A_i up to ``correlation`` factors, projected on each
   output degree with weights per element (:class:`~.products.SymmetricProduct`, ACE);
3. a linear mixing of channels, plus a skip connection from h_i with weights per element
   (from the second layer on).

Each layer's scalars give the atom's energy through a readout (linear, an MLP for the
last layer), summed over layers. An atom's energy thus depends on atoms up to
``num_layers`` times the cutoff away, which the model declares to simulation engines.

No ``from __future__ import annotations`` here: TorchScript compiles the model.
"""

import math
from typing import Iterable, List, Tuple

import torch
from metatomic.torch import NeighborListOptions

from ...data.dataset import DatasetInfo
from ...data.flat_batch import FlatBatch
from ..base import Model, shared_indices
from ..spherical import SphericalHarmonics
from .hypers import EquivariantMpHypers
from .layers import ElementLinear, EquivariantLinear, Interaction
from .products import SymmetricProduct
from .radial import BesselBasis, NormalizedMlp


class Layer(torch.nn.Module):
    """One message-passing layer: messages, many-body product, mixing and skip connection."""

    def __init__(
        self,
        in_l: int,
        out_l: int,
        hypers: EquivariantMpHypers,
        n_elements: int,
        residual: bool,
        readout: torch.nn.Module,
    ):
        super().__init__()
        #: from the new features' scalars to each atom's contribution of this layer
        self.readout = readout
        channels = hypers.channels
        self.up = EquivariantLinear(channels, channels, in_l)
        self.interaction = Interaction(in_l, hypers.max_l, channels, hypers.num_radial, hypers.radial_mlp)
        self.product = SymmetricProduct(hypers.max_l, out_l, hypers.correlation, channels, n_elements)
        self.down = EquivariantLinear(channels, channels, out_l)
        skip_l = min(in_l, out_l)
        self.skip = ElementLinear(channels, skip_l, n_elements) if residual else None
        self.skip_width = (skip_l + 1) ** 2
        self.out_width = (out_l + 1) ** 2

    def forward(
        self,
        features: torch.Tensor,
        counts: List[int],
        harmonics: torch.Tensor,
        radial_basis: torch.Tensor,
        first: torch.Tensor,
        second: torch.Tensor,
        average_neighbors: torch.Tensor,
    ) -> torch.Tensor:
        basis = self.interaction(self.up(features), harmonics, radial_basis, first, second, average_neighbors)
        new = self.down.from_channels_first(self.product(basis, counts))
        if self.skip is not None:
            skip = self.skip(features[:, :, : self.skip_width], counts)
            if self.skip_width < self.out_width:
                skip = torch.nn.functional.pad(skip, (0, self.out_width - self.skip_width))
            new = new + skip
        return new


class EquivariantMp(Model):
    """Per-atom energies (and other targets) from equivariant message passing."""

    vector_columns: List[int]  # for TorchScript, which cannot infer the type of an empty list

    def __init__(self, hypers: EquivariantMpHypers, info: DatasetInfo):
        super().__init__(info)
        n_elements = len(self.atomic_types)
        channels = hypers.channels
        self.cutoff = hypers.cutoff
        self.num_layers = hypers.num_layers
        self.neighbor_list = NeighborListOptions(cutoff=hypers.cutoff, full_list=False, strict=True)
        index = torch.full((max(self.atomic_types) + 1,), -1, dtype=torch.long)
        index[torch.tensor(self.atomic_types)] = torch.arange(n_elements)
        self.register_buffer("type_to_index", index, persistent=False)
        # "component" normalisation: each harmonic of degree l has mean square 1 over the sphere
        self.harmonics = SphericalHarmonics(hypers.max_l, compact=True, scale=math.sqrt(4 * math.pi))
        parity = [(-1.0) ** l for l in range(hypers.max_l + 1) for _ in range(2 * l + 1)]
        self.register_buffer("harmonic_parity", torch.tensor(parity), persistent=False)
        self.radial_basis = BesselBasis(hypers.cutoff, hypers.num_radial, hypers.envelope_exponent)
        self.embedding = torch.nn.Parameter(torch.randn(n_elements, channels))
        n_targets = self.n_columns
        # vectors come from the last layer's l = 1 features, one column of weights per
        # property; their scalar readout columns stay unused (every target keeps its columns)
        self.vector_columns: List[int] = [
            self.output_starts[i] + 3 * number
            for i in range(len(self.output_names))
            if self.output_vectors[i]
            for number in range(self.output_properties[i])
        ]
        layers = []
        in_l = 0
        for number in range(hypers.num_layers):
            last = number == hypers.num_layers - 1
            # the last layer: scalars only, and vectors when a target is one
            out_l = (1 if self.vector_columns else 0) if last else hypers.hidden_l
            sizes = [channels, hypers.readout_hidden, n_targets] if last else [channels, n_targets]
            layers.append(Layer(in_l, out_l, hypers, n_elements, True, NormalizedMlp(sizes)))
            in_l = out_l
        self.layers = torch.nn.ModuleList(layers)
        self.vector_readout = torch.nn.Parameter(torch.randn(channels, len(self.vector_columns)))
        # the training set's average number of neighbours, which normalises the sums over
        # neighbours (:meth:`adapt_to_data`); kept in checkpoints and exported models
        self.register_buffer("average_neighbors", torch.tensor(1.0, dtype=torch.float64))
        # last-layer features: what every layer's readout multiplies by its last weights
        self.offer_last_layer_features((hypers.num_layers - 1) * channels + hypers.readout_hidden)

    def per_atom_outputs(self, batch: FlatBatch) -> torch.Tensor:
        return self._outputs(batch, False)[0]

    def per_atom_outputs_and_features(self, batch: FlatBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._outputs(batch, True)

    def _outputs(self, batch: FlatBatch, with_features: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every atom's contributions, and with ``with_features`` its last-layer features."""
        species = self.type_to_index[batch.types.long()]
        # atoms sorted by element, so that what depends on the element takes slices
        order = torch.argsort(species, stable=True)
        counts: List[int] = torch.bincount(species, minlength=self.embedding.shape[0]).tolist()
        position = torch.empty_like(order)
        position[order] = torch.arange(len(order), device=order.device)
        # a half list: each pair's radial part and harmonics are computed once, and the
        # reversed pair (the other atom's message) takes the same radial part and the
        # harmonics times (-1)^l
        pairs = batch.neighbors[0]
        first = position[torch.cat([pairs.first, pairs.second])]
        second = position[torch.cat([pairs.second, pairs.first])]
        distances = torch.linalg.vector_norm(pairs.vectors, dim=1)
        half = self.harmonics(pairs.vectors / distances[:, None])
        harmonics = torch.cat([half, half * self.harmonic_parity.to(half.dtype)])
        radial_basis = self.radial_basis(distances)
        average_neighbors = self.average_neighbors.to(distances.dtype)

        features = self.embedding[species.index_select(0, order)][:, :, None]
        outputs = torch.zeros((len(order), self.n_columns), dtype=distances.dtype, device=distances.device)
        last_layer: List[torch.Tensor] = []
        for layer in self.layers:
            features = layer(features, counts, harmonics, radial_basis, first, second, average_neighbors)
            if with_features:
                contribution, inputs = layer.readout.forward_with_features(features[:, :, 0])
                last_layer.append(inputs)
            else:
                contribution = layer.readout(features[:, :, 0])
            outputs = outputs + contribution
        if len(self.vector_columns) > 0:
            # l = 1 components are (y, z, x): taken as (x, y, z)
            vectors = features[:, :, 1:4].index_select(2, torch.tensor([2, 0, 1], device=features.device))
            weights = self.vector_readout.to(features.dtype) / math.sqrt(self.vector_readout.shape[0])
            vectors = torch.einsum("acm,cp->apm", vectors, weights)
            for number, column in enumerate(self.vector_columns):
                outputs[:, column : column + 3] = vectors[:, number]
        if with_features:
            return outputs.index_select(0, position), torch.cat(last_layer, dim=1).index_select(0, position)
        return outputs.index_select(0, position), outputs[:0]

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return [self.neighbor_list]

    @torch.jit.unused
    def interaction_range(self) -> float:
        return self.num_layers * self.cutoff

    @torch.jit.unused
    def adapt_to_data(self, batches: Iterable[FlatBatch]) -> None:
        """The average number of neighbours within the cutoff, over the training set."""
        pairs = atoms = 0
        for batch in batches:
            pairs += 2 * len(batch.neighbors[0].first)  # both directions of the half list
            atoms += len(batch.types)
        if atoms and pairs:
            self.average_neighbors.fill_(pairs / atoms)

    # -- fine-tuning ----------------------------------------------------------------------
    @torch.jit.unused
    def heads(self) -> List[torch.nn.Module]:
        """Every layer's readout, from its scalars to the atom's contributions."""
        return [layer.readout for layer in self.layers]

    @torch.jit.unused
    def indexed_axes(self, name: str, old: Model) -> List[Tuple[int, List[Tuple[int, int]]]]:
        """Weights per element have the element first; the readouts' last matrices end
        with one column per target."""
        elements = shared_indices(self.atomic_types, old.atomic_types)
        if name == "embedding" or name.endswith((".skip.weights", ".product.weights")):
            return [(0, elements)]
        if name == "vector_readout":
            mine = {column: k for k, column in enumerate(self.vector_columns)}
            theirs = {column: k for k, column in enumerate(old.vector_columns)}
            pairs = [(mine[a], theirs[b]) for a, b in self.shared_outputs(old) if a in mine and b in theirs]
            return [(1, pairs)]
        if ".readout.weights." in name:
            _, layer, _, _, number = name.split(".")
            if int(number) == len(self.layers[int(layer)].readout.weights) - 1:
                return [(1, self.shared_outputs(old))]
        return []
