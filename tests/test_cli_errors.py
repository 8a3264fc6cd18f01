"""Every bad input a new user meets, through the real `mtt` command line.

Each case checks what the user sees: a non-zero exit status, one short message on stderr
that names the cause (the file, the option's full key, the closest valid name, ...), no
Python traceback unless --debug is given, and, for errors found before training starts,
no run folder or model left behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import types
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from conftest import EMT_DATA, run_mtt, write_options

#: a run that trains in seconds: the composition model, one epoch, a few structures
OPTIONS = """\
seed: 0
architecture:
  name: composition
  training:
    num_epochs: 1
training_set:
  systems:
    read_from: data.xyz
  targets:
    energy:
      key: energy
      unit: eV
validation_set: 0.25
test_set: 0.0
"""


#: eight EMT alloys in which each element is in several structures, so that any split
#: leaves every element in the training set
MIXED = [0, 9, 10, 12, 15, 17, 19, 20]


def small_dataset() -> list[ase.Atoms]:
    """Eight EMT structures with energy, forces and stress."""
    frames = ase.io.read(EMT_DATA, ":")
    return [frames[i] for i in MIXED]


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.xyz"
    ase.io.write(path, small_dataset())
    return path


@pytest.fixture
def options(tmp_path: Path, data_file: Path) -> Path:
    return write_options(tmp_path, OPTIONS)


def assert_user_error(result, *words: str) -> str:
    """A failed run that printed one short message naming ``words``, and no traceback."""
    stderr = result.stderr
    assert result.returncode != 0, f"mtt exited with 0:\n{result.stdout}\n{stderr}"
    assert "Traceback" not in stderr, stderr
    assert "internal error" not in stderr, stderr
    assert stderr.startswith("mtt: "), stderr
    assert stderr.count("mtt: ") == 1, f"expected one message:\n{stderr}"
    assert len(stderr.strip().splitlines()) <= 12, f"message too long:\n{stderr}"
    for word in words:
        assert word in stderr, f"{word!r} not in:\n{stderr}"
    return stderr


def assert_nothing_written(folder: Path) -> None:
    assert not (folder / "outputs").exists(), "a run folder was created"
    assert not (folder / "model.pt").exists(), "a model was written"


# -- the options file and the command line ----------------------------------------------


def test_options_file_missing(tmp_path):
    result = run_mtt("train", "nothere.yaml", cwd=tmp_path)
    assert_user_error(result, "nothere.yaml", "does not exist")
    assert_nothing_written(tmp_path)


def test_yaml_syntax_error(tmp_path, data_file):
    write_options(tmp_path, "seed: 0\ntraining_set: [data.xyz\nvalidation_set: 0.1\n")
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    stderr = assert_user_error(result, "options.yaml", "not valid YAML", "line")
    assert "<unicode string>" not in stderr
    assert_nothing_written(tmp_path)


def test_typo_in_options_file(tmp_path, data_file):
    write_options(tmp_path, OPTIONS.replace("num_epochs: 1", "num_epoch: 1"))
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "unknown option 'architecture.training.num_epoch'", "'architecture.training.num_epochs'")
    assert_nothing_written(tmp_path)


def test_typo_in_override(tmp_path, options):
    result = run_mtt("train", "options.yaml", "architecture.training.num_epoch=2", cwd=tmp_path)
    assert_user_error(result, "unknown option 'architecture.training.num_epoch'", "'architecture.training.num_epochs'")
    assert_nothing_written(tmp_path)


def test_values_out_of_range_are_tied_to_their_keys(tmp_path, options):
    result = run_mtt(
        "train", "options.yaml", "architecture.training.cache_memory_mb=-1", "architecture.training.batch_size=0",
        "architecture.training.validation_batch_size=0", cwd=tmp_path,
    )  # fmt: skip
    stderr = assert_user_error(
        result,
        "3 problems in the options",
        "'architecture.training.batch_size' must be >= 1, got 0",
        "'architecture.training.cache_memory_mb' must be >= 0, got -1.0",
        "'architecture.training.validation_batch_size' must be >= 1 or null, got 0",
    )
    assert "'architecture.training':" not in stderr
    assert_nothing_written(tmp_path)


def test_an_option_without_its_section(tmp_path, options):
    result = run_mtt("train", "options.yaml", "num_epochs=5", cwd=tmp_path)
    assert_user_error(result, "unknown option 'num_epochs'. Did you mean 'architecture.training.num_epochs'?")
    assert_nothing_written(tmp_path)


def test_unknown_architecture_in_file(tmp_path, data_file):
    write_options(tmp_path, OPTIONS.replace("name: composition", "name: soap_bpn"))
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "unknown architecture 'soap_bpn'", "Did you mean 'soap_bpnn'", "composition")
    assert_nothing_written(tmp_path)


def test_unknown_architecture_in_override(tmp_path, options):
    result = run_mtt("train", "options.yaml", "architecture=compositon", cwd=tmp_path)
    assert_user_error(result, "unknown architecture 'compositon'", "Did you mean 'composition'")
    assert_nothing_written(tmp_path)


def test_second_yaml_file_instead_of_override(tmp_path, options):
    write_options(tmp_path, "seed: 1\n", name="more.yaml")
    result = run_mtt("train", "options.yaml", "more.yaml", cwd=tmp_path)
    assert_user_error(result, "'more.yaml'", "second options file", "key=value")
    assert_nothing_written(tmp_path)


def test_override_without_equal_sign(tmp_path, options):
    result = run_mtt("train", "options.yaml", "seed", "3", cwd=tmp_path)
    assert_user_error(result, "override 'seed'", "'='", "key=value")
    assert_nothing_written(tmp_path)


def test_distributed_maybe(tmp_path, options):
    result = run_mtt("train", "options.yaml", "distributed=maybe", cwd=tmp_path)
    assert_user_error(result, "distributed=maybe", "distributed=true", "distributed=false")
    assert_nothing_written(tmp_path)


def test_several_problems_in_one_message(tmp_path, data_file):
    write_options(
        tmp_path,
        "seeed: 0\n"
        "architecture:\n  name: composition\n  training:\n    num_epoch: 1\n    learning_rate: fast\n"
        "training_set:\n  systems: data.xyz\n  targets:\n    energy: {key: energy, units: eV}\n"
        "validation_set:\n  targets:\n    energy: energy\n",
    )
    result = run_mtt("train", "options.yaml", "base_precision=16", "architecture.training.batch_sise=4", cwd=tmp_path)
    stderr = assert_user_error(
        result,
        "unknown option 'seeed'. Did you mean 'seed'?",
        "'architecture.training.num_epochs'",
        "'architecture.training.learning_rate' must be float, got 'fast'",
        "'base_precision' must be 32 | 64 | null, got 16",
        "'architecture.training.batch_size'",
        "unknown option 'training_set.targets.energy.units'. Did you mean 'training_set.targets.energy.unit'?",
        "missing required option 'validation_set.systems'",
    )
    assert stderr.count("  - ") == 7
    assert_nothing_written(tmp_path)


def test_debug_prints_the_traceback(tmp_path, data_file):
    write_options(tmp_path, OPTIONS.replace("read_from: data.xyz", "read_from: nothere.xyz"))
    result = run_mtt("train", "options.yaml", "--debug", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "DataError" in result.stderr and "read_frames" in result.stderr
    # the short message still comes last, and the advice to use --debug is gone
    last = result.stderr.strip().splitlines()
    assert last[-2].startswith("mtt: invalid data: dataset file") and "nothere.xyz" in last[-2]
    assert "--debug" not in result.stderr
    assert_nothing_written(tmp_path)


# -- datasets ---------------------------------------------------------------------------


def test_dataset_file_missing(tmp_path):
    write_options(tmp_path, OPTIONS.replace("read_from: data.xyz", "read_from: structures/nothere.xyz"))
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, str(tmp_path / "structures" / "nothere.xyz"), "does not exist", "read_from", "--debug")
    assert_nothing_written(tmp_path)


def test_truncated_extxyz(tmp_path, data_file):
    lines = data_file.read_text().splitlines(keepends=True)
    n_atoms = int(lines[0])
    # the second structure stops after two of its atoms
    data_file.write_text("".join(lines[: n_atoms + 2 + 2 + 2]))
    write_options(tmp_path, OPTIONS)
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "could not read", str(data_file), "complete")
    assert_nothing_written(tmp_path)


def test_wrong_atom_count_line(tmp_path, data_file):
    lines = data_file.read_text().splitlines(keepends=True)
    lines[0] = f"{int(lines[0]) + 3}\n"
    data_file.write_text("".join(lines))
    write_options(tmp_path, OPTIONS)
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "could not read", str(data_file))
    assert_nothing_written(tmp_path)


def test_target_key_not_in_file(tmp_path, data_file):
    write_options(tmp_path, OPTIONS.replace("key: energy", "key: U0"))
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "'U0' not found", str(data_file), "energy, forces, stress")
    assert_nothing_written(tmp_path)


def test_unknown_energy_unit(tmp_path, data_file):
    write_options(tmp_path, OPTIONS.replace("unit: eV", "unit: kcal/mole"))
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "'kcal/mole'", "'training_set.targets.energy.unit'", "Did you mean 'kcal/mol'", "Hartree")
    assert_nothing_written(tmp_path)


def test_every_unknown_unit_in_one_message(tmp_path, data_file):
    text = OPTIONS.replace("unit: eV", "unit: kcal").replace(
        "read_from: data.xyz", "read_from: data.xyz\n    length_unit: A0"
    )
    text = text.replace(
        "validation_set: 0.25",
        "validation_set:\n  systems: data.xyz\n  targets:\n    energy: {key: energy, unit: Hartre}",
    )
    write_options(tmp_path, text)
    result = run_mtt("train", "options.yaml", "seed=zero", cwd=tmp_path)
    stderr = assert_user_error(
        result,
        "4 problems in the options",
        "unknown energy unit 'kcal' in 'training_set.targets.energy.unit'",
        "unknown length unit 'A0' in 'training_set.systems.length_unit'",
        "unknown energy unit 'Hartre' in 'validation_set.targets.energy.unit'. Did you mean 'Hartree'?",
        "'seed' must be",
    )
    assert stderr.count("Known energy units: eV") == 2
    assert_nothing_written(tmp_path)


def _write_with_nan(path: Path, what: str) -> None:
    frames = small_dataset()
    for atoms in frames:  # plain arrays and info, so that a NaN survives writing
        atoms.info["energy"] = atoms.get_potential_energy()
        atoms.arrays["forces"] = atoms.get_forces()
        atoms.calc = None
    if what == "energy":
        frames[5].info["energy"] = float("nan")
    else:
        frames[5].arrays["forces"][2, 1] = np.nan
    ase.io.write(path, frames)


@pytest.mark.parametrize("what", ["energy", "forces"])
def test_nan_in_a_target(tmp_path, what):
    _write_with_nan(tmp_path / "data.xyz", what)
    write_options(tmp_path, OPTIONS)
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    stderr = assert_user_error(result, "NaN", "structure 5", str(tmp_path / "data.xyz"), f"key '{what}'")
    if what == "forces":
        assert "forces of 'energy'" in stderr
    assert_nothing_written(tmp_path)


def test_element_only_in_validation_set(tmp_path, emt_file):
    frames = ase.io.read(emt_file, ":")
    without_gold = [a for a in frames if 79 not in a.numbers][:6]
    with_gold = [a for a in frames if 79 in a.numbers][:2]
    ase.io.write(tmp_path / "data.xyz", without_gold)
    ase.io.write(tmp_path / "gold.xyz", with_gold)
    write_options(
        tmp_path,
        OPTIONS.replace(
            "validation_set: 0.25",
            "validation_set:\n  systems: gold.xyz\n  targets:\n    energy: {key: energy, unit: eV}",
        ),
    )
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "gold.xyz", "validation set", "Au (atomic number 79)", "no training structure")
    assert_nothing_written(tmp_path)


def test_validation_set_without_the_forces_of_the_training_set(tmp_path, data_file):
    frames = small_dataset()[:3]
    for atoms in frames:  # energies only
        energy = atoms.get_potential_energy()
        atoms.calc = None
        atoms.info["energy"] = energy
    ase.io.write(tmp_path / "energies.xyz", frames)
    write_options(
        tmp_path,
        OPTIONS.replace(
            "validation_set: 0.25", "validation_set:\n  systems: energies.xyz\n  targets: {energy: energy}"
        ),
    )
    result = run_mtt("train", "options.yaml", cwd=tmp_path)
    assert_user_error(result, "'validation_set' gives energy [eV]", "energy [eV] + forces + stress", "off")
    assert_nothing_written(tmp_path)


def test_split_fraction_leaves_validation_empty(tmp_path, options):
    result = run_mtt("train", "options.yaml", "validation_set=0.001", cwd=tmp_path)
    assert_user_error(result, "validation_set: 0.001", "8 training structures", "empty")
    assert_nothing_written(tmp_path)


def test_split_fractions_leave_training_empty(tmp_path, options):
    result = run_mtt("train", "options.yaml", "validation_set=0.5", "test_set=0.9", cwd=tmp_path)
    assert_user_error(result, "no structure for training", "validation_set", "test_set")
    assert_nothing_written(tmp_path)


# -- --restart --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory) -> Path:
    """The final checkpoint of a real one-epoch run."""
    folder = tmp_path_factory.mktemp("checkpoint_run")
    ase.io.write(folder / "data.xyz", small_dataset())
    write_options(folder, OPTIONS)
    result = run_mtt("train", "options.yaml", cwd=folder)
    assert result.returncode == 0, result.stderr
    (checkpoint,) = folder.glob("outputs/*/*/model.ckpt")
    return checkpoint


def _foreign_torch_file(path: Path) -> None:
    torch.save({"epoch": 3, "state_dict": {"w": torch.zeros(2)}}, path)


def _text_file(path: Path) -> None:
    path.write_text("epoch: 3\nthis is not a checkpoint\n")


def _corrupt_file(path: Path) -> None:
    path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)


@pytest.mark.parametrize(
    "make, words",
    [
        (_foreign_torch_file, ["not an mtt checkpoint"]),
        (_text_file, ["not a readable mtt checkpoint"]),
        (_corrupt_file, ["not a readable mtt checkpoint", "corrupt"]),
    ],
    ids=["torch-save-of-a-dict", "text-file", "corrupt"],
)
def test_restart_from_a_foreign_file(tmp_path, options, make, words):
    make(tmp_path / "old.ckpt")
    result = run_mtt("train", "options.yaml", "--restart", "old.ckpt", cwd=tmp_path)
    assert_user_error(result, "'old.ckpt'", *words)
    assert_nothing_written(tmp_path)


def test_restart_from_a_truncated_checkpoint(tmp_path, options, real_checkpoint):
    content = real_checkpoint.read_bytes()
    (tmp_path / "epoch_1.ckpt").write_bytes(content[: len(content) // 2])
    result = run_mtt("train", "options.yaml", "--restart", "epoch_1.ckpt", cwd=tmp_path)
    assert_user_error(result, "'epoch_1.ckpt'", "not a readable mtt checkpoint", "truncated")
    assert_nothing_written(tmp_path)


def test_restart_from_a_missing_checkpoint(tmp_path, options):
    result = run_mtt("train", "options.yaml", "--restart", "outputs/epoch_9.ckpt", cwd=tmp_path)
    assert_user_error(result, "outputs/epoch_9.ckpt", "does not exist")
    assert_nothing_written(tmp_path)


def test_the_untruncated_checkpoint_restarts(tmp_path, options, real_checkpoint):
    """The control of the truncated case: the same file, whole, is accepted."""
    shutil.copyfile(real_checkpoint, tmp_path / "epoch_1.ckpt")
    more = "architecture.training.num_epochs=2"  # one more epoch: the run is complete at 1
    result = run_mtt("train", "options.yaml", "--restart", "epoch_1.ckpt", more, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "continuing after epoch 1" in result.stdout


# -- errors inside an architecture -------------------------------------------------------


def test_error_inside_an_architecture_blames_it(tmp_path, data_file, monkeypatch, capsys):
    """A plug-in architecture whose model fails: the message names it and its maintainers.

    The architecture is registered in-process (instead of through an installed entry
    point) by extending the registry that mtt reads.
    """
    import mtt.architectures
    from mtt.__main__ import main
    from mtt.architectures.base import Model

    class BrokenModel(Model):
        def __init__(self, hypers, info):
            super().__init__(info)

        def per_atom_outputs(self, batch):
            raise ValueError("shapes (3, 4) and (5,) do not match in the broken layer")

    @dataclasses.dataclass
    class BrokenHypers:
        """No hyperparameters."""

    module = types.ModuleType("mtt_test_broken_architecture")
    module.__model__ = BrokenModel
    module.__hypers__ = BrokenHypers
    module.__maintainers__ = ["Ada Lovelace <ada@example.org>"]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    registry = mtt.architectures.available()
    monkeypatch.setattr(mtt.architectures, "available", lambda: {**registry, "broken": module.__name__})
    monkeypatch.chdir(tmp_path)
    write_options(tmp_path, OPTIONS.replace("name: composition", "name: broken"))

    status = main(["train", "options.yaml"])

    stderr = capsys.readouterr().err
    assert status != 0
    assert "Traceback" not in stderr
    assert "most likely originates from the 'broken' architecture" in stderr
    assert "Ada Lovelace <ada@example.org>" in stderr
    assert "do not match in the broken layer" in stderr
    assert "internal error" not in stderr
    # the error happened during training: the traceback is kept in the run folder
    (log,) = tmp_path.glob("outputs/*/*/error.log")
    assert str(log.relative_to(tmp_path)) in stderr
    assert "per_atom_outputs" in log.read_text()
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize(
    "override, words",
    [
        ("architecture.model.channels=-4", ["architecture.model", "channels"]),
        ("architecture.model.max_l=5", ["max_l=5 is too large for correlation=3", "lower max_l"]),
        ("architecture.model.hidden_l=4", ["hidden_l between 0 and max_l"]),
    ],
)
def test_bad_hyperparameters_of_the_message_passing_model(tmp_path, data_file, override, words):
    """Hyperparameters that cannot make a model are refused before anything is read or written."""
    write_options(tmp_path, OPTIONS.replace("name: composition", "name: equivariant_mp"))
    result = run_mtt("train", "options.yaml", override, cwd=tmp_path)
    assert_user_error(result, *words)
    assert_nothing_written(tmp_path)


def test_a_cutoff_shorter_than_every_distance_is_refused(tmp_path, data_file):
    """No atom would see a neighbour: the model could learn the composition only."""
    write_options(tmp_path, OPTIONS.replace("name: composition", "name: equivariant_mp"))
    result = run_mtt("train", "options.yaml", "architecture.model.cutoff=0.5", cwd=tmp_path)
    assert_user_error(result, "cutoff (0.5 Å) is shorter than the smallest distance", "2.")
    assert not (tmp_path / "model.pt").exists()
