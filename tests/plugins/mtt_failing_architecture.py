"""A plug-in architecture for tests: the composition model, failing or slow on purpose.

It is found through the ``mtt.architectures`` entry point declared in the dist-info
folder beside it, as a third-party package would be once installed. Set
``MTT_TEST_FAIL_RANK`` to the rank that fails (``SLURM_PROCID``/``RANK``; ``none`` for
no failure) after ``MTT_TEST_FAIL_AFTER`` forward calls, and ``MTT_TEST_SECONDS_PER_CALL``
to make every forward call last that long (a long training step).
"""

import os
import time
from dataclasses import dataclass

import torch

from mtt.architectures.composition import CompositionModel
from mtt.data.flat_batch import FlatBatch


@dataclass
class FailingHypers:
    pass


class FailingModel(CompositionModel):
    calls = 0

    @torch.jit.unused  # Python only, so that the model still exports (and fails if run exported)
    def per_atom_outputs(self, batch: FlatBatch) -> torch.Tensor:
        rank = os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))
        FailingModel.calls += 1
        time.sleep(float(os.environ.get("MTT_TEST_SECONDS_PER_CALL", "0")))
        if rank == os.environ.get("MTT_TEST_FAIL_RANK", "0") and FailingModel.calls > int(
            os.environ.get("MTT_TEST_FAIL_AFTER", "0")
        ):
            raise ValueError("deliberate failure of the test architecture")
        return super().per_atom_outputs(batch)


__model__ = FailingModel
__hypers__ = FailingHypers
__maintainers__ = ["The Test Maintainers <tests@example.org>"]
