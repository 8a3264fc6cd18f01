"""Fine-tuning as users run it: `mtt train` with `architecture.training.finetune` naming a
checkpoint, on new data that may have new elements and new targets; what each method
trains, restarts, the report of what fine-tuning cost on the original data, and errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from conftest import EMT_DATA, SMALL_SOAP, exported_outputs, run_mtt, write_options
from test_cli_errors import assert_user_error

SMALL_MP = "name: equivariant_mp\nmodel: {channels: 8, max_l: 1, hidden_l: 1, correlation: 2, num_layers: 2}"
CONSTANT = "lr_schedule: constant, warmup_fraction: 0.0"


def check_exported_forces(model: Path, structures: Path) -> None:
    """In a process that never imports mtt, the exported model's forces on the first
    structure of ``structures`` are minus the derivatives of its energy (finite differences)."""
    script = f"""
import sys, ase.io, numpy as np
from metatomic_ase import MetatomicCalculator
atoms = ase.io.read({str(structures)!r}, index=0)
atoms.calc = MetatomicCalculator({str(model)!r}, extensions_directory={str(model.parent / "extensions")!r})
forces = atoms.get_forces()
h, atom = 1e-4, 1
for k in range(3):
    moved = [atoms.copy() for _ in range(2)]
    for sign, copy in zip((1, -1), moved):
        copy.positions[atom, k] += sign * h
        copy.calc = atoms.calc
    energies = [copy.get_potential_energy() for copy in moved]
    assert abs(-(energies[0] - energies[1]) / (2 * h) - forces[atom, k]) < 1e-5, (k, energies, forces[atom])
assert "mtt" not in sys.modules
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def options(architecture: str, training: str, data: str, targets: str = "", seed: int = 3) -> str:
    body = "".join(f"  {line}\n" for line in architecture.splitlines())
    block = f"training_set:\n  systems: {data}\n  targets:\n{targets}" if targets else f"training_set: {data}\n"
    # float64, as SOAP-BPNN's default: the finite differences of check_exported_forces need it
    return (
        f"seed: {seed}\nbase_precision: 64\narchitecture:\n{body}  training: {training}\n"
        f"{block}validation_set: 0.15\ntest_set: 0.1\n"
    )


