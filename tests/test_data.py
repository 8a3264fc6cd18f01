"""Reading datasets: units, the keys real files use, stress and virial, and splits.

Every test goes the way a run does: an options file composed by
:func:`mtt.config.load_options`, then :func:`mtt.data.dataset.load_splits`. Values are
compared with the file read by ASE and converted with ``ase.units``.
"""

from __future__ import annotations

from pathlib import Path

import ase
import ase.build
import ase.io
import ase.units
import numpy as np
import pytest
from ase.calculators.singlepoint import SinglePointCalculator
from conftest import EMT_DATA, write_options

from mtt.config import load_options
from mtt.data.dataset import Splits, load_splits
from mtt.errors import DataError, OptionsError

#: a stress with distinct components, in ASE's Voigt order xx yy zz yz xz xy
VOIGT = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) * 1e-2
FULL = np.array([[1.0, 6.0, 5.0], [6.0, 2.0, 4.0], [5.0, 4.0, 3.0]]) * 1e-2


def load(folder: Path, text: str, seed: int = 0) -> Splits:
    options = load_options(write_options(folder, text))
    return load_splits(options.raw, folder, seed)


def by_index(splits: Splits) -> list:
    """Every structure of every set, in the order of the file."""
    origins = splits.origins["training"] + splits.origins["validation"] + splits.origins["test"]
    structures = splits.train.structures + splits.validation.structures + splits.test.structures
    return [s for _, s in sorted(zip([i for _, i in origins], structures), key=lambda pair: pair[0])]


def single_set(read_from: str, targets: str, length_unit: str = "angstrom") -> str:
    """Options that put every structure of the file in the training or validation set."""
    return (
        f"training_set:\n  systems:\n    read_from: {read_from}\n    length_unit: {length_unit}\n"
        f"  targets:\n{targets}"
        "validation_set: 0.25\ntest_set: 0\n"
    )


def copper_cells(n: int = 4) -> list[ase.Atoms]:
    """Periodic cells with energy, forces and stress (through a calculator, as ASE reads them)."""
    rng = np.random.default_rng(0)
    frames = []
    for i in range(n):
        atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.05, seed=i)
        atoms.calc = SinglePointCalculator(
            atoms,
            energy=-14.0 + 0.1 * i,
            forces=rng.normal(size=(len(atoms), 3)),
            stress=VOIGT * (i + 1),
        )
        frames.append(atoms)
    return frames


@pytest.fixture
def cells(tmp_path: Path) -> list[ase.Atoms]:
    frames = copper_cells()
    ase.io.write(tmp_path / "cells.xyz", frames)
    return ase.io.read(tmp_path / "cells.xyz", ":")


# -- units ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "unit, factor",
    [
        ("eV", 1.0),
        ("meV", 1e-3),
        ("kcal/mol", ase.units.kcal / ase.units.mol),
        ("kJ/mol", ase.units.kJ / ase.units.mol),
        ("Hartree", ase.units.Hartree),
        ("hartree", ase.units.Hartree),
        ("Ry", ase.units.Rydberg),
    ],
)
def test_energy_units(tmp_path, cells, unit, factor):
    splits = load(tmp_path, single_set("cells.xyz", f"    energy: {{key: energy, unit: {unit}}}\n"))
    assert splits.info.targets["energy"].unit == "eV"
    for atoms, structure in zip(cells, by_index(splits)):
        assert float(structure.values["energy"]) == pytest.approx(atoms.get_potential_energy() * factor, rel=1e-14)
        np.testing.assert_allclose(structure.forces["energy"].numpy(), atoms.get_forces() * factor, rtol=1e-14)
        np.testing.assert_allclose(
            structure.stress["energy"].numpy(), atoms.get_stress(voigt=False) * factor, rtol=1e-14
        )


