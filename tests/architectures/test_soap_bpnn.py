from mtt.testing import ArchitectureTests


class TestSoapBpnn(ArchitectureTests):
    name = "soap_bpnn"
    # small descriptor: the contract does not depend on its size
    hypers = {"soap": {"max_radial": 3, "max_angular": 2}}


# -- the torch SOAP power spectrum against featomic's ---------------------------------------
import ase.build  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from featomic.torch import SoapPowerSpectrum as FeatomicPowerSpectrum  # noqa: E402
from metatensor.torch import Labels  # noqa: E402
from metatomic.torch import System, register_autograd_neighbors  # noqa: E402
from vesin.metatomic import NeighborList  # noqa: E402

from mtt.architectures.soap_bpnn.soap import SoapPowerSpectrum, featomic_hypers  # noqa: E402
from mtt.data.flat_batch import batch_of_systems  # noqa: E402


def _systems(frames, options):
    systems = []
    for atoms in frames:
        types = torch.tensor(atoms.numbers, dtype=torch.int32)
        positions = torch.tensor(atoms.positions)
        cell, pbc = torch.tensor(np.array(atoms.cell)), torch.tensor(atoms.pbc)
        neighbors = NeighborList(options, "angstrom").compute(System(types, positions, cell, pbc))
        system = System(types, positions.requires_grad_(True), cell, pbc)
        register_autograd_neighbors(system, neighbors)
        system.add_neighbor_list(options, neighbors)
        systems.append(system)
    return systems


def _frames():
    rng = np.random.default_rng(3)
    molecule = ase.build.molecule("CH3CH2OH")
    crystal = ase.build.bulk("Cu", "fcc", a=3.6) * (2, 2, 2)
    crystal.numbers[:3] = 79
    crystal.positions += 0.1 * rng.standard_normal(crystal.positions.shape)
    thin = ase.build.bulk("C", "diamond", a=3.57)  # neighbours along the axes, and own images
    thin.positions[1] += [0.05, -0.03, 0.02]
    return [molecule, crystal, thin]


@pytest.mark.parametrize("max_angular, max_radial", [(6, 7), (3, 2)])
def test_torch_soap_equals_featomic(max_angular, max_radial):
    """Features and their position derivatives match featomic's to its spline accuracy."""
    frames = _frames()
    types = sorted({int(z) for atoms in frames for z in atoms.numbers})
    hypers = featomic_hypers(4.5, 0.5, max_angular, max_radial, 0.3)
    ours = SoapPowerSpectrum(types, 4.5, 0.5, max_angular, max_radial, 0.3)
    reference = FeatomicPowerSpectrum(**hypers)
    pairs = Labels(
        ["neighbor_1_type", "neighbor_2_type"],
        torch.tensor([[a, b] for a in types for b in types if a <= b]),
    )
    weights = torch.randn(ours.n_features, dtype=torch.float64)

    our_systems = _systems(frames, ours.requested_neighbor_lists()[0])
    batch = batch_of_systems(our_systems, ours.requested_neighbor_lists())
    our_pairs = batch.neighbors[0]
    our_features = ours(batch.types, our_pairs.first, our_pairs.second, our_pairs.vectors)
    reference_systems = _systems(frames, reference.requested_neighbor_lists()[0])
    features = reference(reference_systems).keys_to_properties(pairs)
    first_atom = np.cumsum([0] + [len(atoms) for atoms in frames])
    expected = torch.zeros_like(our_features)
    for block in features.blocks():
        samples = block.samples.values
        expected[torch.tensor(first_atom)[samples[:, 0]] + samples[:, 1]] = block.values
    assert torch.allclose(our_features, expected, rtol=0, atol=1e-7 * float(expected.detach().abs().max()))

    our_forces = torch.autograd.grad((our_features @ weights).sum(), [s.positions for s in our_systems])
    forces = torch.autograd.grad((expected @ weights).sum(), [s.positions for s in reference_systems])
    scale = max(float(f.abs().max()) for f in forces)
    for mine, theirs in zip(our_forces, forces):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-6 * scale)


