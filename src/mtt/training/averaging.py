"""An exponential moving average of the trained weights (``architecture.training.ema_decay``).

The averaged weights are smoother than the last step's, and equivariant interatomic
potentials in particular (MACE, NequIP) validate and export them. The decay ramps up over
the first steps, as in the ``torch_ema`` package that MACE uses: min(decay, (1 + n) / (10 + n))
after n updates, so that the average does not remember the random initial weights.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


class WeightAverage:
    """The moving average of ``parameters``, updated after every optimisation step."""

    def __init__(self, parameters: list[torch.Tensor], decay: float):
        self.parameters = parameters
        self.decay = decay
        self.averages = [p.detach().clone() for p in parameters]
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.averages, [p.detach() for p in self.parameters], 1.0 - decay)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own after it."""
        with torch.no_grad():
            own = [p.detach().clone() for p in self.parameters]
            torch._foreach_copy_([p.data for p in self.parameters], self.averages)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in self.parameters], own)

    def state_dict(self) -> dict:
        return {"averages": [a.clone() for a in self.averages], "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        if len(state["averages"]) != len(self.averages):
            raise ValueError("the averaged weights do not match the model's parameters")
        self.averages = [a.to(p).clone() for a, p in zip(state["averages"], self.parameters)]
        self.updates = int(state["updates"])
