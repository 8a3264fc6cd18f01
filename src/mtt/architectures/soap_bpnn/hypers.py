"""Hyperparameters of SOAP-BPNN; each field's text is what the docs show."""

from __future__ import annotations

from dataclasses import dataclass

from ...schema import option


@dataclass
class CutoffHypers:
    radius: float = option(5.0, "Cutoff radius of the atomic environments, in Å.")
    width: float = option(0.5, "Width of the smooth (shifted cosine) switching at the cutoff, in Å.")

    def __post_init__(self):
        if self.radius <= 0 or not 0 <= self.width < self.radius:
            raise ValueError("cutoff needs radius > 0 and 0 <= width < radius")


@dataclass
class SoapHypers:
    cutoff: CutoffHypers = option(CutoffHypers(), "Cutoff of the atomic environments.")
    max_radial: int = option(6, "Largest radial basis index (GTO basis): max_radial + 1 functions.")
    max_angular: int = option(4, "Largest angular channel of the spherical expansion.")
    atomic_gaussian_width: float = option(0.3, "Width of the Gaussian placed on each neighbour, in Å.")

    def __post_init__(self):
        if self.max_radial < 0 or self.max_angular < 0 or self.atomic_gaussian_width <= 0:
            raise ValueError("max_radial and max_angular must be >= 0, atomic_gaussian_width > 0")


@dataclass
class BpnnHypers:
    num_hidden_layers: int = option(2, "Hidden layers of each element's network.")
    num_neurons_per_layer: int = option(32, "Neurons in each hidden layer.")
    layernorm: bool = option(True, "Normalise the SOAP features with a layer norm before the network.")

    def __post_init__(self):
        if self.num_hidden_layers < 0 or self.num_neurons_per_layer < 1:
            raise ValueError("num_hidden_layers must be >= 0 and num_neurons_per_layer >= 1")


@dataclass
class SoapBpnnHypers:
    """SOAP power spectrum features, one small neural network per chemical element."""

    soap: SoapHypers = option(SoapHypers(), "The SOAP power-spectrum descriptor (featomic).")
    bpnn: BpnnHypers = option(BpnnHypers(), "The per-element Behler-Parrinello networks.")