@pytest.mark.parametrize(
    "unit, factor", [("angstrom", 1.0), ("bohr", ase.units.Bohr), ("Bohr", ase.units.Bohr), ("nm", 10.0)]
)
def test_length_units(tmp_path, cells, unit, factor):
    splits = load(tmp_path, single_set("cells.xyz", "    energy: {key: energy, unit: eV}\n", unit))
    for atoms, structure in zip(cells, by_index(splits)):
        np.testing.assert_allclose(structure.positions.numpy(), atoms.positions * factor, rtol=1e-14)
        np.testing.assert_allclose(structure.cell.numpy(), atoms.cell.array * factor, rtol=1e-14)
        # energy per length and per volume: eV/Å and eV/Å^3
        np.testing.assert_allclose(structure.forces["energy"].numpy(), atoms.get_forces() / factor, rtol=1e-14)
        np.testing.assert_allclose(
            structure.stress["energy"].numpy(), atoms.get_stress(voigt=False) / factor**3, rtol=1e-14
        )
        assert float(structure.values["energy"]) == atoms.get_potential_energy()


def test_unknown_length_unit(tmp_path, cells):
    """Also given on the command line, on a file given in the short form; found with the
    other problems of the options, before any data is read."""
    with pytest.raises(
        OptionsError, match="unknown length unit 'bhor' in 'training_set.systems.length_unit'. Did you mean 'bohr'"
    ):
        load_options(write_options(tmp_path, "training_set: cells.xyz\n"), ["training_set.systems.length_unit=bhor"])


def test_energies_keep_double_precision(tmp_path, shared_data):
    """rMD17 ethanol energies are ~ -4200 eV: float32 would round them by a quarter meV."""
    path = shared_data / "ethanol_reduced_100.xyz"
    splits = load(tmp_path, single_set(str(path), "    energy: {key: energy, unit: kcal/mol}\n"))
    factor = ase.units.kcal / ase.units.mol
    frames = ase.io.read(path, ":")
    for atoms, structure in zip(frames, by_index(splits)):
        assert structure.values["energy"].dtype.is_floating_point
        assert float(structure.values["energy"]) == pytest.approx(
            atoms.get_potential_energy() * factor, rel=1e-14, abs=0
        )
        np.testing.assert_allclose(structure.forces["energy"].numpy(), atoms.get_forces() * factor, rtol=1e-14)


def test_qm9_u0_in_hartree(tmp_path, shared_data):
    path = shared_data / "qm9_reduced_100.xyz"
    frames = ase.io.read(path, ":")

    splits = load(tmp_path, single_set(str(path), "    U0: {key: U0, unit: Hartree}\n    mu: {unit: Debye}\n"))
    assert splits.info.targets["U0"].unit == "eV"
    assert splits.info.targets["mu"].unit == "e*angstrom"
    for atoms, structure in zip(frames, by_index(splits)):
        assert float(structure.values["U0"]) == pytest.approx(atoms.info["U0"] * ase.units.Hartree, rel=1e-14)
        assert float(structure.values["mu"]) == pytest.approx(atoms.info["mu"] * ase.units.Debye, rel=1e-14)

    # as the energy of a molecule: no forces in the file, so none are learned
    splits = load(tmp_path, single_set(str(path), "    energy: {key: U0, unit: hartree}\n"))
    target = splits.info.targets["energy"]
    assert target.unit == "eV" and not target.forces and not target.stress
    assert float(by_index(splits)[0].values["energy"]) == pytest.approx(frames[0].info["U0"] * ase.units.Hartree)


# -- the keys real files use -----------------------------------------------------------------


def test_carbon_force_key_and_virial(tmp_path, shared_data):
    """carbon: 'force' (singular) given in the options; its 'virial' becomes the stress."""
    path = shared_data / "carbon_reduced_100.xyz"
    frames = ase.io.read(path, ":")
    splits = load(tmp_path, single_set(str(path), "    energy: {key: energy, unit: eV, forces: force}\n"))
    target = splits.info.targets["energy"]
    assert target.forces and target.stress
    for atoms, structure in zip(frames, by_index(splits)):
        np.testing.assert_allclose(structure.forces["energy"].numpy(), atoms.arrays["force"], rtol=1e-14)
        volume = abs(np.linalg.det(atoms.cell.array))
        expected = -np.asarray(atoms.info["virial"]).reshape(3, 3) / volume
        np.testing.assert_allclose(structure.stress["energy"].numpy(), expected, rtol=1e-12)


