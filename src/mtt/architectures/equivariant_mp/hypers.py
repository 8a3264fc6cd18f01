"""Hyperparameters of the equivariant message-passing architecture; each field's text is what the docs show."""

from __future__ import annotations

from dataclasses import dataclass

from ...schema import option

#: the most products per channel that one layer's many-body product may take:
#: (max_l + 1)^(2 correlation) grows fast, and with it the memory and time of a step
LARGEST_PRODUCT = 2**14


@dataclass
class EquivariantMpHypers:
    """Equivariant message passing with many-body (ACE) products, as MACE."""

    cutoff: float = option(5.0, "Cutoff radius of each layer's messages, in Å.")
    num_layers: int = option(2, "Message-passing layers: an atom's energy depends on atoms num_layers x cutoff away.")
    channels: int = option(32, "Channels of the equivariant features, for each degree l.")
    max_l: int = option(
        3, "Largest degree of the spherical harmonics of the bonds, and of each atom's one-particle basis."
    )
    hidden_l: int = option(
        1, "Largest degree of the features passed from one layer to the next (0: scalars, 1: and vectors, ...)."
    )
    correlation: int = option(
        3, "Body order of each layer's product minus one: products of up to this many one-particle functions."
    )
    num_radial: int = option(8, "Bessel functions of the radial basis.")
    envelope_exponent: int = option(5, "Exponent of the polynomial envelope that takes the radial basis to zero.")
    radial_mlp: list[int] = option([64, 64, 64], "Hidden layers of the network from the radial basis to the weights.")
    readout_hidden: int = option(16, "Hidden neurons of the last layer's readout (the other layers' are linear).")

    def __post_init__(self):
        if self.cutoff <= 0:
            raise ValueError("cutoff must be > 0")
        if self.num_layers < 1 or self.channels < 1 or self.num_radial < 1 or self.readout_hidden < 1:
            raise ValueError("num_layers, channels, num_radial and readout_hidden must be >= 1")
        if self.envelope_exponent < 1 or any(size < 1 for size in self.radial_mlp):
            raise ValueError("envelope_exponent and the sizes of radial_mlp must be >= 1")
        if self.max_l < 0 or not 0 <= self.hidden_l <= self.max_l:
            raise ValueError("max_l must be >= 0 and hidden_l between 0 and max_l")
        if not 1 <= self.correlation <= 4:
            raise ValueError("correlation must be between 1 and 4")
        if (self.max_l + 1) ** (2 * self.correlation) > LARGEST_PRODUCT:
            raise ValueError(
                f"max_l={self.max_l} is too large for correlation={self.correlation}: each layer's product would take "
                f"{(self.max_l + 1) ** (2 * self.correlation):,} products per channel (at most {LARGEST_PRODUCT:,}); "
                "lower max_l (3 is usual for correlation 3) or correlation"
            )
