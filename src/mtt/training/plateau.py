"""metatrain's learning-rate schedule: lower the rate when the validation loss stops
decreasing (what ``torch.optim.lr_scheduler.ReduceLROnPlateau`` does, with its defaults).

Its state is kept in checkpoints, so a restarted run lowers the rate at the same epochs as
one that was never interrupted; the validation loss it watches is the same on every rank.
"""

from __future__ import annotations

import math
from typing import Any

#: a loss counts as lower when it is below the best by this fraction (torch's default)
THRESHOLD = 1e-4
DEFAULT_PATIENCE = 10
DEFAULT_FACTOR = 0.8


class PlateauSchedule:
    """The factor on the learning rate: multiplied by ``factor`` after more than
    ``patience`` epochs in a row without a lower validation loss."""

    def __init__(self, patience: int | None, factor: float | None):
        self.patience = DEFAULT_PATIENCE if patience is None else patience
        self.factor = DEFAULT_FACTOR if factor is None else factor
        self.best = math.inf
        self.bad_epochs = 0
        self.scale = 1.0

    def step(self, validation_loss: float) -> bool:
        """Record an epoch's validation loss; True when the rate was lowered."""
        if validation_loss < self.best * (1 - THRESHOLD):
            self.best, self.bad_epochs = validation_loss, 0
            return False
        self.bad_epochs += 1
        if self.bad_epochs > self.patience:
            self.scale *= self.factor
            self.bad_epochs = 0
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_epochs": self.bad_epochs, "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_epochs, self.scale = float(state["best"]), int(state["bad_epochs"]), float(state["scale"])