def test_training_keeps_the_descriptor():
    """The trainer keeps, per structure, the features as the networks take them and, when
    forces or stress are trained, all their derivatives need; within the budget only."""
    from mtt.architectures import load
    from mtt.data.batching import compute_neighbor_lists, flat_batch_of, make_batch
    from mtt.data.dataset import DatasetInfo
    from mtt.data.readers import TargetInfo
    from mtt.schema import parse_options
    from mtt.testing import emt_structures
    from mtt.training.cache import PrecomputedInputs

    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", False, False)})
    architecture = load("soap_bpnn")
    model = architecture.model_class(parse_options(architecture.hypers_class, {}, ""), info)
    structures = emt_structures(2)
    compute_neighbor_lists(structures, model.requested_neighbor_lists())
    n_atoms = sum(len(s) for s in structures)
    n_pairs = sum(len(s.neighbors[0][1].samples) for s in structures)
    soap = model.soap

    def batch_of(structure):
        return flat_batch_of(structure, torch.float32, torch.device("cpu"))

    energy_only = PrecomputedInputs(model, derivatives=False, budget_mb=100, batch_of=batch_of)
    batch = make_batch(structures, torch.float32, torch.device("cpu"), False, False, keep=energy_only.keep)
    assert sorted(batch.flat.data) == ["mtt::soap_inputs"]
    assert energy_only.used == n_atoms * soap.n_features * 4

    with_forces = PrecomputedInputs(model, derivatives=True, budget_mb=100, batch_of=batch_of)
    batch = make_batch(structures, torch.float32, torch.device("cpu"), True, False, keep=with_forces.keep)
    assert sorted(batch.flat.data) == ["mtt::soap_atoms", "mtt::soap_inputs", "mtt::soap_pairs"]
    size, width = soap.max_angular + 1, 2 * soap.max_angular + 1
    per_atom = soap.n_features + 2 + size * soap.n_types * soap.n_radial * width
    per_pair = 3 + 1 + 2 * size * soap.n_radial + 4 * size * width + 2
    assert with_forces.used == (n_atoms * per_atom + n_pairs * per_pair) * 4

    too_small = PrecomputedInputs(model, derivatives=True, budget_mb=1e-3, batch_of=batch_of)
    fresh = emt_structures(2)
    compute_neighbor_lists(fresh, model.requested_neighbor_lists())
    batch = make_batch(fresh, torch.float32, torch.device("cpu"), True, False, keep=too_small.keep)
    assert too_small.full and not batch.flat.data


def test_hand_written_derivatives_equal_autograd():
    """The training path's features, pair-vector gradient and its derivative with respect to
    the incoming gradient (what a force-training step needs) equal autograd's through the
    plain torch operations, for molecules, crystals, a cell that sees its own images and a
    lone atom without neighbours."""
    from mtt.architectures.soap_bpnn.derivatives import SoapFeatures

    lone = ase.Atoms("CO", positions=[[0, 0, 0], [9, 0, 0]])
    frames = _frames() + [lone]
    types = sorted({int(z) for atoms in frames for z in atoms.numbers})
    soap = SoapPowerSpectrum(types, 4.5, 0.5, 4, 3, 0.3)
    systems = _systems(frames, soap.requested_neighbor_lists()[0])
    batch = batch_of_systems(systems, soap.requested_neighbor_lists())
    pairs = batch.neighbors[0]
    species, first, second, vectors = batch.types, pairs.first, pairs.second, pairs.vectors
    generator = torch.Generator().manual_seed(0)
    for eps in (None, 1e-5):
        plain = soap.power_spectrum(soap.expansion(species, first, second, vectors), len(species))
        if eps is not None:
            plain = torch.nn.functional.layer_norm(plain, plain.shape[1:], eps=eps)
        ours = SoapFeatures.apply(vectors, soap, species, first, second, eps)
        torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12 * float(plain.detach().abs().max()))

        incoming = torch.randn(plain.shape, dtype=torch.float64, generator=generator).requires_grad_(True)
        direction = torch.randn(vectors.shape, dtype=torch.float64, generator=generator)
        results = []
        for features in (plain, ours):
            (gradient,) = torch.autograd.grad(
                (features * incoming).sum(), vectors, create_graph=True, retain_graph=True
            )
            (derivative,) = torch.autograd.grad((gradient * direction).sum(), incoming)
            results.append((gradient, derivative))
        (expected_gradient, expected_derivative), (gradient, derivative) = results
        torch.testing.assert_close(
            gradient, expected_gradient, rtol=0, atol=1e-12 * float(expected_gradient.detach().abs().max())
        )
        torch.testing.assert_close(
            derivative, expected_derivative, rtol=0, atol=1e-12 * float(expected_derivative.abs().max())
        )
