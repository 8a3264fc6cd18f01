"""Seeded regression of SOAP-BPNN: the same seed gives the same numbers, release to release.

To regenerate after a deliberate change of the model, run
``MTT_REGENERATE=1 python -m pytest tests/test_regression.py -s`` and paste the printed
lists below, saying in the commit message why the numbers changed.
"""

from __future__ import annotations

import os

import torch

from mtt.architectures import load
from mtt.data.batching import compute_neighbor_lists, make_batch
from mtt.data.dataset import DatasetInfo
from mtt.data.readers import TargetInfo
from mtt.schema import parse_options
from mtt.testing import emt_structures
from mtt.training.predictions import predict

EXPECTED_ENERGIES = [-0.8152860250190384, -0.637789139299326, -0.300583967332519]
EXPECTED_FORCES = [
    -0.05697327706388887,
    -0.007532661366997614,
    0.00612235613418091,
    0.02133911892138485,
    -0.02896209850345837,
    -0.027593672091131113,
    0.04284458535775613,
    0.017055213200277718,
    0.019165211112018427,
]


def test_soap_bpnn_predictions_are_reproducible():
    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", True, False)})
    architecture = load("soap_bpnn")
    torch.manual_seed(1234)
    model = architecture.model_class(parse_options(architecture.hypers_class, {}, ""), info).double()
    structures = emt_structures(3, seed=5)
    compute_neighbor_lists(structures, model.requested_neighbor_lists())
    batch = make_batch(structures, torch.float64, torch.device("cpu"), True, False)
    predictions = predict(model, batch, info, create_graph=False)
    energies = predictions.values["energy"].tolist()
    forces = predictions.forces["energy"][:3].reshape(-1).tolist()
    if os.environ.get("MTT_REGENERATE"):
        print(f"EXPECTED_ENERGIES = {energies!r}\nEXPECTED_FORCES = {forces!r}")
        return
    torch.testing.assert_close(torch.tensor(energies), torch.tensor(EXPECTED_ENERGIES), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.tensor(forces), torch.tensor(EXPECTED_FORCES), rtol=1e-7, atol=1e-10)
