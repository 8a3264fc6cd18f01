"""Equivariant message passing with many-body products: an accurate interatomic potential."""

from .hypers import EquivariantMpHypers
from .model import EquivariantMp

__model__ = EquivariantMp
__hypers__ = EquivariantMpHypers
__maintainers__ = ["the mtt developers, through the mtt issue tracker"]
#: MACE's recipe: a learning rate of 0.01, an average of the weights, and a last quarter of
#: training at a tenth of the rate with the energies weighing more
__training_defaults__ = {
    "learning_rate": 0.01,
    "scale_targets": "forces",
    "ema_decay": 0.99,
    "final_stage": {"start_fraction": 0.75, "learning_rate": 0.001, "loss_weights": {}},
}
