"""SOAP-BPNN: the SOAP power spectrum feeding one MLP per element.

The descriptor is featomic's SOAP power spectrum, computed with torch operations
(:mod:`.soap`), so forces and stress come from torch's autograd and an exported model is
plain TorchScript.
"""

from typing import Dict, List, Tuple

import torch
from metatensor.torch import TensorMap
from metatomic.torch import NeighborListOptions, System

from ...data.batching import FlatBatch
from ...data.dataset import DatasetInfo
from ..base import Model
from .derivatives import SoapFeatures, kept_inputs
from .hypers import BpnnHypers, SoapBpnnHypers
from .soap import SoapPowerSpectrum, as_tensormap


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

    takes_flat_batches = True

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
            [_element_network(self.soap.n_features, len(self.output_names), hypers.bpnn) for _ in self.atomic_types]
        )

    def per_atom_outputs(self, systems: List[System]) -> torch.Tensor:
        features = self.soap(systems)
        types = torch.cat([s.types for s in systems])
        result = torch.zeros((len(types), len(self.output_names)), dtype=features.dtype, device=features.device)
        for i, network in enumerate(self.networks):
            atoms = torch.nonzero(types == self.atomic_types[i]).reshape(-1)
            if len(atoms) > 0:  # this element is in the batch
                result = result.index_add(0, atoms, network(features.index_select(0, atoms)))
        return result

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

    def per_atom_outputs_of_batch(self, batch: FlatBatch) -> torch.Tensor:
        """:meth:`per_atom_outputs` of a flat batch: the same numbers, faster derivatives.

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
            pairs = batch.pairs[0]
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
    def precompute(self, system: System, derivatives: bool) -> Dict[str, TensorMap]:
        """The features as the networks take them (normalised), and with derivatives all
        that the hand-written derivatives need (:func:`.derivatives.kept_inputs`): the
        structures do not move, so the descriptor is computed once per structure. Only
        flat batches read them: a subclass that takes systems keeps nothing.
        """
        if not self.uses_flat_batches():
            return {}
        eps = self.networks[0][0].eps if self.layernorm else None
        types, first, second, vectors = self.soap._pairs([system])
        if not derivatives:
            with torch.no_grad():
                features = self.soap.power_spectrum(self.soap.expansion(types, first, second, vectors), len(types))
            if eps is not None:
                features = torch.nn.functional.layer_norm(features, features.shape[1:], eps=eps)
            return {"mtt::soap_inputs": as_tensormap(features)}
        with torch.no_grad():
            kept = kept_inputs(self.soap, types, first, second, vectors, eps)
        return {f"mtt::soap_{name}": as_tensormap(values) for name, values in kept.items()}

    @torch.jit.unused
    def interaction_range(self) -> float:
        return self.cutoff