def train(folder: Path, *args: str) -> subprocess.CompletedProcess:
    result = run_mtt("train", *args, cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def the_run(folder: Path) -> Path:
    (run,) = [p for p in folder.glob("outputs/*/*") if p.is_dir()]
    return run


def trained_checkpoint(folder: Path, options_text: str) -> Path:
    """Train with ``options_text`` in ``folder``; the run's checkpoint."""
    write_options(folder, options_text)
    train(folder, "options.yaml")
    return the_run(folder) / "model.ckpt"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The EMT structures without gold (the original data) and with it (the new data)."""
    folder = tmp_path_factory.mktemp("data")
    frames = ase.io.read(EMT_DATA, ":")
    ase.io.write(folder / "without_gold.xyz", [f for f in frames if "Au" not in f.get_chemical_symbols()])
    ase.io.write(folder / "with_gold.xyz", [f for f in frames if "Au" in f.get_chemical_symbols()])
    return folder


@pytest.fixture(scope="module", params=["soap_bpnn", "equivariant_mp"])
def pretrained(request, data, tmp_path_factory) -> tuple[str, Path]:
    """A model of each architecture trained on the structures without gold: (architecture, checkpoint)."""
    folder = tmp_path_factory.mktemp(request.param)
    architecture = SMALL_SOAP if request.param == "soap_bpnn" else SMALL_MP
    write_options(folder, options(architecture, "{num_epochs: 2, batch_size: 8}", data / "without_gold.xyz"))
    train(folder, "options.yaml", "-o", "original.pt")
    return architecture, the_run(folder) / "model.ckpt"


def finetune(
    folder: Path, architecture: str, checkpoint: Path, data: Path, extra: str = "", *args: str, file="with_gold.xyz"
):
    training = f"{{num_epochs: 2, batch_size: 8, {CONSTANT}, finetune: {{read_from: {checkpoint}{extra}}}}}"
    name = architecture.splitlines()[0]  # the model's hyperparameters come from the checkpoint
    write_options(folder, options(name, training, data / file, seed=11))
    return train(folder, "options.yaml", "-o", "finetuned.pt", *args)


def test_a_model_learns_a_new_element_and_reports_the_cost_on_the_original_data(pretrained, data, tmp_path):
    architecture, checkpoint = pretrained
    result = finetune(tmp_path, architecture, checkpoint, data)
    assert "fine-tuning of" in result.stdout and "original validation: energy per atom RMSE" in result.stdout
    # the checkpoint's own validation figures are the "before" of the original data
    original = torch.load(checkpoint, weights_only=True)
    rmse = original["best_validation"]["energy_per_atom_rmse"] * 1000
    row = next(line for line in result.stdout.splitlines() if "original validation: energy per atom" in line)
    assert float(row.split()[-3]) == pytest.approx(rmse, rel=2e-3)
    state = torch.load(the_run(tmp_path) / "model.ckpt", weights_only=True)
    assert state["dataset_info"]["atomic_types"] == [29, 78, 79]
    assert set(state["finetune_start"]) == {"validation", "original validation"}
    # gold's baseline is fitted, the others' kept from the checkpoint
    weights = state["best_model_state"]["composition.weights"]
    before = original["best_model_state"]["composition.weights"]
    assert torch.equal(weights[[0, 1]], before) and weights[2, 0] != 0
    check_exported_forces(tmp_path / "finetuned.pt", data / "with_gold.xyz")


@pytest.mark.parametrize("method", ["heads", "lora"])
def test_each_method_trains_only_what_it_says(pretrained, data, tmp_path, method):
    architecture, checkpoint = pretrained
    # the same elements, so that every weight of the checkpoint has its counterpart
    result = finetune(tmp_path, architecture, checkpoint, data, f", method: {method}", file="without_gold.xyz")
    assert f"{method}: " in result.stdout
    before = torch.load(checkpoint, weights_only=True)["best_model_state"]
    after = torch.load(the_run(tmp_path) / "model.ckpt", weights_only=True)["best_model_state"]
    name = architecture.splitlines()[0].removeprefix("name: ")
    last = max((int(key.split(".")[2]) for key in before if key.startswith("networks.")), default=0)
    frozen = changed = 0
    for key, value in before.items():
        if key.startswith(("composition.", "uncertainty.")):  # the baseline; refit at the end of every run
            continue
        mine = after.get(key, after.get(key.replace(".weight", ".parametrizations.weight.original")))
        if mine is None:  # a parametrized weight of equivariant_mp: `weights` -> `parametrizations.weights.original`
            *module, leaf = key.split(".")
            mine = after[".".join(module + ["parametrizations", leaf, "original"])]
        head = (
            key.startswith("networks.") and int(key.split(".")[2]) == last
            if name == "soap_bpnn"
            else ".readout." in key
        )
        if head:
            changed += not torch.equal(before[key], mine)
        else:
            assert torch.equal(value, mine), f"{key} was trained by method {method}"
            frozen += 1
    assert frozen > 0 and changed > 0
    adapters = [key for key in after if key.endswith((".a", ".b")) and ".parametrizations." in key]
    assert bool(adapters) == (method == "lora")
    check_exported_forces(tmp_path / "finetuned.pt", data / "without_gold.xyz")


def test_a_new_target_gets_a_head_and_the_old_one_stays(data, tmp_path):
    frames = ase.io.read(data / "without_gold.xyz", ":")
    for atoms in frames:
        atoms.info["energy_b"] = 0.5 * atoms.get_potential_energy() + 0.1 * len(atoms)
        atoms.calc = None
    ase.io.write(tmp_path / "new.xyz", frames)
    checkpoint = trained_checkpoint(
        tmp_path, options(SMALL_SOAP, "{num_epochs: 1, batch_size: 8}", data / "without_gold.xyz")
    )
    finetuning = tmp_path / "finetune"
    finetuning.mkdir()
    training = f"{{num_epochs: 1, batch_size: 8, finetune: {{read_from: {checkpoint}, method: heads}}}}"
    write_options(finetuning, options("name: soap_bpnn", training, tmp_path / "new.xyz", "    energy_b: {unit: eV}\n"))
    result = train(finetuning, "options.yaml", "-o", "both.pt")
    assert "energy_b" in result.stdout
    assert {"energy", "mtt::energy_b"} <= set(exported_outputs(finetuning / "both.pt"))


@pytest.mark.parametrize("pretrained", ["soap_bpnn"], indirect=True)
def test_a_restart_continues_the_finetuning_exactly(pretrained, data, tmp_path):
    architecture, checkpoint = pretrained
    straight = tmp_path / "straight"
    straight.mkdir()
    finetune(straight, architecture, checkpoint, data, ", method: lora", file="without_gold.xyz")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    finetune(
        resumed,
        architecture,
        checkpoint,
        data,
        ", method: lora",
        "architecture.training.num_epochs=1",
        file="without_gold.xyz",
    )
    first = the_run(resumed)
    result = run_mtt("train", "options.yaml", "--restart", str(first / "model.ckpt"), cwd=resumed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "continuing after epoch 1" in result.stdout
    last = max(p for p in resumed.glob("outputs/*/*") if p != first)
    a = torch.load(the_run(straight) / "model.ckpt", weights_only=True)["model_state"]
    b = torch.load(last / "model.ckpt", weights_only=True)["model_state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("pretrained", ["soap_bpnn"], indirect=True)
def test_finetuning_errors_name_the_cause(pretrained, data, tmp_path):
    architecture, checkpoint = pretrained
    training = f"{{num_epochs: 1, finetune: {{read_from: {checkpoint}}}}}"
    cases = [
        (
            options(SMALL_MP.splitlines()[0], training, data / "with_gold.xyz"),
            ["'soap_bpnn' model", "architecture.name"],
        ),
        (
            options(architecture.replace("max_radial: 3", "max_radial: 5"), training, data / "with_gold.xyz"),
            ["architecture.model.soap.max_radial: 5 here, 3 in the checkpoint"],
        ),
        (
            options("name: soap_bpnn", "{num_epochs: 1, finetune: missing.ckpt}", data / "with_gold.xyz"),
            ["missing.ckpt", "does not exist"],
        ),
        (
            options(
                "name: soap_bpnn", f"{{finetune: {{read_from: {checkpoint}, method: lora}}}}", data / "with_gold.xyz"
            ),
            ["method: lora' cannot learn elements the checkpoint never saw (Au)", "method: full"],
        ),
        (
            options("name: composition", f"{{finetune: {{read_from: {checkpoint}, method: heads}}}}", EMT_DATA),
            ["'soap_bpnn' model"],
        ),
    ]
    for number, (text, expected) in enumerate(cases):
        folder = tmp_path / str(number)
        folder.mkdir()
        write_options(folder, text)
        assert_user_error(run_mtt("train", "options.yaml", cwd=folder), *expected)
        assert not list(folder.glob("outputs/*/*/model.ckpt"))


def test_a_target_of_another_shape_than_the_checkpoints_is_refused_before_training(data, tmp_path):
    frames = ase.io.read(data / "without_gold.xyz", ":")
    for atoms in frames:  # a property per atom, and its sum per structure
        atoms.arrays["q"] = np.linspace(-1.0, 1.0, len(atoms))
        atoms.info["q_sum"] = 0.1 * len(atoms)
        atoms.calc = None
    ase.io.write(tmp_path / "q.xyz", frames)
    per_atom = "    q: {sample_kind: atom}\n"
    checkpoint = trained_checkpoint(
        tmp_path, options(SMALL_SOAP, "{num_epochs: 1, batch_size: 8}", tmp_path / "q.xyz", per_atom)
    )
    folder = tmp_path / "finetune"
    folder.mkdir()
    training = f"{{num_epochs: 1, batch_size: 8, finetune: {checkpoint}}}"
    write_options(folder, options("name: soap_bpnn", training, tmp_path / "q.xyz", "    q: {key: q_sum}\n"))
    result = run_mtt("train", "options.yaml", cwd=folder)
    assert_user_error(result, "target 'q' is a property in no unit here, but a property in no unit per atom in the")
    assert "another name" in result.stdout + result.stderr
    assert not list(folder.glob("outputs/*/*/model.ckpt"))


def test_a_composition_model_cannot_be_finetuned_by_heads(tmp_path):
    write_options(tmp_path, options("name: composition", "{num_epochs: 1}", EMT_DATA))
    train(tmp_path, "options.yaml")
    checkpoint = the_run(tmp_path) / "model.ckpt"
    folder = tmp_path / "heads"
    folder.mkdir()
    training = f"{{finetune: {{read_from: {checkpoint}, method: heads}}}}"
    write_options(folder, options("name: composition", training, EMT_DATA))
    assert_user_error(run_mtt("train", "options.yaml", cwd=folder), "method: heads", "does not say which")


def test_an_ethanol_model_learns_another_level_of_theory(shared_data, tmp_path):
    """DFT ethanol fine-tuned on GFN2-xTB ethanol: the energy zero differs, so the baseline is refitted."""
    xtb = tmp_path / "xtb.xyz"
    ase.io.write(xtb, ase.io.read(shared_data / "ethanol_xtb_2000.xyz", "::20"))
    write_options(
        tmp_path, options(SMALL_SOAP, "{num_epochs: 3, batch_size: 10}", shared_data / "ethanol_reduced_100.xyz")
    )
    train(tmp_path, "options.yaml")
    checkpoint = the_run(tmp_path) / "model.ckpt"
    folder = tmp_path / "xtb"
    folder.mkdir()
    training = f"{{num_epochs: 3, batch_size: 10, finetune: {{read_from: {checkpoint}, refit_baseline: true}}}}"
    write_options(folder, options("name: soap_bpnn", training, xtb))
    result = train(folder, "options.yaml")
    rows = {
        line.split("[")[0].strip(): [float(x) for x in line.split("]")[-1].split()[:2]]
        for line in result.stdout.splitlines()
        if "validation: " in line and "RMSE" in line
    }
    assert set(rows) == {
        "validation: energy per atom RMSE",
        "validation: forces RMSE",
        "original validation: energy per atom RMSE",
        "original validation: forces RMSE",
    }
    before, after = rows["validation: forces RMSE"]
    assert after < before, result.stdout  # fine-tuning learns the new data


def test_a_qm9_model_learns_an_element_it_lacked(shared_data, tmp_path):
    frames = ase.io.read(shared_data / "qm9_reduced_100.xyz", ":")
    ase.io.write(tmp_path / "without_n.xyz", [f for f in frames if "N" not in f.get_chemical_symbols()])
    ase.io.write(tmp_path / "with_n.xyz", [f for f in frames if "N" in f.get_chemical_symbols()])
    target = "    energy: {key: U0, unit: Hartree}\n"
    write_options(tmp_path, options(SMALL_SOAP, "{num_epochs: 2, batch_size: 8}", tmp_path / "without_n.xyz", target))
    train(tmp_path, "options.yaml")
    checkpoint = the_run(tmp_path) / "model.ckpt"
    folder = tmp_path / "nitrogen"
    folder.mkdir()
    training = f"{{num_epochs: 2, batch_size: 8, finetune: {{read_from: {checkpoint}}}}}"
    write_options(folder, options("name: soap_bpnn", training, tmp_path / "with_n.xyz", target))
    result = train(folder, "options.yaml", "-o", "with_n.pt")
    assert "structures of H, C, N, O" in result.stdout and "original validation: energy per atom RMSE" in result.stdout
    state = torch.load(the_run(folder) / "model.ckpt", weights_only=True)
    assert state["dataset_info"]["atomic_types"] == [1, 6, 7, 8]
    check_exported_forces(folder / "with_n.pt", tmp_path / "with_n.xyz")
