"""SOAP-BPNN: the SOAP power spectrum feeding one neural network per chemical element."""

from .hypers import SoapBpnnHypers
from .model import SoapBpnn

__model__ = SoapBpnn
__hypers__ = SoapBpnnHypers
__maintainers__ = ["the mtt developers, through the mtt issue tracker"]
#: vectors per structure (a dipole moment) as the sum of learned charges times positions
__target_kinds__ = ("scalar", "scalar per atom", "vector")
