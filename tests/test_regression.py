"""Seeded regression of SOAP-BPNN: the same seed gives the same numbers, release to release.

To regenerate after a deliberate change of the model, run
``MTT_REGENERATE=1 python -m pytest tests/test_regression.py -s`` and paste the printed
lists below, saying in the commit message why the numbers changed.
"""

from __future__ import annotations

import os

import torch

from mtt.architectures import load
from mtt.architectures.testing import emt_structures
from mtt.config.schema import parse_options
from mtt.data.batching import compute_neighbor_lists, make_batch
from mtt.data.dataset import DatasetInfo
from mtt.data.readers import TargetInfo
from mtt.training.predictions import predict

EXPECTED_ENERGIES = [-0.8152860250228193, -0.637789138391328, -0.3005839679105359]
EXPECTED_FORCES = [
    -0.056973273784498006, -0.007532658592473013, 0.006122367279831846,
    0.021339119908785772, -0.028962107119566382, -0.027593674380215025,
    0.04284457353429613, 0.017055212075359837, 0.019165211663779432,
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
