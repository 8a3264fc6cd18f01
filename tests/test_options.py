"""Composition of the options: packaged defaults < options.yaml < command line.

Most tests call :func:`mtt.config.load_options` (Hydra's Compose API inside mtt); the
composed file written to the run folder is also run again through the command line.
"""

from __future__ import annotations

from pathlib import Path

import ase.io
import pytest
import yaml
from conftest import EMT_DATA, run_mtt, write_options

from mtt.architectures.composition import CompositionHypers
from mtt.architectures.soap_bpnn.hypers import SoapBpnnHypers
from mtt.config import load_options
from mtt.data.dataset import load_splits
from mtt.errors import OptionsError

#: indices of EMT alloys in which every element is in several structures
MIXED = [0, 9, 10, 12, 15, 17, 19, 20]


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    frames = ase.io.read(EMT_DATA, ":")
    path = tmp_path / "data.xyz"
    ase.io.write(path, [frames[i] for i in MIXED])
    return path


def compose(folder: Path, text: str, overrides: tuple[str, ...] = ()):
    return load_options(write_options(folder, text), list(overrides))


# -- where each value comes from -----------------------------------------------------------


def test_defaults_come_from_the_packaged_config(tmp_path, data_file):
    options = compose(tmp_path, "training_set: data.xyz\n")
    raw = options.raw

    assert raw["architecture"]["name"] == "soap_bpnn"
    assert raw["validation_set"] == 0.1
    assert raw["test_set"] == 0.1
    assert raw["device"] == "auto"
    assert raw["base_precision"] == 64
    # the distributed and dataset groups, as shipped in mtt/config/conf
    assert raw["distributed"] == {"enabled": False, "port": None, "timeout": 120}
    assert raw["dataset"] == {"reader": "ase", "length_unit": "angstrom"}
    assert raw["training_set"]["systems"]["length_unit"] == "angstrom"
    # the architecture's and the trainer's defaults
    assert raw["architecture"]["model"]["soap"]["cutoff"]["radius"] == 5.0
    assert raw["architecture"]["training"]["num_epochs"] == 100
    assert raw["architecture"]["training"]["batch_size"] == 16
    assert isinstance(options.model_hypers, SoapBpnnHypers)
    assert options.model_hypers.bpnn.num_neurons_per_layer == 32
    assert options.trainer_hypers.learning_rate == 0.01
    assert options.run.distributed.enabled is False


def test_the_file_overrides_defaults_and_keeps_their_siblings(tmp_path, data_file):
    options = compose(
        tmp_path,
        "training_set: data.xyz\n"
        "architecture:\n"
        "  model:\n    soap:\n      cutoff: {radius: 4.0}\n"
        "  training:\n    num_epochs: 7\n"
        "test_set: 0.2\n",
    )
    assert options.model_hypers.soap.cutoff.radius == 4.0
    assert options.model_hypers.soap.cutoff.width == 0.5  # from the defaults
    assert options.model_hypers.soap.max_radial == 6
    assert options.trainer_hypers.num_epochs == 7
    assert options.trainer_hypers.batch_size == 16
    assert options.raw["test_set"] == 0.2
    assert options.raw["validation_set"] == 0.1


def test_the_command_line_overrides_the_file(tmp_path, data_file):
    options = compose(
        tmp_path,
        "seed: 1\ntraining_set: data.xyz\narchitecture:\n  training:\n    num_epochs: 7\n    batch_size: 4\n",
        ("architecture.training.num_epochs=3", "seed=5", "architecture.model.soap.max_angular=2"),
    )
    assert options.trainer_hypers.num_epochs == 3
    assert options.trainer_hypers.batch_size == 4  # the file's value is kept
    assert options.run.seed == 5
    assert options.model_hypers.soap.max_angular == 2
    assert options.raw["architecture"]["training"]["num_epochs"] == 3


def test_null_turns_an_optional_group_off(tmp_path, data_file):
    # SOAP-BPNN has no final stage: null must not read as a stage with default values
    options = compose(tmp_path, "training_set: data.xyz\n")
    assert options.raw["architecture"]["training"]["final_stage"] is None
    assert options.trainer_hypers.final_stage is None
    assert options.trainer_hypers.final_stage_start() is None
    # the message-passing defaults have one, and null on the command line removes it
    text = "training_set: data.xyz\narchitecture: {name: equivariant_mp}\n"
    assert compose(tmp_path, text).trainer_hypers.final_stage.learning_rate == 0.001
    assert compose(tmp_path, text, ("architecture.training.final_stage=null",)).trainer_hypers.final_stage is None


