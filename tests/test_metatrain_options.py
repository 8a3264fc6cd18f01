"""metatrain's options files, unchanged, through the CLI: what mtt reads in its own terms,
what it ignores with a note, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from conftest import EMT_DATA, run_mtt, write_options

from mtt.training.hypers import LossHypers
from mtt.training.loss import Loss, Term

#: metatrain's SOAP-BPNN defaults (its default-hypers.yaml), a smaller descriptor and two
#: epochs, with a per-target loss block as metatrain's docs write it
METATRAIN = f"""
device: cpu
base_precision: 64
seed: 0
architecture:
  name: soap_bpnn
  model:
    soap:
      max_angular: 2
      max_radial: 3
      cutoff: {{radius: 5.0, width: 0.5}}
    bpnn: {{layernorm: true, num_hidden_layers: 2, num_neurons_per_layer: 32}}
    add_lambda_basis: true
    heads: {{}}
    zbl: false
    long_range: {{enable: false, use_ewald: false, smearing: 1.4, kspace_resolution: 1.33, interpolation_nodes: 5}}
  training:
    distributed: false
    distributed_port: 39591
    batch_size: 8
    num_epochs: 2
    learning_rate: 0.001
    early_stopping_patience: 200
    scheduler_patience: 100
    scheduler_factor: 0.8
    log_interval: 5
    checkpoint_interval: 25
    fit_composition_model: true
    scale_targets: true
    fixed_composition_weights: {{}}
    per_structure_targets: []
    log_mae: false
    log_separate_blocks: false
    best_model_metric: rmse_prod
    loss:
      energy:
        type: mse
        weight: 1.0
        reduction: mean
        forces:
          type: mae
          weight: 10.0
training_set:
  systems:
    read_from: {EMT_DATA}
    length_unit: angstrom
  targets:
    energy:
      key: energy
      unit: eV
      forces: {{key: forces}}
validation_set: 0.1
test_set: 0.1
"""


def test_metatrain_soap_bpnn_options_run_unchanged(tmp_path):
    write_options(tmp_path, METATRAIN)
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "unknown option" not in result.stdout + result.stderr
    for key in ("per_structure_targets", "log_separate_blocks", "distributed_port", "fit_composition_model"):
        assert f"note: architecture.training.{key}: a metatrain option that mtt does not use" in result.stdout, key
    for key in ("add_lambda_basis", "heads", "zbl", "long_range"):
        assert f"note: architecture.model.{key}: a metatrain option that mtt does not use" in result.stdout, key
    assert "note: architecture.training.loss: metatrain's per-target blocks, read as" in result.stdout
    # what they mean to mtt: the plateau schedule, early stopping, a loss type and weight per term
    assert "learning rate 0.001 (times 0.8 when the validation loss has not decreased for more than 100 epochs)" in (
        result.stdout
    )
    assert "stops after 200 epochs without a better model" in result.stdout
    (folder,) = tmp_path.glob("outputs/*/*")
    loss = yaml.safe_load((folder / "options.yaml").read_text())["architecture"]["training"]["loss"]
    assert loss["weights"] == {"energy": 1.0, "forces": 10.0}
    assert loss["types"] == {"energy": "mse", "forces": "mae"}
    assert "note: architecture.training.per_structure_targets" in (folder / "train.log").read_text()


def test_metatrain_options_that_would_train_another_model_are_refused(tmp_path):
    text = (
        METATRAIN.replace("zbl: false", "zbl: true")
        .replace("fit_composition_model: true", "fit_composition_model: false")
        .replace("reduction: mean", "reduction: sum")
        .replace(
            "      energy:\n        type: mse", "      energi:\n        type: mse\n      energy:\n        type: mse"
        )
        .replace("          type: mae", "          type: masked_mae")
    )
    write_options(tmp_path, text)
    result = run_mtt("train", "options.yaml", "num_epochs=5", cwd=tmp_path)
    assert result.returncode == 2
    stderr = result.stderr
    assert stderr.startswith("mtt: invalid options: 6 problems in the options:"), stderr
    assert "'architecture.model.zbl: true' asks for what mtt's SOAP-BPNN does not have" in stderr
    assert "'architecture.training.fit_composition_model: false' is a metatrain option that mtt does not use" in stderr
    assert "'architecture.training.loss.energy.reduction: sum' is not supported" in stderr
    assert "'architecture.training.loss.energi' names no target of training_set (energy)" in stderr
    assert "'architecture.training.loss.energy.forces.type' must be one of 'mse', 'mae', 'huber'" in stderr
    # an option given without its section is found where it belongs
    assert "unknown option 'num_epochs'. Did you mean 'architecture.training.num_epochs'?" in stderr
    assert not (tmp_path / "outputs").exists()


def test_a_loss_function_per_term():
    terms = [Term("energy", "values", "energy", "eV", True), Term("energy", "forces", "forces", "eV/A", False)]
    loss = Loss(LossHypers(types={"forces": "mae"}, weights={"forces": 10.0}), terms, {"energy": 2.0, "forces": 0.5})
    error = torch.tensor([1.0, -3.0, 0.5], dtype=torch.float64)
    assert loss.weighted_sum("forces", error) == pytest.approx(10.0 * (1.0 + 3.0 + 0.5) / 0.5)
    assert loss.weighted_sum("energy", error) == pytest.approx((1.0 + 9.0 + 0.25) / 4.0)
    assert math.isfinite(loss.weighted_sum("energy", error))