def test_forces_found_under_force_or_forces(tmp_path, shared_data):
    """'forces: on' and the default both find carbon's 'force' (singular) array."""
    path = shared_data / "carbon_reduced_100.xyz"
    frames = ase.io.read(path, ":")
    for forces in ("on", None):
        option = "" if forces is None else f", forces: {forces}"
        splits = load(tmp_path, single_set(str(path), f"    energy: {{key: energy, unit: eV{option}}}\n"))
        assert splits.info.targets["energy"].forces
        structure = by_index(splits)[0]
        np.testing.assert_allclose(structure.forces["energy"].numpy(), frames[0].arrays["force"], rtol=1e-14)


def test_forces_on_without_forces_names_the_keys_the_file_has(tmp_path, shared_data):
    path = shared_data / "qm9_reduced_100.xyz"
    with pytest.raises(DataError) as error:
        load(tmp_path, single_set(str(path), "    energy: {key: U0, unit: Hartree, forces: on}\n"))
    message = str(error.value)
    assert "'forces' not found" in message and "qm9_reduced_100.xyz" in message
    assert "U0" in message  # the keys the file does have are listed


def test_virial_in_other_units(tmp_path, cells):
    for i, atoms in enumerate(cells):
        atoms.calc = None
        atoms.info["energy"] = -14.0
        atoms.info["virial"] = FULL * (i + 1)
    ase.io.write(tmp_path / "virial.xyz", cells)
    splits = load(tmp_path, single_set("virial.xyz", "    energy: {key: energy, unit: kcal/mol}\n", length_unit="bohr"))
    factor = ase.units.kcal / ase.units.mol
    for i, (atoms, structure) in enumerate(zip(cells, by_index(splits))):
        volume = abs(np.linalg.det(atoms.cell.array)) * ase.units.Bohr**3
        np.testing.assert_allclose(structure.stress["energy"].numpy(), -FULL * (i + 1) * factor / volume, rtol=1e-12)


@pytest.mark.parametrize("key", ["stress", "voigt6", "full9"])
def test_stress_as_3x3_or_voigt(tmp_path, cells, key):
    for i, atoms in enumerate(cells):
        atoms.info["voigt6"] = VOIGT * (i + 1)
        atoms.info["full9"] = FULL.reshape(9) * (i + 1)
    ase.io.write(tmp_path / "cells.xyz", cells)
    splits = load(tmp_path, single_set("cells.xyz", f"    energy: {{key: energy, unit: eV, stress: {key}}}\n"))
    for i, structure in enumerate(by_index(splits)):
        np.testing.assert_allclose(structure.stress["energy"].numpy(), FULL * (i + 1), rtol=1e-14)


def test_stress_of_the_wrong_size(tmp_path, cells):
    for atoms in cells:
        atoms.info["bad_stress"] = np.arange(4.0)
    ase.io.write(tmp_path / "cells.xyz", cells)
    with pytest.raises(DataError, match="'bad_stress'.*4 values.*3x3"):
        load(tmp_path, single_set("cells.xyz", "    energy: {key: energy, unit: eV, stress: bad_stress}\n"))


def test_forces_off(tmp_path, cells):
    splits = load(tmp_path, single_set("cells.xyz", "    energy: {key: energy, unit: eV, forces: off}\n"))
    target = splits.info.targets["energy"]
    assert not target.forces and target.stress
    assert all(not s.forces and s.stress for s in by_index(splits))


# -- stress needs a periodic cell ------------------------------------------------------------


