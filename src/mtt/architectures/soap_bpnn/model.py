"""SOAP-BPNN: featomic's SOAP power spectrum feeding one MLP per element.

featomic computes the descriptor and registers its gradients in C++, so forces and stress
obtained by autograd stay right in an exported model loaded without Python.
"""


from typing import List

import torch
from featomic.torch import SoapPowerSpectrum
from metatensor.torch import Labels
from metatomic.torch import NeighborListOptions, System

from ..base import Model
from .hypers import SoapBpnnHypers


def _element_network(n_in: int, n_out: int, hypers) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = [torch.nn.LayerNorm(n_in)] if hypers.layernorm else []
    width = n_in
    for _ in range(hypers.num_hidden_layers):
        layers += [torch.nn.Linear(width, hypers.num_neurons_per_layer), torch.nn.SiLU()]
        width = hypers.num_neurons_per_layer
    layers.append(torch.nn.Linear(width, n_out))
    return torch.nn.Sequential(*layers)


class SoapBpnn(Model):
    """Per-atom contributions from SOAP features, one network per element."""

    def __init__(self, hypers: SoapBpnnHypers, info):
        super().__init__(info)
        soap = hypers.soap
        self.cutoff = soap.cutoff.radius
        self.calculator = SoapPowerSpectrum(
            cutoff={
                "radius": soap.cutoff.radius,
                "smoothing": {"type": "ShiftedCosine", "width": soap.cutoff.width},
            },
            density={"type": "Gaussian", "width": soap.atomic_gaussian_width},
            basis={
                "type": "TensorProduct",
                "max_angular": soap.max_angular,
                "radial": {"type": "Gto", "max_radial": soap.max_radial},
            },
        )
        pairs = [[a, b] for a in self.atomic_types for b in self.atomic_types if a <= b]
        self.neighbor_pairs = Labels(["neighbor_1_type", "neighbor_2_type"], torch.tensor(pairs))
        n_features = len(pairs) * (soap.max_radial + 1) ** 2 * (soap.max_angular + 1)
        self.networks = torch.nn.ModuleList(
            [_element_network(n_features, len(self.output_names), hypers.bpnn) for _ in self.atomic_types]
        )

    def per_atom_outputs(self, systems: List[System]) -> torch.Tensor:
        device = systems[0].positions.device
        dtype = systems[0].positions.dtype
        n_atoms = torch.tensor([len(s) for s in systems], device=device)
        first_atom = torch.cumsum(n_atoms, 0) - n_atoms
        features = self.calculator(systems).keys_to_properties(self.neighbor_pairs.to(device))
        centers = features.keys.column("center_type")
        result = torch.zeros((int(n_atoms.sum()), len(self.output_names)), dtype=dtype, device=device)
        for i, network in enumerate(self.networks):
            found = torch.nonzero(centers == self.atomic_types[i])
            if len(found) > 0:  # this element is in the batch
                block = features.block_by_id(int(found[0, 0]))
                samples = block.samples.values
                atoms = first_atom[samples[:, 0]] + samples[:, 1]
                result = result.index_add(0, atoms, network(block.values))
        return result

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return self.calculator.requested_neighbor_lists()

    @torch.jit.unused
    def interaction_range(self) -> float:
        return self.cutoff
