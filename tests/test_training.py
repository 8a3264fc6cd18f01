"""Training as a user runs it: the CLI in a subprocess, real files, restarts."""

from __future__ import annotations

import csv
import math
import os
import re
import time
from pathlib import Path

import pytest
import torch
from conftest import logged_test_errors, run_mtt, write_options

SMALL_SOAP = """
  model:
    soap: {max_radial: 3, max_angular: 2}
"""


def emt_options(emt_file: Path, epochs: int, extra_training: str = "") -> str:
    return f"""
seed: 7
architecture:
  name: soap_bpnn
{SMALL_SOAP}
  training:
    batch_size: 8
    num_epochs: {epochs}
    checkpoint_interval: 2
{extra_training}
training_set:
  systems: {emt_file}
  targets:
    energy: {{key: energy, unit: eV, forces: on, stress: on}}
validation_set: 0.1
test_set: 0.1
"""


def run_folder(cwd: Path) -> Path:
    folders = sorted(cwd.glob("outputs/*/*"))
    assert folders, "no run folder was created"
    return folders[-1]


def test_train_writes_the_run_folder_and_the_model(tmp_path, emt_file):
    options = write_options(tmp_path, emt_options(emt_file, 2))
    result = run_mtt("train", str(options), "-o", "exported/potential.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    test = logged_test_errors(tmp_path)
    assert test.startswith("test set (10 structures)")
    assert re.search(r"forces rmse [\d.]+ meV/A", test)
    assert re.search(r"forces RMSE \[meV/A\] +[\d.]+ +[\d.]+", result.stdout), "the summary's validation and test"

    folder = run_folder(tmp_path)
    for name in [
        "train.log",
        "metrics.csv",
        "options.yaml",
        "model.ckpt",
        "model.pt",
        "indices/training.txt",
        "indices/validation.txt",
        "indices/test.txt",
        "checkpoints/epoch_2.ckpt",
    ]:
        assert (folder / name).is_file(), name
    assert (tmp_path / "exported" / "potential.pt").is_file()
    assert (tmp_path / "exported" / "extensions").is_dir()

    rows = list(csv.DictReader(open(folder / "metrics.csv")))
    assert [row["epoch"] for row in rows] == ["1", "2"]
    assert "validation_forces_rmse [meV/A]" in rows[0]
    assert "validation_energy_per_atom_rmse [meV/atom]" in rows[0]
    assert all(math.isfinite(float(v)) for v in rows[-1].values() if v)

    split = {
        name: (folder / "indices" / f"{name}.txt").read_text().splitlines()
        for name in ["training", "validation", "test"]
    }
    assert (len(split["training"]), len(split["validation"]), len(split["test"])) == (80, 10, 10)
    assert not set(split["training"]) & set(split["test"])


def _final_state(folder: Path) -> dict:
    return torch.load(folder / "model.ckpt", weights_only=True)


def test_restart_gives_the_same_model_as_an_uninterrupted_run(tmp_path, emt_file):
    options = write_options(tmp_path, emt_options(emt_file, 4))
    straight = tmp_path / "straight"
    straight.mkdir()
    uninterrupted = run_mtt("train", str(options), cwd=straight)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    reference = _final_state(run_folder(straight))

    # the epoch-2 checkpoint is what a run killed during epoch 3 leaves behind
    checkpoint = run_folder(straight) / "checkpoints" / "epoch_2.ckpt"
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    resumed = run_mtt("train", str(options), "--restart", str(checkpoint), cwd=resumed_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert "continuing after epoch 2" in resumed.stdout
    state = _final_state(run_folder(resumed_dir))
    assert state["epoch"] == 4
    for name, value in reference["model_state"].items():
        torch.testing.assert_close(state["model_state"][name], value, rtol=1e-12, atol=1e-12)
    assert state["best_figure"] == pytest.approx(reference["best_figure"], rel=1e-12)

    assert logged_test_errors(resumed_dir) == logged_test_errors(straight)


def test_restart_auto_takes_the_highest_epoch_not_the_newest_file(tmp_path, emt_file):
    options = write_options(tmp_path, emt_options(emt_file, 4))
    assert run_mtt("train", str(options), cwd=tmp_path).returncode == 0
    folder = run_folder(tmp_path)
    older = folder / "checkpoints" / "epoch_2.ckpt"
    os.utime(older, (time.time() + 100, time.time() + 100))  # newest file, lower epoch
    result = run_mtt("train", str(options), "architecture.training.num_epochs=6", "--restart", "auto", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = Path("outputs") / folder.relative_to(tmp_path / "outputs")
    assert f"continuing after epoch 4 from {expected}/" in result.stdout


def test_restart_auto_without_checkpoints_starts_from_scratch(tmp_path, emt_file):
    options = write_options(tmp_path, emt_options(emt_file, 1))
    result = run_mtt("train", str(options), "--restart", "auto", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no checkpoint under outputs/ of a run with these options, starting from scratch" in result.stdout


@pytest.mark.parametrize("architecture", ["composition", "soap_bpnn"])
def test_float32_training(tmp_path, emt_file, architecture):
    text = emt_options(emt_file, 1).replace("name: soap_bpnn", f"name: {architecture}")
    if architecture == "composition":
        text = text.replace(SMALL_SOAP, "\n")
    options = write_options(tmp_path, text)
    result = run_mtt("train", str(options), "base_precision=32", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "model.pt").is_file()


SHARED = {
    "ethanol": ("ethanol_reduced_100.xyz", "energy: {key: energy, unit: kcal/mol, forces: forces}", "forces rmse"),
    "qm9": (
        "qm9_reduced_100.xyz",
        "energy: {key: U0, unit: Hartree}\n    gap: {key: epsgap, unit: Hartree}",
        "gap rmse",
    ),
    "carbon": (
        "carbon_reduced_100.xyz",
        "energy: {key: energy, unit: eV, forces: force, virial: virial}",
        "stress rmse",
    ),
}


@pytest.mark.parametrize("dataset", sorted(SHARED))
def test_train_on_the_shared_dft_datasets(tmp_path, shared_data, dataset):
    file, targets, expected = SHARED[dataset]
    options = write_options(
        tmp_path,
        f"""
seed: 1
architecture:
  name: soap_bpnn
{SMALL_SOAP}
  training: {{num_epochs: 2, batch_size: 16}}
training_set:
  systems: {shared_data / file}
  targets:
    {targets}
test_set: 0.1
validation_set: 0.1
""",
    )
    result = run_mtt("train", str(options), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    test_line = logged_test_errors(tmp_path)
    assert expected in test_line
    assert "nan" not in test_line


@pytest.mark.parametrize("derivatives", ["forces: off, stress: off", "forces: on, stress: on"])
def test_kept_features_change_no_number(tmp_path, emt_file, derivatives):
    """Training keeps SOAP features (and with forces or stress, what their derivatives
    need); with no budget, or one too small for the training set (which keeps nothing and
    says so), the numbers are the same."""
    text = emt_options(emt_file, 3).replace("forces: on, stress: on", derivatives)
    metrics = {}
    budgets = ["1024", "0", "0.3"]  # 0.3 MB holds a few structures, not the training set
    for budget in budgets:
        folder = tmp_path / f"budget-{budget}"
        folder.mkdir()
        options = write_options(folder, text)
        result = run_mtt("train", str(options), f"architecture.training.cache_memory_mb={budget}", cwd=folder)
        assert result.returncode == 0, result.stderr
        run = run_folder(folder)
        with open(run / "metrics.csv") as file:
            metrics[budget] = [{k: v for k, v in row.items() if k != "time [s]"} for row in csv.DictReader(file)]
        refused = re.search(r"none is kept.*cache_memory_mb to (\d+)", (run / "train.log").read_text())
        assert (refused is not None) == (budget == "0.3")
        if refused is not None:  # and the budget it says would hold it does
            budgets.append(refused.group(1))
    assert len(budgets) == 4
    assert all(metrics[budget] == metrics["1024"] for budget in budgets)


def test_validation_batches_change_no_figure(tmp_path, emt_file):
    """Evaluation takes its own batch size (twice the training batch by default): one
    structure per batch gives the same validation figures, and the same training."""
    metrics = {}
    for size in ("null", "1"):
        folder = tmp_path / f"validation-batch-{size}"
        folder.mkdir()
        options = write_options(folder, emt_options(emt_file, 2))
        result = run_mtt("train", str(options), f"architecture.training.validation_batch_size={size}", cwd=folder)
        assert result.returncode == 0, result.stderr
        with open(run_folder(folder) / "metrics.csv") as file:
            metrics[size] = [{k: float(v) for k, v in row.items() if k != "time [s]"} for row in csv.DictReader(file)]
    assert len(metrics["null"]) == 2
    for default, single in zip(metrics["null"], metrics["1"]):
        assert default.keys() == single.keys()
        for key, value in default.items():
            assert math.isclose(value, single[key], rel_tol=1e-9), (key, value, single[key])


@pytest.mark.parametrize(
    "name, targets, loss, expected",
    [
        # equivariant_mp weighs the forces 3 unless told otherwise, and says so
        ("equivariant_mp", "forces: on", "", "loss weights: forces 3 (equivariant_mp's default); the other"),
        ("equivariant_mp", "forces: on", "loss: {weights: {forces: 2, energy: 3}}", "weights: energy 3, forces 2;"),
        # without forces the architecture's weight of them applies to nothing: no error, no line
        ("equivariant_mp", "forces: off", "", None),
        ("soap_bpnn", "forces: on", "", None),
    ],
)
def test_the_loss_weights_are_the_users_then_the_architectures(tmp_path, emt_file, name, targets, loss, expected):
    small = {
        "equivariant_mp": "{channels: 4, max_l: 2, correlation: 2, radial_mlp: [8]}",
        "soap_bpnn": "{soap: {max_radial: 3, max_angular: 2}}",
    }
    options = f"""
architecture:
  name: {name}
  model: {small[name]}
  training: {{num_epochs: 1, batch_size: 8{", " + loss if loss else ""}}}
training_set:
  systems: {emt_file}
  targets:
    energy: {{key: energy, unit: eV, {targets}}}
validation_set: 0.1
test_set: 0.1
"""
    write_options(tmp_path, options)
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in (run_folder(tmp_path) / "train.log").read_text().splitlines() if "loss weights" in line]
    if expected is None:
        assert lines == []
    else:
        assert len(lines) == 1 and expected in lines[0], lines