def test_the_precision_is_the_architectures_unless_given(tmp_path, data_file):
    equivariant = "training_set: data.xyz\narchitecture: {name: equivariant_mp}\n"
    assert compose(tmp_path, equivariant).raw["base_precision"] == 32
    assert compose(tmp_path, equivariant).precision_origin == "default"
    given = compose(tmp_path, equivariant, ("base_precision=64",))
    assert (given.raw["base_precision"], given.precision_origin) == (64, "given")
    assert compose(tmp_path, "training_set: data.xyz\n").raw["base_precision"] == 64  # soap_bpnn's


def test_the_last_of_repeated_overrides_wins(tmp_path, data_file):
    options = compose(tmp_path, "training_set: data.xyz\n", ("seed=3", "seed=4"))
    assert options.run.seed == 4


def test_a_missing_seed_is_chosen_and_recorded(tmp_path, data_file):
    options = compose(tmp_path, "training_set: data.xyz\n")
    assert isinstance(options.run.seed, int)
    assert yaml.safe_load(options.to_yaml())["seed"] == options.run.seed


# -- the distributed group: Hydra reads a bare true/false as a boolean ----------------------


@pytest.mark.parametrize(
    "text, overrides, enabled",
    [
        ("", ("distributed=true",), True),
        ("", ("distributed=false",), False),
        ("", ("distributed=True",), True),
        ("", ("distributed=on",), True),
        ("distributed: true\n", (), True),
        ("distributed: false\n", (), False),
        ("distributed: 'true'\n", (), True),
        ("distributed: true\n", ("distributed=false",), False),
        ("distributed:\n  enabled: true\n", ("distributed=false",), False),
        ("distributed:\n  enabled: true\n  port: 29500\n", (), True),
    ],
)
def test_distributed_choices(tmp_path, data_file, text, overrides, enabled):
    options = compose(tmp_path, "training_set: data.xyz\n" + text, overrides)
    assert options.run.distributed.enabled is enabled
    assert options.raw["distributed"]["enabled"] is enabled
    assert options.run.distributed.timeout == 120.0
    if "29500" in text:
        assert options.run.distributed.port == 29500


@pytest.mark.parametrize("text, overrides", [("", ("distributed=maybe",)), ("distributed: maybe\n", ())])
def test_distributed_with_a_wrong_word(tmp_path, data_file, text, overrides):
    with pytest.raises(OptionsError, match="maybe.*not valid") as error:
        compose(tmp_path, "training_set: data.xyz\n" + text, overrides)
    assert "true" in str(error.value) and "false" in str(error.value)


# -- the architecture group ----------------------------------------------------------------


@pytest.mark.parametrize("override", ["architecture=composition", "architecture.name=composition"])
def test_choosing_the_architecture_on_the_command_line(tmp_path, data_file, override):
    """The name picks that architecture's defaults, whichever way it is given."""
    options = compose(
        tmp_path,
        "training_set: data.xyz\narchitecture:\n  name: soap_bpnn\n  training:\n    num_epochs: 7\n",
        (override,),
    )
    assert options.run.architecture.name == "composition"
    assert options.raw["architecture"]["name"] == "composition"
    assert isinstance(options.model_hypers, CompositionHypers)
    assert options.raw["architecture"]["model"] == {}
    assert options.trainer_hypers.num_epochs == 7  # the file's training options are kept


def test_architecture_name_override_gives_that_architectures_defaults(tmp_path, data_file):
    """From composition to soap_bpnn on the command line: the SOAP defaults apply."""
    options = compose(
        tmp_path,
        "training_set: data.xyz\narchitecture:\n  name: composition\n",
        ("architecture.name=soap_bpnn", "architecture.model.soap.max_radial=3"),
    )
    assert isinstance(options.model_hypers, SoapBpnnHypers)
    assert options.model_hypers.soap.max_radial == 3
    assert options.model_hypers.soap.max_angular == 4


def test_architecture_as_a_bare_name_in_the_file(tmp_path, data_file):
    options = compose(tmp_path, "training_set: data.xyz\narchitecture: composition\n")
    assert options.run.architecture.name == "composition"
    assert isinstance(options.model_hypers, CompositionHypers)


