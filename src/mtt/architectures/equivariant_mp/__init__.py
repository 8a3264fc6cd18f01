"""Equivariant message passing with many-body products: an accurate interatomic potential."""

from .hypers import EquivariantMpHypers
from .model import EquivariantMp

__model__ = EquivariantMp
__hypers__ = EquivariantMpHypers
__maintainers__ = ["the mtt developers, through the mtt issue tracker"]
#: after MACE's recipe: a large learning rate (twice MACE's: on ethanol, mtt's parameterisation
#: learns at MACE's pace per epoch with it), an average of the weights, output scaled by the
#: forces, and a last quarter of training at a small constant rate
__training_defaults__ = {
    "learning_rate": 0.02,
    "scale_targets": "forces",
    "ema_decay": 0.99,
    "final_stage": {"start_fraction": 0.75, "learning_rate": 0.001, "loss_weights": {}},
}
