"""The radial part of every message: a Bessel basis of the distance that vanishes smoothly at
the cutoff, and a small network that turns it into the weights of each coupling path.

The basis is DimeNet's (Klicpera, Gross and Günnemann, ICLR 2020), also NequIP's and
MACE's: sqrt(2 / r_c) sin(n pi r / r_c) / r for n = 1 to N, times the polynomial envelope
of degree p that takes it to zero with its first p derivatives' worth of smoothness at r_c.

No ``from __future__ import annotations`` here: TorchScript compiles these modules.
"""

import math
from typing import List, Tuple

import torch


class BesselBasis(torch.nn.Module):
    """The enveloped Bessel functions of each pair's distance, (pairs, functions)."""

    def __init__(self, cutoff: float, functions: int, envelope_exponent: int):
        super().__init__()
        self.cutoff = cutoff
        self.exponent = envelope_exponent
        frequencies = math.pi / cutoff * torch.arange(1, functions + 1, dtype=torch.float64)
        self.register_buffer("frequencies", frequencies, persistent=False)
        self.prefactor = math.sqrt(2.0 / cutoff)

    def envelope(self, distances: torch.Tensor) -> torch.Tensor:
        """1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2) for x = r / r_c < 1, else 0."""
        p = float(self.exponent)
        x = distances / self.cutoff
        power = x**self.exponent
        value = (
            1.0 - (p + 1.0) * (p + 2.0) / 2.0 * power + p * (p + 2.0) * power * x - p * (p + 1.0) / 2.0 * power * x * x
        )
        return value * (x < 1.0).to(distances.dtype)

    def forward(self, distances: torch.Tensor) -> torch.Tensor:
        distances = distances[:, None]
        frequencies = self.frequencies.to(distances.dtype)
        return self.prefactor * torch.sin(frequencies * distances) / distances * self.envelope(distances)


#: 1 / sqrt(E[silu(z)^2]) for z ~ N(0, 1): SiLU scaled to keep the second moment of its input
SILU_NORMALIZATION = 1.6754


class NormalizedMlp(torch.nn.Module):
    """An MLP that keeps its activations of order one from the first step: weights N(0, 1)
    divided by the square root of their inputs' number, SiLU scaled to keep the second
    moment, no biases (e3nn's FullyConnectedNet, which MACE's radial and readout networks use)."""

    def __init__(self, sizes: List[int]):
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(a, b)) for a, b in zip(sizes, sizes[1:])])
        self.fan_in = [float(a) for a in sizes[:-1]]
        self.silu_normalization = SILU_NORMALIZATION

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        result = inputs
        last = len(self.fan_in) - 1
        scale = 1.0  # of the layer's inputs: the SiLU's normalisation, applied to the weights (smaller)
        for number, weight in enumerate(self.weights):
            result = result @ (weight * (scale / math.sqrt(self.fan_in[number])))
            if number < last:
                result = torch.nn.functional.silu(result)
                scale = self.silu_normalization
        return result

    def forward_with_features(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`, and the inputs of its last matrix with the factor that multiplies
        it: the outputs are those features times the last weights."""
        result = inputs
        last = len(self.fan_in) - 1
        scale = 1.0
        features = inputs
        for number, weight in enumerate(self.weights):
            factor = scale / math.sqrt(self.fan_in[number])
            if number == last:
                features = result * factor
            result = result @ (weight * factor)
            if number < last:
                result = torch.nn.functional.silu(result)
                scale = self.silu_normalization
        return result, features


class RadialNetwork(NormalizedMlp):
    """From the radial basis to the weights of each channel and coupling path."""

    def __init__(self, functions: int, hidden: List[int], outputs: int):
        super().__init__([functions] + list(hidden) + [outputs])