def test_stress_requested_for_molecules(tmp_path):
    molecules = [ase.build.molecule(name) for name in ("H2O", "CH4", "NH3", "CO2")]
    for i, atoms in enumerate(molecules):
        atoms.info["energy"] = -10.0 - i
    ase.io.write(tmp_path / "molecules.xyz", molecules)
    with pytest.raises(DataError) as error:
        load(tmp_path, single_set("molecules.xyz", "    energy: {key: energy, unit: eV, stress: on}\n"))
    message = str(error.value)
    assert "structure 0" in message and "molecules.xyz" in message
    assert "not periodic" in message and "stress: off" in message


def test_stress_of_a_slab(tmp_path, cells):
    for atoms in cells:
        atoms.pbc = (True, True, False)
    ase.io.write(tmp_path / "slabs.xyz", cells)
    with pytest.raises(DataError, match="not periodic in all directions"):
        load(tmp_path, single_set("slabs.xyz", "    energy: {key: energy, unit: eV}\n"))
    # switching the stress off reads the slabs
    splits = load(tmp_path, single_set("slabs.xyz", "    energy: {key: energy, unit: eV, stress: off}\n"))
    assert not splits.info.targets["energy"].stress and splits.info.targets["energy"].forces


# -- splits ----------------------------------------------------------------------------------


def test_splits_are_reproducible_and_disjoint(tmp_path):
    text = f"training_set: {EMT_DATA}\nvalidation_set: 0.1\ntest_set: 0.1\n"
    first = load(tmp_path, text, seed=7)
    again = load(tmp_path, text, seed=7)
    other = load(tmp_path, text, seed=8)

    assert again.origins == first.origins
    assert other.origins != first.origins
    sets = [{i for _, i in first.origins[name]} for name in ("training", "validation", "test")]
    assert [len(s) for s in sets] == [80, 10, 10]
    assert sets[0] | sets[1] | sets[2] == set(range(100))
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    # the structures are those the indices name
    frames = ase.io.read(EMT_DATA, ":")
    for (_, index), structure in zip(first.origins["validation"], first.validation.structures):
        assert structure.types.tolist() == frames[index].numbers.tolist()


def test_batches_reuse_systems_and_their_derivatives_stay_right():
    """A structure's system is built once; its kept link to the neighbour vectors gives the
    same forces, stress and weight gradients at every step as a freshly built one."""
    import torch

    from mtt.architectures import load
    from mtt.data.batching import compute_neighbor_lists, make_batch
    from mtt.data.dataset import DatasetInfo
    from mtt.data.readers import TargetInfo
    from mtt.schema import parse_options
    from mtt.testing import emt_structures
    from mtt.training.predictions import predict

    info = DatasetInfo([29, 78, 79], {"energy": TargetInfo("energy", "energy", "eV", True, True)})
    architecture = load("soap_bpnn")
    torch.manual_seed(0)
    model = architecture.model_class(parse_options(architecture.hypers_class, {}, ""), info).double()
    weights = list(model.parameters())

    def step(structures):
        batch = make_batch(structures, torch.float64, torch.device("cpu"), True, True, flat=False)
        predictions = predict(model, batch, info, create_graph=True)
        loss = sum(getattr(predictions, kind)["energy"].square().sum() for kind in ("values", "forces", "stress"))
        model.zero_grad()
        loss.backward(inputs=weights)
        return batch, [predictions.forces["energy"], predictions.stress["energy"]] + [w.grad.clone() for w in weights]

    structures = emt_structures(3, seed=2)
    compute_neighbor_lists(structures, model.requested_neighbor_lists())
    first_batch, first = step(structures)
    second_batch, second = step(structures)
    assert all(a is b for a, b in zip(first_batch.systems, second_batch.systems))

    fresh = emt_structures(3, seed=2)
    compute_neighbor_lists(fresh, model.requested_neighbor_lists())
    _, reference = step(fresh)
    for kept, again, new in zip(first, second, reference):
        torch.testing.assert_close(again, kept, rtol=0, atol=0)
        torch.testing.assert_close(new, kept, rtol=1e-12, atol=1e-14)
