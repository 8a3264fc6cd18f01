"""Shallow ensembles (``architecture.training.shallow_ensemble``) through the CLI: trained
members exported as metatomic's ``energy_ensemble`` and read without mtt, two ranks that
train what one process trains, restarts and fine-tuning that keep the members, and the
options refused."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import EMT_DATA, SMALL_SOAP, emt_options, run_mtt, torchrun_train, write_options

SMALL_MP = "name: equivariant_mp\nmodel: {channels: 8, max_l: 1, hidden_l: 1, correlation: 2, num_layers: 2}"
SHALLOW = "shallow_ensemble: {members: 4}"


def _train(folder: Path, architecture: str, training: str, seed: int = 3, *args: str) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    # float64, as SOAP-BPNN's default: the members' mean is the model's energy to 1e-9
    options = write_options(folder, emt_options(architecture, training, seed=seed, precision=64))
    result = run_mtt("train", str(options), *args, cwd=folder)
    assert result.returncode == 0, result.stderr
    return result


def _checkpoint(folder: Path) -> dict:
    (path,) = folder.glob("outputs/*/*/model.ckpt")
    return torch.load(path, weights_only=True)


def _ensemble(model: Path) -> dict:
    """The exported model's energy and members of a structure, as it is and rotated, and
    their description, in a process that never imports mtt."""
    script = textwrap.dedent(f"""
        import json, sys
        import ase.io, numpy as np
        from metatomic.torch import ModelOutput
        from metatomic_ase import MetatomicCalculator

        calculator = MetatomicCalculator({str(model)!r}, extensions_directory={str(model.parent / "extensions")!r})
        outputs = calculator._model.capabilities().outputs
        requests = {{name: ModelOutput(unit="eV", sample_kind="system") for name in ("energy", "energy_ensemble")}}

        def run(atoms):
            result = calculator.run_model(atoms, requests)
            return {{name: result[name].block().values.detach().numpy().ravel().tolist() for name in result}}

        atoms = ase.io.read({str(EMT_DATA)!r}, 0)
        rotated = atoms.copy()
        rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))[0]
        rotated.positions = rotated.positions @ rotation.T
        rotated.cell = rotated.cell[:] @ rotation.T
        print(json.dumps({{
            "description": outputs["energy_ensemble"].description,
            "atoms": run(atoms),
            "rotated": run(rotated),
            "mtt imported": "mtt" in sys.modules,
        }}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("architecture", ["soap_bpnn", "equivariant_mp"])
def test_trained_members_are_the_exported_ensemble(tmp_path, architecture):
    body = SMALL_SOAP if architecture == "soap_bpnn" else SMALL_MP
    result = _train(tmp_path, body, f"{{batch_size: 8, num_epochs: 3, {SHALLOW}}}")
    summary = " ".join(result.stdout[result.stdout.index("Summary") :].split())
    expected = "the ensemble: the shallow ensemble of 4 trained members, its spread calibrated on the validation forces"
    assert expected in summary
    figures = _ensemble(tmp_path / "model.pt")
    assert not figures["mtt imported"]
    assert "trained with the model (a shallow ensemble)" in figures["description"]
    members, (energy,) = figures["atoms"]["energy_ensemble"], figures["atoms"]["energy"]
    assert len(members) == 4 and len(set(members)) == 4
    # centred: their mean is the model's own energy
    assert sum(members) / 4 == pytest.approx(energy, rel=1e-9, abs=1e-9)
    spread = torch.tensor(members, dtype=torch.float64).std()
    assert spread > 0
    rotated = torch.tensor(figures["rotated"]["energy_ensemble"], dtype=torch.float64)
    assert float(rotated.std()) == pytest.approx(float(spread), rel=1e-6)
    # the members are the trained ones, calibrated: proportional to the checkpoint's deviations
    state = _checkpoint(tmp_path)["best_model_state"]
    trained, exported = state["shallow_ensemble.deviations"][0].double(), state["uncertainty.ensemble"][0]
    centred = trained - trained.mean(1, keepdim=True)
    factor = float((exported * centred).sum() / (centred * centred).sum())
    assert factor > 0
    torch.testing.assert_close(exported, factor * centred, rtol=1e-6, atol=1e-12)


def test_the_members_leave_the_model_as_it_trains_without_them(tmp_path):
    """The ensemble's term trains the members alone: every other weight, the errors of
    every epoch with them, are those of the same run without a shallow ensemble."""
    states, metrics = [], []
    for name, extra in (("plain", ""), ("shallow", f", {SHALLOW}")):
        folder = tmp_path / name
        _train(folder, SMALL_SOAP, f"{{batch_size: 8, num_epochs: 2{extra}}}")
        states.append(_checkpoint(folder)["model_state"])
        (csv,) = folder.glob("outputs/*/*/metrics.csv")
        metrics.append([line.split(",")[2:] for line in csv.read_text().splitlines()])  # past epoch and time
    plain, shallow = states
    assert {n for n in shallow if not n.startswith("shallow_ensemble.")} == set(plain)
    for name, value in plain.items():  # to rounding: the features' pass orders some sums otherwise
        if not name.startswith("uncertainty."):
            torch.testing.assert_close(shallow[name], value, rtol=1e-9, atol=1e-12, msg=name)
    assert metrics[0][0] == metrics[1][0]
    for row_plain, row_shallow in zip(metrics[0][1:], metrics[1][1:]):
        assert [float(v) for v in row_shallow] == pytest.approx([float(v) for v in row_plain], rel=1e-9)


def test_the_likelihood_and_energies_alone_train_members_too(tmp_path):
    """The other loss, and the term without the members' forces."""
    training = "{batch_size: 8, num_epochs: 2, shallow_ensemble: {members: 3, loss: nll, forces: false}}"
    _train(tmp_path, SMALL_SOAP, training)
    members = _ensemble(tmp_path / "model.pt")["atoms"]["energy_ensemble"]
    assert len(members) == 3 and len(set(members)) == 3


def test_two_ranks_train_the_members_of_one_process(tmp_path):
    """The ensemble's term takes the energy term's share of each global batch: 2 ranks with
    batch 4 train what one process with batch 8 trains, every weight and member alike."""
    states, metrics = [], []
    for ranks, batch in [(1, 8), (2, 4)]:
        folder = tmp_path / f"ranks{ranks}"
        folder.mkdir()
        training = f"{{batch_size: {batch}, num_epochs: 2, {SHALLOW}}}"
        options = write_options(folder, emt_options(SMALL_SOAP, training, seed=4))
        result = run_mtt("train", str(options), cwd=folder) if ranks == 1 else torchrun_train(options, folder, ranks)
        assert result.returncode == 0, result.stderr
        states.append(_checkpoint(folder)["model_state"])
        (csv,) = folder.glob("outputs/*/*/metrics.csv")
        metrics.append([line.split(",") for line in csv.read_text().splitlines()])
    one, two = states
    assert set(one) == set(two) and "shallow_ensemble.deviations" in one
    for name, value in one.items():
        torch.testing.assert_close(two[name], value, rtol=1e-6, atol=1e-9, msg=name)
    header = metrics[0][0]
    for row_one, row_two in zip(metrics[0][1:], metrics[1][1:]):
        for key, a, b in zip(header, row_one, row_two):
            if not key.startswith("time"):
                assert float(b) == pytest.approx(float(a), rel=1e-6), key


def test_a_restart_continues_with_the_members(tmp_path):
    """Two epochs, then two more by --restart: the members of an uninterrupted run of four."""
    constant = "lr_schedule: constant, warmup_fraction: 0.0"  # the same rates whatever num_epochs
    training = f"{{batch_size: 8, num_epochs: 4, checkpoint_interval: 2, {constant}, {SHALLOW}}}"
    straight = tmp_path / "straight"
    _train(straight, SMALL_SOAP, training)
    halves = tmp_path / "halves"
    _train(halves, SMALL_SOAP, training, 3, "architecture.training.num_epochs=2")
    (middle,) = halves.glob("outputs/*/*/checkpoints/epoch_2.ckpt")
    result = run_mtt("train", "options.yaml", "--restart", str(middle), cwd=halves)
    assert result.returncode == 0, result.stderr
    continued = sorted(halves.glob("outputs/*/*/model.ckpt"))[-1]
    expected = _checkpoint(straight)["model_state"]["shallow_ensemble.deviations"]
    torch.testing.assert_close(
        torch.load(continued, weights_only=True)["model_state"]["shallow_ensemble.deviations"], expected
    )
    # the number of members defines the model: a restart cannot change it
    five = "architecture.training.shallow_ensemble.members=5"
    changed = run_mtt("train", "options.yaml", "--restart", str(middle), five, cwd=halves)
    assert changed.returncode != 0
    assert "architecture.training.shallow_ensemble.members: 4 in the checkpoint, 5 now (cannot change" in " ".join(
        changed.stdout.split() + changed.stderr.split()
    )


def test_export_calibrate_and_finetuning_keep_the_members(tmp_path):
    trained = tmp_path / "trained"
    _train(trained, SMALL_SOAP, f"{{batch_size: 8, num_epochs: 2, {SHALLOW}}}")
    (checkpoint,) = trained.glob("outputs/*/*/model.ckpt")
    members = _ensemble(trained / "model.pt")["atoms"]["energy_ensemble"]
    # mtt export and mtt calibrate of the checkpoint: the same members, calibrated the same
    for command in (["export", str(checkpoint)], ["calibrate", str(checkpoint), "options.yaml"]):
        result = run_mtt(*command, "-o", str(tmp_path / "again.pt"), cwd=trained)
        assert result.returncode == 0, result.stderr
        again = _ensemble(tmp_path / "again.pt")
        assert "a shallow ensemble" in again["description"]
        assert again["atoms"]["energy_ensemble"] == pytest.approx(members, rel=1e-9)
    assert "the shallow ensemble of 4 trained members" in " ".join(result.stdout.split())
    # with the same members: they continue from the checkpoint's (a zero learning rate keeps them)
    keeps = tmp_path / "keeps"
    training = f"{{batch_size: 8, num_epochs: 1, learning_rate: 1.0e-12, finetune: {checkpoint}, {SHALLOW}}}"
    _train(keeps, SMALL_SOAP, training)
    before = torch.load(checkpoint, weights_only=True)["best_model_state"]["shallow_ensemble.deviations"]
    after = _checkpoint(keeps)["best_model_state"]["shallow_ensemble.deviations"]
    torch.testing.assert_close(after, before, rtol=1e-6, atol=1e-9)
    # without shallow_ensemble: a model of its own, with an ensemble sampled from its posterior
    plain = tmp_path / "plain"
    result = _train(plain, SMALL_SOAP, f"{{batch_size: 8, num_epochs: 1, finetune: {checkpoint}}}")
    assert "an ensemble of 16 sampled from the posterior of the energies and forces" in " ".join(result.stdout.split())
    assert not any(name.startswith("shallow_ensemble.") for name in _checkpoint(plain)["best_model_state"])
    assert len(_ensemble(plain / "model.pt")["atoms"]["energy_ensemble"]) == 16


@pytest.mark.parametrize(
    "architecture, training, message",
    [
        (
            SMALL_SOAP,
            "shallow_ensemble: {members: 1}",
            "'architecture.training.shallow_ensemble.members' must be >= 2 (a spread needs two members)",
        ),
        (
            SMALL_SOAP,
            "shallow_ensemble: {loss: gaussian}",
            "'architecture.training.shallow_ensemble.loss' must be one of 'nll', 'crps', got 'gaussian'",
        ),
        (
            SMALL_SOAP,
            "uncertainty: false, shallow_ensemble: {members: 4}",
            "'architecture.training.shallow_ensemble' needs the uncertainty, whose ensemble its members become: set "
            "architecture.training.uncertainty to null or true",
        ),
        (
            "name: composition",
            "shallow_ensemble: {members: 4}",
            "architecture.training.shallow_ensemble needs the model's last-layer features, and the 'composition' "
            "architecture offers none",
        ),
    ],
)
def test_bad_shallow_ensemble_options_are_refused(tmp_path, architecture, training, message):
    options = write_options(tmp_path, emt_options(architecture, f"{{num_epochs: 1, {training}}}", seed=3))
    result = run_mtt("train", str(options), cwd=tmp_path)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "model.pt").exists()
