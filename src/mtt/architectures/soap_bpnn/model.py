"""SOAP-BPNN: the SOAP power spectrum feeding one MLP per element.

The descriptor is featomic's SOAP power spectrum, computed with torch operations
(:mod:`.soap`), so forces and stress come from torch's autograd and an exported model is
plain TorchScript.
"""

from typing import Dict, List, Optional, Tuple

import torch
from metatomic.torch import NeighborListOptions

from ...data.dataset import DatasetInfo
from ...data.flat_batch import FlatBatch
from ..base import Model, shared_indices
from .derivatives import SoapFeatures, kept_inputs
from .hypers import BpnnHypers, SoapBpnnHypers
from .soap import SoapPowerSpectrum


def _element_network(n_in: int, n_out: int, hypers: BpnnHypers) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = [torch.nn.LayerNorm(n_in)] if hypers.layernorm else []
    width = n_in
    for _ in range(hypers.num_hidden_layers):
        layers += [torch.nn.Linear(width, hypers.num_neurons_per_layer), torch.nn.SiLU()]
        width = hypers.num_neurons_per_layer
    layers.append(torch.nn.Linear(width, n_out))
    return torch.nn.Sequential(*layers)


def _normalized_network(network: torch.nn.Sequential, normalized: torch.Tensor) -> torch.Tensor:
    """``network`` (layer norm first) on features the layer norm's normalisation gave already."""
    norm, first = network[0], network[1]
    weight = first.weight * norm.weight
    bias = torch.addmv(first.bias, first.weight, norm.bias)
    return network[2:](torch.nn.functional.linear(normalized, weight, bias))


