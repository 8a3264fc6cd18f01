"""Seeded regression of SOAP-BPNN: the same seed gives the same numbers, release to release.

To regenerate after a deliberate change of a model, run
``MTT_REGENERATE=1 python -m pytest tests/test_regression.py -s -k <architecture>`` and
paste the printed lists below, saying in the commit message why the numbers changed.
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


def _predictions(name: str, hypers: dict) -> tuple[list[float], list[float]]:
    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", True, False)})
    architecture = load(name)
    torch.manual_seed(1234)
    model = architecture.model_class(parse_options(architecture.hypers_class, hypers, ""), info).double()
    structures = emt_structures(3, seed=5)
    compute_neighbor_lists(structures, model.requested_neighbor_lists())
    model.adapt_to_data([make_batch(structures, torch.float64, torch.device("cpu"), False, False).flat])
    batch = make_batch(structures, torch.float64, torch.device("cpu"), True, False)
    predictions = predict(model, batch, info, create_graph=False)
    return predictions.values["energy"].reshape(-1).tolist(), predictions.forces["energy"][:3].reshape(-1).tolist()


def _check(energies: list[float], forces: list[float], expected_energies: list[float], expected_forces: list[float]):
    if os.environ.get("MTT_REGENERATE"):
        print(f"EXPECTED_ENERGIES = {energies!r}\nEXPECTED_FORCES = {forces!r}")
        return
    torch.testing.assert_close(torch.tensor(energies), torch.tensor(expected_energies), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.tensor(forces), torch.tensor(expected_forces), rtol=1e-7, atol=1e-10)


def test_soap_bpnn_predictions_are_reproducible():
    _check(*_predictions("soap_bpnn", {}), EXPECTED_ENERGIES, EXPECTED_FORCES)


#: a small message-passing model, its weights drawn from the seed
MP_HYPERS = {"channels": 8, "max_l": 2, "correlation": 3, "radial_mlp": [16]}
EXPECTED_MP_ENERGIES = [-1.8530257531992333, -0.3966814542077033, -1.244457043776888]
EXPECTED_MP_FORCES = [
    -0.004150540193340476,
    0.00036701116043659114,
    0.0010260812385805157,
    -0.00020696962348228348,
    -0.0024538892169719277,
    -0.0018410565940163684,
    0.003023502313853622,
    0.0010442931598678594,
    0.00042663513344751386,
]


def test_equivariant_mp_predictions_are_reproducible():
    _check(*_predictions("equivariant_mp", MP_HYPERS), EXPECTED_MP_ENERGIES, EXPECTED_MP_FORCES)