@pytest.mark.parametrize("override", ["architecture=compositon", "architecture.name=compositon"])
def test_unknown_architecture_on_the_command_line(tmp_path, data_file, override):
    with pytest.raises(OptionsError, match="unknown architecture 'compositon'. Did you mean 'composition'"):
        compose(tmp_path, "training_set: data.xyz\n", (override,))


def test_hypers_of_another_architecture_are_reported(tmp_path, data_file):
    with pytest.raises(OptionsError, match="unknown option 'architecture.model.soap'"):
        compose(
            tmp_path,
            "training_set: data.xyz\narchitecture:\n  model:\n    soap: {max_radial: 2}\n",
            ("architecture=composition",),
        )


# -- values and paths ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "folder_name, quote",
    [
        ("run=1,lr=0.1", ""),
        ("run=1,lr=0.1", "'"),
        ("run=1,lr=0.1", '"'),
        ("a,b", ""),
        ("copy (1)", ""),
        ("it's [old]", ""),
        ("données", ""),
        ("back\\slash", ""),
    ],
)
def test_a_path_with_special_characters_survives(tmp_path, folder_name, quote):
    """Paths go through Hydra's override grammar, where '=', ',', quotes and brackets mean things."""
    folder = tmp_path / folder_name
    folder.mkdir()
    frames = ase.io.read(EMT_DATA, ":")
    ase.io.write(folder / "data.xyz", [frames[i] for i in MIXED])
    write_options(tmp_path, "seed: 0\ntraining_set: elsewhere.xyz\n")

    path = folder / "data.xyz"
    options = load_options(tmp_path / "options.yaml", [f"training_set.systems.read_from={quote}{path}{quote}"])
    assert options.raw["training_set"]["systems"]["read_from"] == str(path)
    splits = load_splits(options.raw, tmp_path, options.run.seed)
    assert len(splits.train) + len(splits.validation) + len(splits.test) == len(MIXED)


def test_a_path_in_the_home_folder(tmp_path, monkeypatch, data_file):
    monkeypatch.setenv("HOME", str(tmp_path))
    options = compose(tmp_path / "..", "training_set: ~/data.xyz\n")
    assert options.raw["training_set"]["systems"]["read_from"] == str(data_file)
    options = compose(tmp_path, "training_set: other.xyz\n", ("training_set.systems.read_from=~/data.xyz",))
    assert options.raw["training_set"]["systems"]["read_from"] == str(data_file)


def test_an_interpolation_naming_no_option(tmp_path, data_file):
    with pytest.raises(OptionsError, match="could not resolve.*'nope'"):
        compose(tmp_path, "training_set: data.xyz\nseed: ${nope}\n")
    options = compose(tmp_path, "training_set: data.xyz\nseed: 3\ntest_set: ${validation_set}\n")
    assert options.raw["test_set"] == options.raw["validation_set"] == 0.1


def test_relative_paths_are_taken_from_the_options_file_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "data").mkdir()
    ase.io.write(folder / "data" / "train.xyz", ase.io.read(EMT_DATA, ":3"))
    write_options(folder, "training_set: data/train.xyz\nvalidation_set:\n  - data/train.xyz\n")
    monkeypatch.chdir(tmp_path)

    options = load_options("project/options.yaml")
    expected = str((folder / "data" / "train.xyz").resolve())
    assert options.raw["training_set"]["systems"]["read_from"] == expected
    assert options.raw["validation_set"][0]["systems"]["read_from"] == expected


def test_the_composed_options_compose_to_themselves(tmp_path, data_file):
    options = compose(
        tmp_path,
        "training_set: data.xyz\narchitecture:\n  name: composition\n",
        ("architecture.training.num_epochs=2", "distributed=true"),
    )
    again = load_options(write_options(tmp_path, options.to_yaml(), name="composed.yaml"))
    assert again.raw == options.raw