class SoapBpnn(Model):
    """Per-atom contributions from SOAP features, one network per element."""

    def __init__(self, hypers: SoapBpnnHypers, info: DatasetInfo):
        super().__init__(info)
        soap = hypers.soap
        self.cutoff = soap.cutoff.radius
        self.soap = SoapPowerSpectrum(
            self.atomic_types,
            radius=soap.cutoff.radius,
            width=soap.cutoff.width,
            max_angular=soap.max_angular,
            max_radial=soap.max_radial,
            gaussian_width=soap.atomic_gaussian_width,
        )
        self.layernorm = hypers.bpnn.layernorm
        self.networks = torch.nn.ModuleList(
            [_element_network(self.soap.n_features, self.n_columns, hypers.bpnn) for _ in self.atomic_types]
        )
        for name, vector, per_atom in zip(self.output_names, self.output_vectors, self.output_per_atom):
            if vector and per_atom:
                raise ValueError(f"SOAP-BPNN cannot predict a vector per atom ({name})")
        self.has_vectors = any(self.output_vectors)
        #: an atom's last-layer features: the inputs of its element's last layer, and a one
        #: for its bias, in that element's block
        self.last_width = self.networks[0][-1].in_features + 1
        self.offer_last_layer_features(len(self.atomic_types) * self.last_width)

    def per_atom_outputs(self, batch: FlatBatch) -> torch.Tensor:
        """Exported models compute the features with the plain torch operations of
        :mod:`.soap`, whose derivatives autograd knows to any order; training, validation
        and ``mtt eval`` of a checkpoint (eager mode) with hand-written derivatives and
        the kept features (:meth:`_training_outputs`). The architecture tests check that
        both give the same values, forces, stress and weight gradients."""
        if torch.jit.is_scripting():
            outputs = self._exported_outputs(batch)
        else:
            outputs = self._training_outputs(batch)
        return self._with_dipoles(outputs, batch) if self.has_vectors else outputs

    def _with_dipoles(self, outputs: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
        """A vector per structure (a dipole moment) as the sum of atomic charges times
        positions: each atom's contribution is its charge, made neutral over its structure
        (the first of the network's three columns of each property), times its position
        from the structure's centre, which rotates with the structure and does not depend
        on where the structure is. For molecules: positions of periodic images are not."""
        structure = batch.structure
        ones = torch.ones(len(structure), dtype=outputs.dtype, device=outputs.device)
        counts = torch.zeros(batch.n_structures, dtype=outputs.dtype, device=outputs.device).index_add(
            0, structure, ones
        )
        centres = torch.zeros((batch.n_structures, 3), dtype=outputs.dtype, device=outputs.device)
        centres = centres.index_add(0, structure, batch.positions) / counts[:, None]
        relative = batch.positions - centres.index_select(0, structure)
        result = outputs.clone()
        for i in range(len(self.output_names)):
            if not self.output_vectors[i]:
                continue
            for number in range(self.output_properties[i]):
                column = self.output_starts[i] + 3 * number
                charges = outputs[:, column]
                totals = torch.zeros_like(counts).index_add(0, structure, charges)
                neutral = charges - (totals / counts).index_select(0, structure)
                result[:, column : column + 3] = neutral[:, None] * relative
        return result

    def _exported_outputs(self, batch: FlatBatch) -> torch.Tensor:
        pairs = batch.neighbors[0]
        types = batch.types
        features = self.soap(types, pairs.first, pairs.second, pairs.vectors)
        result = torch.zeros((len(types), self.n_columns), dtype=features.dtype, device=features.device)
        for i, network in enumerate(self.networks):
            atoms = torch.nonzero(types == self.atomic_types[i]).reshape(-1)
            if len(atoms) > 0:  # this element is in the batch
                result = result.index_add(0, atoms, network(features.index_select(0, atoms)))
        return result

    def per_atom_outputs_and_features(self, batch: FlatBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_exported_outputs` with every atom's features before its network's last layer."""
        pairs = batch.neighbors[0]
        types = batch.types
        soap = self.soap(types, pairs.first, pairs.second, pairs.vectors)
        outputs = torch.zeros((len(types), self.n_columns), dtype=soap.dtype, device=soap.device)
        features = torch.zeros((len(types), len(self.networks) * self.last_width), dtype=soap.dtype, device=soap.device)
        for i, network in enumerate(self.networks):
            atoms = torch.nonzero(types == self.atomic_types[i]).reshape(-1)
            if len(atoms) > 0:  # this element is in the batch
                hidden = soap.index_select(0, atoms)
                last = len(network) - 1
                for number, layer in enumerate(network):
                    if number == last:
                        outputs = outputs.index_add(0, atoms, layer(hidden))
                    else:
                        hidden = layer(hidden)
                ones = torch.ones((len(atoms), 1), dtype=soap.dtype, device=soap.device)
                block = torch.zeros((len(types), self.last_width), dtype=soap.dtype, device=soap.device)
                block = block.index_copy(0, atoms, torch.cat([hidden, ones], dim=1))
                features[:, i * self.last_width : (i + 1) * self.last_width] = block
        if self.has_vectors:
            outputs = self._with_dipoles(outputs, batch)
        return outputs, features

    def _by_element(self, types: torch.Tensor) -> Tuple[torch.Tensor, List[int], torch.Tensor]:
        """The atoms element by element (``order``), how many of each, and where each went.

        Each element's network then takes a slice of the features, which in a
        force-training step is cheaper than gathering and scattering each element's rows,
        forward and twice backward.
        """
        species = self.soap.type_to_index[types.long()]
        order = torch.argsort(species, stable=True)
        counts: List[int] = torch.bincount(species, minlength=len(self.atomic_types)).tolist()
        position = torch.empty_like(order)
        position[order] = torch.arange(len(order), device=order.device)
        return order, counts, position

    @torch.jit.unused
    def _training_outputs(self, batch: FlatBatch) -> torch.Tensor:
        """The numbers of :meth:`_exported_outputs`, with faster derivatives for training.

        The layer norms' normalisation, the same for every element, is done once for the
        batch, with the descriptor, whose derivatives are hand-written (:mod:`.derivatives`),
        or on the kept features. Each layer norm's scale and shift are folded into the
        first layer of its network, which then multiplies the normalised features directly
        (a scale of the first layer's weights instead of two passes over the features).
        """
        order, counts, position = self._by_element(batch.types)
        eps = self.networks[0][0].eps if self.layernorm else None
        data = batch.data
        if "mtt::soap_inputs" in data and "mtt::soap_pairs" not in data:  # no derivatives
            features = data["mtt::soap_inputs"].index_select(0, order)
        else:
            pairs = batch.neighbors[0]
            kept = None
            if "mtt::soap_pairs" in data:
                kept = (data["mtt::soap_inputs"], data["mtt::soap_atoms"], data["mtt::soap_pairs"])
            features = SoapFeatures.apply(
                pairs.vectors,
                self.soap,
                batch.types.index_select(0, order),
                position[pairs.first],
                position[pairs.second],
                eps,
                kept,
                order,
            )
        outputs = []
        for inputs, network in zip(features.split(counts), self.networks):
            if len(inputs) > 0:  # this element is in the batch
                outputs.append(_normalized_network(network, inputs) if self.layernorm else network(inputs))
        return torch.cat(outputs).index_select(0, position)

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return self.soap.requested_neighbor_lists()

    @torch.jit.unused
    def precompute(self, batch: FlatBatch, derivatives: bool) -> Dict[str, torch.Tensor]:
        """The features as the networks take them (normalised), and with derivatives all
        that the hand-written derivatives need (:func:`.derivatives.kept_inputs`): the
        structures do not move, so the descriptor is computed once per structure."""
        eps = self.networks[0][0].eps if self.layernorm else None
        pairs = batch.neighbors[0]
        types, first, second, vectors = batch.types, pairs.first, pairs.second, pairs.vectors
        with torch.no_grad():
            if not derivatives:
                features = self.soap(types, first, second, vectors)
                if eps is not None:
                    features = torch.nn.functional.layer_norm(features, features.shape[1:], eps=eps)
                return {"mtt::soap_inputs": features}
            kept = kept_inputs(self.soap, types, first, second, vectors, eps)
        return {f"mtt::soap_{name}": values for name, values in kept.items()}

    @torch.jit.unused
    def interaction_range(self) -> float:
        return self.cutoff

    # -- fine-tuning ----------------------------------------------------------------------
    @torch.jit.unused
    def heads(self) -> List[torch.nn.Module]:
        """The last linear layer of every element's network."""
        return [network[-1] for network in self.networks]

    @torch.jit.unused
    def inherited_name(self, name: str, old: Model) -> Optional[str]:
        """``networks.<i>`` is the network of the i-th element, numbered in each model's elements."""
        if not name.startswith("networks."):
            return name
        _, number, rest = name.split(".", 2)
        atomic_type = self.atomic_types[int(number)]
        if atomic_type not in old.atomic_types:
            return None
        return f"networks.{old.atomic_types.index(atomic_type)}.{rest}"

    @torch.jit.unused
    def indexed_axes(self, name: str, old: Model) -> List[Tuple[int, List[Tuple[int, int]]]]:
        """Targets are the outputs of each network's last layer; the features of a pair of
        elements the other model lacks are the new inputs of its first layer (and layer norm)."""
        if not name.startswith("networks."):
            return []
        _, _, layer, kind = name.split(".")
        last = len(self.networks[0]) - 1
        first = 1 if self.layernorm else 0
        axes: List[Tuple[int, List[Tuple[int, int]]]] = []
        if int(layer) == last:
            axes.append((0, self.shared_outputs(old)))
        features = self.shared_features(old)
        if self.layernorm and int(layer) == 0:
            axes.append((0, features))
        if int(layer) == first and kind == "weight":
            axes.append((1, features))
        return axes

    @torch.jit.unused
    def shared_features(self, old: Model) -> List[Tuple[int, int]]:
        """(index here, index in ``old``) of the features both descriptors compute: those
        of the pairs of neighbour elements both models know."""
        assert isinstance(old, SoapBpnn)
        block = self.soap.n_features // len(self.soap.type_pairs)
        mine = [(self.atomic_types[a], self.atomic_types[b]) for a, b in self.soap.type_pairs]
        theirs = [(old.atomic_types[a], old.atomic_types[b]) for a, b in old.soap.type_pairs]
        return [(i * block + k, j * block + k) for i, j in shared_indices(mine, theirs) for k in range(block)]

    @torch.jit.unused
    def inherit(self, old: Model) -> None:
        """As :meth:`Model.inherit`; a network of an element both models know then gives the
        features of new pairs of elements a weight of zero, so that it starts from ``old``'s
        predictions wherever those elements are absent (up to its layer norm's statistics)."""
        super().inherit(old)
        shared = {i for i, _ in self.shared_features(old)}
        new = [i for i in range(self.soap.n_features) if i not in shared]
        if not new:
            return
        first = 1 if self.layernorm else 0
        with torch.no_grad():
            for network, atomic_type in zip(self.networks, self.atomic_types):
                if atomic_type in old.atomic_types:
                    network[first].weight[:, new] = 0.0
