"""Targets beyond energies, as users train them: per-atom values (partial charges, forces
learned directly), vectors per structure (dipole moments) and per atom, predicted
equivariantly, exported, evaluated; and the target options mtt does not support yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import pytest
from conftest import EMT_DATA, SMALL_SOAP, exported_outputs, run_mtt, write_options
from test_cli_errors import assert_user_error

SMALL_MP = "name: equivariant_mp\nmodel: {channels: 8, max_l: 1, hidden_l: 1, correlation: 2, num_layers: 2}"
CHARGES = "charges: {key: charges, sample_kind: atom, unit: e}"
DIPOLE = "dipole: {key: dipole, type: {cartesian: {rank: 1}}, unit: Debye}"


def options(architecture: str, targets: list[str], data: Path, epochs: int = 2) -> str:
    body = "".join(f"  {line}\n" for line in architecture.splitlines())
    lines = "".join(f"    {line}\n" for line in targets)
    return (
        # float64, as SOAP-BPNN's default: rotated vectors are compared to 1e-9
        f"seed: 5\nbase_precision: 64\narchitecture:\n{body}  training: {{num_epochs: {epochs}, batch_size: 16}}\n"
        f"training_set:\n  systems: {data}\n  targets:\n{lines}validation_set: 0.1\ntest_set: 0.1\n"
    )


@pytest.fixture(scope="module")
def molecules(shared_data, tmp_path_factory) -> Path:
    """200 ethanol configurations with GFN2-xTB charges (e) and dipoles, here in Debye."""
    folder = tmp_path_factory.mktemp("ethanol")
    frames = ase.io.read(shared_data / "ethanol_xtb_2000.xyz", "::10")
    for atoms in frames:
        atoms.calc.results["dipole"] = atoms.calc.results["dipole"] / ase.units.Debye
    ase.io.write(folder / "ethanol.xyz", frames)
    return folder / "ethanol.xyz"


def train(folder: Path, text: str, model: str = "model.pt") -> subprocess.CompletedProcess:
    write_options(folder, text)
    result = run_mtt("train", "options.yaml", "-o", model, cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


#: in a process that never imports mtt: the exported model's outputs on a molecule, rotated
#: and translated; its charges do not change, its dipole rotates with it
ROTATE = """
import sys, ase.io, numpy as np
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator
calculator = MetatomicCalculator(sys.argv[1], extensions_directory=sys.argv[1].replace("model.pt", "extensions"))
atoms = ase.io.read(sys.argv[2], index=0)
atoms.calc = None
angle = 0.7
rotation = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
rotation = rotation @ np.array([[1, 0, 0], [0, np.cos(1.1), -np.sin(1.1)], [0, np.sin(1.1), np.cos(1.1)]])
outputs = calculator._model.capabilities().outputs
requested = {name: ModelOutput(sample_kind=outputs[name].sample_kind) for name in outputs if name.startswith("mtt::")}
def predict(moved):
    results = calculator.run_model(moved, requested)
    return {name: result.block().values.detach().numpy() for name, result in results.items()}
before = predict(atoms)
moved = atoms.copy()
moved.positions = atoms.positions @ rotation.T + np.array([3.0, -1.0, 2.0])
if atoms.pbc.any():
    moved.cell = atoms.cell.array @ rotation.T
after = predict(moved)
for name, values in before.items():
    if values.ndim == 3:  # vectors: (samples, xyz, properties)
        expected = np.einsum("ij,sjp->sip", rotation, values)
    else:
        expected = values
    assert np.allclose(after[name], expected, atol=1e-9), (name, after[name], expected)
    assert np.abs(values).max() > 1e-6, name