def test_the_run_folder_options_run_again_from_anywhere(tmp_path, data_file):
    write_options(
        tmp_path,
        "seed: 3\narchitecture:\n  name: composition\n  training:\n    num_epochs: 1\n"
        "training_set: data.xyz\nvalidation_set: 0.25\ntest_set: 0\n",
    )
    first = run_mtt("train", "options.yaml", "architecture.training.batch_size=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (composed,) = tmp_path.glob("outputs/*/*/options.yaml")
    written = yaml.safe_load(composed.read_text())
    read_from = written["training_set"]["systems"]["read_from"]
    assert Path(read_from).is_absolute() and Path(read_from) == data_file.resolve()
    assert written["architecture"]["training"]["batch_size"] == 2

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = run_mtt("train", str(composed), cwd=elsewhere)
    assert second.returncode == 0, second.stderr
    (recomposed,) = elsewhere.glob("outputs/*/*/options.yaml")
    assert yaml.safe_load(recomposed.read_text()) == written
    training = sorted((tmp_path / "outputs").glob("*/*/indices/training.txt"))[0]
    assert (next(elsewhere.glob("outputs/*/*/indices/training.txt"))).read_text() == training.read_text()


# -- metatrain's short forms ---------------------------------------------------------------


def test_a_file_name_reads_an_energy_target(tmp_path, data_file):
    options = compose(tmp_path, "training_set: data.xyz\n")
    splits = load_splits(options.raw, tmp_path, 0)
    (target,) = splits.info.targets.values()
    assert target.name == "energy" and target.quantity == "energy" and target.unit == "eV"
    assert target.forces and target.stress  # the file has both
    frames = ase.io.read(data_file, ":")
    energies = {round(a.get_potential_energy(), 8) for a in frames}
    assert {round(float(s.values["energy"]), 8) for s in splits.train.structures} <= energies


def test_overrides_apply_to_a_short_form(tmp_path, data_file):
    options = compose(tmp_path, "training_set: data.xyz\n", ("training_set.targets.energy.unit=kcal/mol",))
    assert options.raw["training_set"]["systems"]["read_from"] == str(data_file)
    assert options.raw["training_set"]["targets"]["energy"]["unit"] == "kcal/mol"


def test_a_target_given_by_its_key(tmp_path, data_file):
    frames = ase.io.read(data_file, ":")
    for atoms in frames:
        atoms.info["e_dft"] = atoms.get_potential_energy() + 1.0
    ase.io.write(data_file, frames)
    options = compose(
        tmp_path,
        "training_set:\n  systems: data.xyz\n  targets:\n    energy: e_dft\nvalidation_set: data.xyz\ntest_set: 0\n",
    )
    assert options.raw["training_set"]["targets"]["energy"] == {"key": "e_dft"}
    splits = load_splits(options.raw, tmp_path, 0)
    energies = [float(s.values["energy"]) for s in splits.train.structures]
    assert energies == pytest.approx([a.info["e_dft"] for a in frames])
    assert splits.info.targets["energy"].forces  # the file's 'forces' array, found by default


@pytest.mark.parametrize(
    "text, overrides",
    [
        ("      forces: off\n", ()),
        ("      forces: false\n", ()),
        ("", ("training_set.targets.energy.forces=off",)),
    ],
)
def test_forces_off(tmp_path, data_file, text, overrides):
    options = compose(
        tmp_path,
        "training_set:\n  systems: data.xyz\n  targets:\n    energy:\n      key: energy\n"
        + text
        + "validation_set: 0.25\ntest_set: 0\n",
        overrides,
    )
    splits = load_splits(options.raw, tmp_path, 0)
    target = splits.info.targets["energy"]
    assert not target.forces
    assert target.stress  # only the forces are switched off
    assert all(not s.forces for s in splits.train.structures + splits.validation.structures)


def test_a_list_of_dataset_blocks(tmp_path):
    frames = ase.io.read(EMT_DATA, ":")
    ase.io.write(tmp_path / "first.xyz", [frames[i] for i in MIXED[:4]])
    ase.io.write(tmp_path / "second.xyz", [frames[i] for i in MIXED[4:]])
    options = compose(
        tmp_path,
        "training_set:\n"
        "  - first.xyz\n"
        "  - systems: second.xyz\n    targets:\n      energy: {key: energy, unit: eV}\n"
        "validation_set: 0.25\ntest_set: 0\n",
    )
    splits = load_splits(options.raw, tmp_path, 0)
    assert len(splits.train) == 6 and len(splits.validation) == 2
    files = {Path(path).name for path, _ in splits.origins["training"] + splits.origins["validation"]}
    assert files == {"first.xyz", "second.xyz"}
