"""Equivariant message passing with many-body products: an accurate interatomic potential."""

from .hypers import EquivariantMpHypers
from .model import EquivariantMp

__model__ = EquivariantMp
__hypers__ = EquivariantMpHypers
__maintainers__ = ["the mtt developers, through the mtt issue tracker"]
#: after MACE's recipe: a large learning rate (twice MACE's: on ethanol, mtt's parameterisation
#: learns at MACE's pace per epoch with it), an average of the weights, output scaled by the
#: forces, and the last eighth of training at a small constant rate (MACE starts its second
#: stage at 3/4; here a later start gave lower force errors on every split of compare_mace)
__training_defaults__ = {
    "learning_rate": 0.02,
    "scale_targets": "forces",
    "ema_decay": 0.99,
    "final_stage": {"start_fraction": 0.875, "learning_rate": 0.001, "loss_weights": {}},
}
#: float32: the same test errors as float64 on the systems of benchmarks/mace_systems.py, in
#: about half the time (the baseline fit, loss sums and covariances stay in float64)
__default_precision__ = 32
#: the forces weigh three times the energy (per atom, both over the forces' RMS): on the five
#: systems of benchmarks/mace_systems.py the force and energy errors of both 60 and 200 epochs
#: are then at most MACE's; 1 left the water cluster's and the alloy's forces behind, 10
#: butane's conformer energies
__loss_weights__ = {"forces": 3}
__target_kinds__ = ("scalar", "scalar per atom", "vector", "vector per atom")
#: 2: the readout of vectors (``vector_readout``), empty in models without vector targets
__checkpoint_version__ = 2


def upgrade_checkpoint(state: dict, version: int) -> dict:
    """Version 1 -> 2: models of version 1 have no vector target, hence an empty vector readout."""
    import torch

    channels = int(state["model_hypers"]["channels"])
    for key in ("model_state", "best_model_state"):
        weights = state.get(key)
        if weights is not None and "vector_readout" not in weights:
            dtype = next(v.dtype for v in weights.values() if v.is_floating_point())
            weights["vector_readout"] = torch.zeros((channels, 0), dtype=dtype)
    return state