print(sorted(before))
"""


@pytest.mark.parametrize("architecture", [SMALL_SOAP, SMALL_MP], ids=["soap_bpnn", "equivariant_mp"])
def test_charges_and_a_dipole_are_learned_exported_and_rotate(molecules, tmp_path, architecture):
    result = train(tmp_path, options(architecture, [CHARGES, DIPOLE], molecules, epochs=3))
    assert "learning charges [e] per atom, dipole [e*angstrom] vector" in result.stdout
    assert "charges RMSE [e]" in result.stdout and "dipole RMSE [e*angstrom]" in result.stdout
    checked = subprocess.run(
        [sys.executable, "-c", ROTATE, str(tmp_path / "model.pt"), str(molecules)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    assert "['mtt::charges', 'mtt::dipole']" in checked.stdout
    # mtt eval: a table, parity plots and the predictions beside the references
    write_options(tmp_path, f"systems: {molecules}\ntargets:\n  {CHARGES}\n  {DIPOLE}\n", "eval.yaml")
    evaluated = run_mtt("eval", "model.pt", "eval.yaml", "--plots", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "charges " in evaluated.stdout and "dipole " in evaluated.stdout
    assert (tmp_path / "predictions_parity_charges.png").is_file()
    assert (tmp_path / "predictions_parity_dipole.png").is_file()
    first = ase.io.read(tmp_path / "predictions.xyz", index=0)
    reference = ase.io.read(molecules, index=0)
    assert np.asarray(first.info["reference_dipole"]) == pytest.approx(
        reference.calc.results["dipole"] * ase.units.Debye
    )
    predicted = first.calc.results["dipole"]  # ASE's reader takes a dipole as a result of the structure
    assert predicted.shape == (3,) and first.arrays["reference_charges"].shape == (len(first),)


def test_vectors_per_atom_need_an_architecture_that_predicts_them(tmp_path):
    """Forces learned directly, as a vector per atom (equivariant_mp), or as metatrain's test
    options do, three scalars per atom (any architecture); SOAP-BPNN refuses vectors per atom."""
    direct = "direct: {key: forces, sample_kind: atom, type: {cartesian: {rank: 1}}}"
    result = train(tmp_path, options(SMALL_MP, [direct], EMT_DATA, epochs=1))
    assert "direct [] vector per atom" in result.stdout
    checked = subprocess.run(
        [sys.executable, "-c", ROTATE, str(tmp_path / "model.pt"), str(EMT_DATA)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr

    scalars = tmp_path / "scalars"
    scalars.mkdir()
    three = "direct: {key: forces, sample_kind: atom, num_subtargets: 3}"
    assert "direct [] x 3 per atom" in train(scalars, options(SMALL_SOAP, [three], EMT_DATA, epochs=1)).stdout

    refused = tmp_path / "refused"
    refused.mkdir()
    write_options(refused, options(SMALL_SOAP, [direct], EMT_DATA))
    assert_user_error(
        run_mtt("train", "options.yaml", cwd=refused), "'direct' is a vector per atom", "'soap_bpnn'", "equivariant_mp"
    )


@pytest.mark.parametrize(
    "target, words",
    [
        ("q: {key: charges, sample_kind: atom_pair}", ["sample_kind: atom_pair' is not supported yet"]),
        ("q: {key: stress, type: {cartesian: {rank: 2}}}", ["rank: 2}}' is not supported yet"]),
        ("q: {key: stress, type: {spherical: {irreps: [{o3_lambda: 2, o3_sigma: 1}]}}}", ["spherical' is not"]),
        ("energy: {key: energy, sample_kind: atom}", ["'training_set.targets.energy' is an energy", "per atom"]),
        ("q: {key: energy, sample_kind: atom}", ["target 'q' (key 'energy')", "expected 1 per atom"]),
    ],
)
def test_target_options_mtt_does_not_support_say_so(tmp_path, target, words):
    write_options(tmp_path, options(SMALL_SOAP, [target], EMT_DATA))
    assert_user_error(run_mtt("train", "options.yaml", cwd=tmp_path), *words)


def test_converting_a_per_atom_target_is_refused(molecules, tmp_path):
    write_options(tmp_path, f"systems: {molecules}\ntargets:\n  {CHARGES}\n", "dataset.yaml")
    result = run_mtt("data", "convert", "dataset.yaml", "-o", "charges", cwd=tmp_path)
    assert_user_error(result, "'charges'", "per atom", "cannot hold it yet")
    assert not list(tmp_path.glob("charges*"))


def write_variants(folder: Path) -> str:
    """Half of the EMT structures with their energies and forces, half with another "level of
    theory" (the energy scaled and shifted, no forces): the options of a run on both."""
    frames = ase.io.read(EMT_DATA, ":")
    ase.io.write(folder / "a.xyz", frames[::2])
    other = frames[1::2]
    for atoms in other:
        atoms.info["energy_b"] = 1.1 * atoms.get_potential_energy() + 0.2 * len(atoms)
        atoms.calc = None
    ase.io.write(folder / "b.xyz", other)
    return (
        f"seed: 2\narchitecture:\n  {SMALL_SOAP.replace(chr(10), chr(10) + '  ')}\n"
        "  training: {num_epochs: 2, batch_size: 8}\n"
        "training_set:\n"
        "  - {systems: a.xyz, targets: {energy: {key: energy, stress: off}}}\n"
        "  - {systems: b.xyz, targets: {energy/b: {key: energy_b}}}\n"
    )


def test_datasets_with_different_targets_train_one_model_with_both(tmp_path):
    """metatrain's variants: each structure contributes the losses of the targets it has."""
    write_options(tmp_path, write_variants(tmp_path))
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "learning energy [eV] + forces, energy/b [eV]" in result.stdout
    assert "energy/b per atom RMSE" in result.stdout
    assert {"energy", "energy/b"} <= set(exported_outputs(tmp_path / "model.pt"))
    # the run's test set holds structures of both files: each is evaluated on the targets its file has
    (run,) = tmp_path.glob("outputs/*/*")
    evaluated = run_mtt("eval", str(run), "--plots", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "energy per atom " in evaluated.stdout and "energy/b per atom " in evaluated.stdout
    assert "nan" not in evaluated.stdout
    assert (tmp_path / "predictions_parity_energy.png").is_file()


def test_a_target_read_with_two_units_in_one_set_is_refused(tmp_path):
    frames = ase.io.read(EMT_DATA, ":")
    ase.io.write(tmp_path / "a.xyz", frames[:50])
    ase.io.write(tmp_path / "b.xyz", frames[50:])
    text = (
        f"architecture:\n  {SMALL_SOAP.replace(chr(10), chr(10) + '  ')}\n"
        "training_set:\n"
        "  - {systems: a.xyz, targets: {q: {key: energy, unit: eV}}}\n"
        "  - {systems: b.xyz, targets: {q: {key: forces, sample_kind: atom, num_subtargets: 3}}}\n"
    )
    write_options(tmp_path, text)
    assert_user_error(
        run_mtt("train", "options.yaml", cwd=tmp_path), "'training_set[1]' reads target 'q'", "x 3 per atom"
    )


def test_an_equivariant_mp_checkpoint_of_layout_1_is_upgraded(tmp_path):
    """Checkpoints written before vector targets existed have no vector readout."""
    import torch

    train(tmp_path, options(SMALL_MP, ["energy: {key: energy}"], EMT_DATA, epochs=1))
    (checkpoint,) = tmp_path.glob("outputs/*/*/model.ckpt")
    content = torch.load(checkpoint, weights_only=True)
    for key in ("model_state", "best_model_state"):
        del content[key]["vector_readout"]
    content["architecture_version"] = 1
    torch.save(content, tmp_path / "old.ckpt")
    result = run_mtt("export", "old.ckpt", "-o", "old.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "old.pt").is_file()
