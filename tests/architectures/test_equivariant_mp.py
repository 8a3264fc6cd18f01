import math

import numpy as np
import pytest
import torch

from mtt.architectures import load
from mtt.architectures.equivariant_mp.products import SymmetricProduct, symmetric_basis
from mtt.architectures.spherical import SphericalHarmonics, clebsch_gordan, random_rotations, wigner_d
from mtt.data.batching import compute_neighbor_lists, make_batch
from mtt.data.dataset import DatasetInfo
from mtt.data.readers import Structure, TargetInfo
from mtt.schema import parse_options
from mtt.testing import ArchitectureTests, emt_structures

SMALL = {"channels": 4, "max_l": 2, "hidden_l": 1, "correlation": 2, "radial_mlp": [8], "cutoff": 4.0}


class TestEquivariantMp(ArchitectureTests):
    name = "equivariant_mp"
    # small: the contract does not depend on the size
    hypers = SMALL


def _model(hypers: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    architecture = load("equivariant_mp")
    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", True, True)})
    return architecture.model_class(parse_options(architecture.hypers_class, hypers, ""), info).double()


def _rotated(structure: Structure, rotation: np.ndarray) -> Structure:
    matrix = torch.tensor(rotation)
    return Structure(structure.types, structure.positions @ matrix.T, structure.cell @ matrix.T, structure.pbc)


@pytest.mark.parametrize("hypers", [SMALL, {**SMALL, "max_l": 3, "hidden_l": 2, "correlation": 3}])
def test_internal_features_rotate_with_the_structure(hypers):
    """Every layer's one-particle basis (degrees up to max_l) and features (up to hidden_l)
    turn by the Wigner matrices of the rotation of the structure: the model is equivariant
    inside, not only invariant at its output."""
    model = _model(hypers)
    captured = {}
    for number, layer in enumerate(model.layers):
        # the one-particle basis is (components, channels, atoms): compared as (atoms, channels, components)
        layer.interaction.register_forward_hook(
            lambda m, i, o, n=number: captured.__setitem__(("basis", n), o.permute(2, 1, 0))
        )
        layer.register_forward_hook(lambda m, i, o, n=number: captured.__setitem__(("features", n), o))
    structure = emt_structures(1)[0]
    rotation = random_rotations(1, seed=4)[0]
    results = []
    for moved in (structure, _rotated(structure, rotation)):
        captured.clear()
        compute_neighbor_lists([moved], model.requested_neighbor_lists())
        model.per_atom_outputs(make_batch([moved], torch.float64, torch.device("cpu"), False, False).flat)
        results.append(dict(captured))
    checked = 0
    for key, before in results[0].items():
        after = results[1][key]
        for l in range(int(math.isqrt(before.shape[2]))):
            block = slice(l * l, (l + 1) ** 2)
            expected = before[:, :, block] @ torch.tensor(wigner_d(l, rotation)).T
            torch.testing.assert_close(after[:, :, block], expected, rtol=1e-9, atol=1e-10)
            checked += l > 0 and bool(before[:, :, block].abs().max() > 1e-6)
    assert checked >= 3  # non-zero features of degree l > 0 were compared


def test_couplings_and_the_product_basis_are_equivariant():
    """The Clebsch-Gordan couplings and the symmetric product basis map rotated inputs to
    rotated outputs, in the real harmonics' own convention."""
    rotation = random_rotations(1, seed=7)[0]
    rng = np.random.default_rng(0)
    for l1, l2, l3 in [(1, 1, 0), (1, 1, 1), (2, 1, 3), (3, 3, 2), (2, 2, 4)]:
        coupling = clebsch_gordan(l1, l2, l3)
        x, y = rng.normal(size=2 * l1 + 1), rng.normal(size=2 * l2 + 1)
        out = np.einsum("abc,a,b->c", coupling, x, y)
        turned = np.einsum("abc,a,b->c", coupling, wigner_d(l1, rotation) @ x, wigner_d(l2, rotation) @ y)
        np.testing.assert_allclose(turned, wigner_d(l3, rotation) @ out, atol=1e-12)
    # the whole one-particle basis, degrees 0 to 2, raised to the third power onto degree 1
    d = np.zeros((9, 9))
    for l in range(3):
        d[l * l : (l + 1) ** 2, l * l : (l + 1) ** 2] = wigner_d(l, rotation)
    basis = symmetric_basis(2, 3, 1)
    assert len(basis) > 0
    a = rng.normal(size=9)
    values = np.einsum("pijkm,i,j,k->pm", basis, a, a, a)
    turned = np.einsum("pijkm,i,j,k->pm", basis, d @ a, d @ a, d @ a)
    np.testing.assert_allclose(turned, values @ wigner_d(1, rotation).T, atol=1e-10)


@pytest.mark.parametrize("max_l, out_l, correlation", [(2, 1, 3), (1, 1, 2), (1, 0, 1), (1, 1, 4), (3, 0, 3)])
def test_the_product_is_the_contraction_of_its_symmetric_basis(max_l, out_l, correlation):
    """However the product evaluates it (prefixes, last factors), each atom's features are
    sum over nu and l of its element's weights times U_nu,l contracted with nu copies of A."""
    channels, counts = 3, [4, 0, 5]
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the basis is built in the default dtype
    try:
        product = SymmetricProduct(max_l, out_l, correlation, channels, len(counts))
    finally:
        torch.set_default_dtype(default)
    a = torch.randn((max_l + 1) ** 2, channels, sum(counts), dtype=torch.float64)
    element = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    weights = product.weights.detach()[element]  # (atoms, functions, channels)
    expected = torch.zeros(channels, (out_l + 1) ** 2, sum(counts), dtype=torch.float64)
    function = 0
    for nu in range(1, correlation + 1):
        for l in range(out_l + 1):
            for u in torch.tensor(symmetric_basis(max_l, nu, l)):
                value = torch.einsum("i...,ica->...ca", u, a)
                for _ in range(nu - 1):  # contract the next factor with A, for each channel and atom
                    value = torch.einsum("i...ca,ica->...ca", value, a)
                # each function's weight starts at order one: the module scales its basis by 3
                expected[:, l * l : (l + 1) ** 2] += 3.0 * value.permute(1, 0, 2) * weights[:, function].T[:, None]
                function += 1
    assert function == product.weights.shape[1]
    torch.testing.assert_close(product(a, counts), expected, rtol=1e-12, atol=1e-12)


def test_harmonics_are_orthonormal_polynomials():
    """The harmonics, scaled as the model uses them, have a mean square of 1 over the sphere."""
    points = torch.randn(200_000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    points = points / points.norm(dim=1, keepdim=True)
    values = SphericalHarmonics(3, compact=True, scale=math.sqrt(4 * math.pi))(points)
    gram = values.T @ values / len(points)
    torch.testing.assert_close(gram, torch.eye(16, dtype=torch.float64), atol=2e-2, rtol=0)


def test_float32_model_gives_the_float64_numbers_to_float32_precision():
    model = _model(SMALL)
    structures = emt_structures(2)
    compute_neighbor_lists(structures, model.requested_neighbor_lists())
    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", True, True)})
    from mtt.training.predictions import predict

    double = predict(model, make_batch(structures, torch.float64, torch.device("cpu"), True, True), info, False)
    model32 = model.float()
    single = predict(model32, make_batch(structures, torch.float32, torch.device("cpu"), True, True), info, False)
    torch.testing.assert_close(single.values["energy"].double(), double.values["energy"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(single.forces["energy"].double(), double.forces["energy"], rtol=1e-4, atol=1e-5)


def test_the_interaction_range_is_the_layers_times_the_cutoff(tmp_path):
    """LAMMPS' domain decomposition needs the range of the whole model, not of one layer."""
    from mtt.export import atomistic_model

    model = _model({**SMALL, "num_layers": 3, "cutoff": 4.5})
    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", True, True)})
    capabilities = atomistic_model(model, info, load("equivariant_mp")).capabilities()
    assert capabilities.interaction_range == pytest.approx(13.5)
    assert model.requested_neighbor_lists()[0].cutoff == pytest.approx(4.5)
