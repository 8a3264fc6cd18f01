"""A plug-in architecture for tests: the composition model, failing on purpose.

It is found through the ``mtt.architectures`` entry point declared in the dist-info
folder beside it, as a third-party package would be once installed. Set
``MTT_TEST_FAIL_RANK`` to the rank that fails (``SLURM_PROCID``/``RANK``) after
``MTT_TEST_FAIL_AFTER`` forward calls.
"""

import os
from dataclasses import dataclass

from mtt.architectures.composition import CompositionModel


@dataclass
class FailingHypers:
    pass


class FailingModel(CompositionModel):
    calls = 0

    def per_atom_outputs(self, batch):
        rank = os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))
        FailingModel.calls += 1
        if rank == os.environ.get("MTT_TEST_FAIL_RANK", "0") and FailingModel.calls > int(
            os.environ.get("MTT_TEST_FAIL_AFTER", "0")
        ):
            raise ValueError("deliberate failure of the test architecture")
        return super().per_atom_outputs(batch)


__model__ = FailingModel
__hypers__ = FailingHypers
__maintainers__ = ["The Test Maintainers <tests@example.org>"]
