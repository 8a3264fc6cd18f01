"""Converted datasets (`mtt data convert`, `mtt data info`) streamed by `mtt train` and read
by `mtt eval`: the same numbers as the extended XYZ file they come from, each rank reading
its part, and every bad input refused with nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import numpy as np
import pytest
from conftest import EMT_DATA, SMALL_SOAP, run_mtt, torchrun_train, write_options
from test_distributed import assert_same_epochs, epoch_metrics

#: the dataset file of the shipped EMT data: energies, forces and stress
DATASET = f"""\
systems: {EMT_DATA}
targets:
  energy: {{key: energy, unit: eV, forces: on, stress: on}}
"""


def training_options(training_set: str, extra: str = "", validation: str = "0.1") -> str:
    return (
        "seed: 3\n"
        f"architecture:\n  {SMALL_SOAP.replace(chr(10), chr(10) + '  ')}\n"
        f"  training: {{batch_size: 8, num_epochs: 2{extra}}}\n"
        f"training_set: {training_set}\nvalidation_set: {validation}\ntest_set: 0.1\n"
    )


def convert(folder: Path, text: str = DATASET, output: str = "emt", *args: str) -> subprocess.CompletedProcess:
    write_options(folder, text, "dataset.yaml")
    return run_mtt("data", "convert", "dataset.yaml", "-o", output, *args, cwd=folder)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The EMT data converted once, by two processes."""
    folder = tmp_path_factory.mktemp("converted")
    result = convert(folder, DATASET, "emt", "--processes", "2")
    assert result.returncode == 0, result.stderr
    return folder / "emt.mttdata"


def test_convert_writes_every_structure_and_info_describes_it(converted):
    from mtt.data.options import parse_dataset_list
    from mtt.data.readers import read_dataset
    from mtt.data.store import Store

    # the structures, in internal units, as reading the XYZ file into memory gives them
    (block,) = parse_dataset_list({"systems": str(EMT_DATA), "targets": {"energy": {"key": "energy"}}}, "x")
    expected, _, _ = read_dataset(block, EMT_DATA.parent, "x")
    store = Store(converted)
    targets = store.description.targets
    assert [t.name for t in targets] == ["energy"] and targets[0].forces and targets[0].stress
    for index in (0, 37, 99):
        stored = store.structure(index, targets)
        for name in ("types", "positions", "cell", "pbc"):
            assert np.array_equal(getattr(stored, name).numpy(), getattr(expected[index], name).numpy()), name
        for kind in ("values", "forces", "stress"):
            assert np.array_equal(getattr(stored, kind)["energy"].numpy(), getattr(expected[index], kind)["energy"])

    result = run_mtt("data", "info", str(converted), "--verify", cwd=converted.parent)
    assert result.returncode == 0, result.stderr
    frames = ase.io.read(EMT_DATA, ":")
    sizes = [len(a) for a in frames]
    assert "structures      100 (100 periodic in 3 directions)" in result.stdout
    assert f"atoms           {sum(sizes):,}; " in result.stdout
    assert f"{min(sizes)} to {max(sizes)} per structure" in result.stdout
    assert "energy [eV] + forces [eV/Å] + stress [eV/Å^3]" in result.stdout
    assert "Cu (" in result.stdout and "Au (" in result.stdout and "Pt (" in result.stdout
    assert "size on disk" in result.stdout and "verified" in result.stdout


def test_convert_adds_the_extension_and_refuses_to_replace(tmp_path):
    result = convert(tmp_path, DATASET, "train")
    assert result.returncode == 0, result.stderr
    assert f"wrote {Path('train.mttdata')}: 100 structures" in result.stdout
    assert (tmp_path / "train.mttdata" / "dataset.json").is_file()
    before = (tmp_path / "train.mttdata" / "dataset.json").read_text()
    again = convert(tmp_path, DATASET, "train.mttdata")
    assert again.returncode != 0
    assert "'train.mttdata' already exists; nothing was written" in again.stderr
    assert (tmp_path / "train.mttdata" / "dataset.json").read_text() == before


def test_training_streams_a_converted_dataset_to_the_numbers_of_the_xyz_file(converted, tmp_path):
    """SOAP-BPNN keeps its descriptor between epochs: a streamed structure, read again at
    every epoch, gets the very inputs kept from its first reading."""
    xyz = tmp_path / "xyz"
    xyz.mkdir()
    block = "{systems: " + str(EMT_DATA) + ", targets: {energy: {key: energy, unit: eV, forces: on, stress: on}}}"
    result = run_mtt("train", str(write_options(xyz, training_options(block))), cwd=xyz)
    assert result.returncode == 0, result.stderr
    streamed = tmp_path / "streamed"
    streamed.mkdir()
    result = run_mtt("train", str(write_options(streamed, training_options(str(converted)))), cwd=streamed)
    assert result.returncode == 0, result.stderr
    assert "80 training, 10 validation, 10 test structures" in result.stdout
    assert epoch_metrics(streamed) == epoch_metrics(xyz)
    (log,) = streamed.glob("outputs/*/*/train.log")
    # read once: held in memory afterwards
    loading = "structures read by each rank in the first epoch: 80; in the last: 0; held in memory: 80;"
    assert f"data loading: {loading}" in log.read_text()
    # the same structures in the indices files, by their index in the converted dataset
    (indices,) = streamed.glob("outputs/*/*/indices/test.txt")
    (reference,) = xyz.glob("outputs/*/*/indices/test.txt")
    assert [line.split("\t")[1] for line in indices.read_text().splitlines()] == [
        line.split("\t")[1] for line in reference.read_text().splitlines()
    ]
    # eval reads the run's test set from the converted dataset, and a converted dataset given to it
    test_set = run_mtt("eval", str(next(streamed.glob("outputs/*/*"))), cwd=streamed)
    assert test_set.returncode == 0, test_set.stderr
    assert "test set of" in test_set.stdout and ": 10 structures" in test_set.stdout
    write_options(streamed, f"systems: {converted}\n", "eval.yaml")
    whole = run_mtt("eval", "model.pt", "eval.yaml", "-o", "all.xyz", cwd=streamed)
    assert whole.returncode == 0, whole.stderr
    assert len(ase.io.read(streamed / "all.xyz", ":")) == 100


def test_a_message_passing_model_streams_to_the_numbers_of_the_xyz_file(converted, tmp_path):
    """equivariant_mp keeps nothing per structure: the structures alone are held."""
    architecture = "name: equivariant_mp\n  model: {channels: 8, max_l: 1, hidden_l: 1, correlation: 2, num_layers: 2}"
    block = "{systems: " + str(EMT_DATA) + ", targets: {energy: {key: energy, unit: eV, forces: on, stress: on}}}"
    runs = {}
    for name, training_set in (("xyz", block), ("streamed", str(converted))):
        folder = tmp_path / name
        folder.mkdir()
        text = training_options(training_set).replace(SMALL_SOAP.replace(chr(10), chr(10) + "  "), architecture)
        result = run_mtt("train", str(write_options(folder, text)), cwd=folder)
        assert result.returncode == 0, result.stderr
        runs[name] = epoch_metrics(folder)
    assert_same_epochs(runs["streamed"], runs["xyz"])
    (log,) = (tmp_path / "streamed").glob("outputs/*/*/train.log")
    assert "in the last: 0; held in memory: 80;" in log.read_text()
    assert "cache of precomputed inputs is full" not in log.read_text()


@pytest.mark.parametrize(
    ("budget", "loading"),
    [
        # nothing kept: every structure read at every epoch
        ("0", "in the first epoch: 80; in the last: 80; held in memory: 0;"),
        # the kept descriptors of a few structures dropped to hold structures instead
        ("2", "in the last: 0; held in memory: 80;"),
    ],
)
def test_a_memory_budget_too_small_to_keep_everything_gives_the_same_numbers(converted, tmp_path, budget, loading):
    block = "{systems: " + str(EMT_DATA) + ", targets: {energy: {key: energy, unit: eV, forces: on, stress: on}}}"
    extra = f", cache_memory_mb: {budget}"
    xyz = tmp_path / "xyz"
    xyz.mkdir()
    result = run_mtt("train", str(write_options(xyz, training_options(block, extra))), cwd=xyz)
    assert result.returncode == 0, result.stderr
    streamed = tmp_path / "streamed"
    streamed.mkdir()
    result = run_mtt("train", str(write_options(streamed, training_options(str(converted), extra))), cwd=streamed)
    assert result.returncode == 0, result.stderr
    assert_same_epochs(epoch_metrics(streamed), epoch_metrics(xyz))
    (log,) = streamed.glob("outputs/*/*/train.log")
    assert loading in log.read_text()


def test_two_ranks_stream_their_halves_to_the_numbers_of_one_process(converted, tmp_path):
    options = training_options(str(converted), ", checkpoint_interval: 1")
    single = tmp_path / "single"
    single.mkdir()
    result = run_mtt("train", str(write_options(single, options)), "architecture.training.batch_size=16", cwd=single)
    assert result.returncode == 0, result.stderr
    result = torchrun_train(write_options(tmp_path, options), tmp_path)
    assert result.returncode == 0, result.stderr
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(single))
    (log,) = tmp_path.glob("outputs/*/*/train.log")
    # each rank reads its half; at the next epoch, what it was not given before (the shares are shuffled)
    assert "structures read by each rank in the first epoch: 40, 40; in the last: " in log.read_text()


# -- bad input: a clear message, a non-zero exit, nothing half-written ---------------------------


def copy_of(converted: Path, folder: Path) -> Path:
    import shutil

    target = folder / converted.name
    shutil.copytree(converted, target)
    return target


def train_on(folder: Path, dataset: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run_mtt("train", str(write_options(folder, training_options(str(dataset)))), *overrides, cwd=folder)


def assert_refused(result: subprocess.CompletedProcess, *phrases: str, folder: Path | None = None) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr
    if folder is not None:
        assert not (folder / "outputs").exists() and not (folder / "model.pt").exists()


def test_a_truncated_or_garbled_dataset_is_refused_before_training(converted, tmp_path):
    dataset = copy_of(converted, tmp_path)
    positions = dataset / "positions.npy"
    positions.write_bytes(positions.read_bytes()[: positions.stat().st_size // 2])
    assert_refused(
        train_on(tmp_path, dataset),
        "invalid data",
        "is not a complete converted dataset: 'positions.npy' cannot be read",
        "Convert it again",
        folder=tmp_path,
    )
    (dataset / "dataset.json").write_text("{not json")
    assert_refused(train_on(tmp_path, dataset), "its dataset.json cannot be read", folder=tmp_path)
    (dataset / "dataset.json").unlink()
    assert_refused(run_mtt("data", "info", str(dataset), cwd=tmp_path), "it has no dataset.json")


def test_changed_bytes_are_found_by_info_verify(converted, tmp_path):
    dataset = copy_of(converted, tmp_path)
    forces = np.load(dataset / "forces.energy.npy", mmap_mode="r+")
    forces[5, 1] += 1.0
    forces.flush()
    del forces
    assert_refused(run_mtt("data", "info", str(dataset), "--verify", cwd=tmp_path), "the dataset is corrupt")


def test_a_dataset_of_a_newer_format_is_refused(converted, tmp_path):
    dataset = copy_of(converted, tmp_path)
    description = json.loads((dataset / "dataset.json").read_text())
    description["version"] = 99
    (dataset / "dataset.json").write_text(json.dumps(description))
    result = train_on(tmp_path, dataset)
    assert_refused(result, "was written by a newer mtt (dataset format version 99", folder=tmp_path)


@pytest.mark.parametrize(
    ("targets", "phrase"),
    [
        ("{dipole: {unit: debye}}", "asks for the target 'dipole', which the converted dataset"),
        ("{energy: {unit: kcal/mol}}", "holds energy in eV (converted datasets store internal units)"),
    ],
)
def test_targets_the_dataset_lacks_are_refused(converted, tmp_path, targets, phrase):
    block = "{systems: " + str(converted) + ", targets: " + targets + "}"
    result = run_mtt("train", str(write_options(tmp_path, training_options(block))), cwd=tmp_path)
    assert_refused(result, phrase, folder=tmp_path)


def test_a_target_block_selects_among_the_stored_targets(converted, tmp_path):
    block = "{systems: " + str(converted) + ", targets: {energy: {forces: off, stress: off}}}"
    result = run_mtt("train", str(write_options(tmp_path, training_options(block))), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "learning energy [eV]\n" in result.stdout


def test_datasets_with_different_targets_are_not_combined(tmp_path):
    text = (
        f"- systems: {EMT_DATA}\n  targets: {{energy: {{key: energy, forces: on, stress: off}}}}\n"
        f"- systems: {EMT_DATA}\n  targets: {{energy: {{key: energy, forces: off, stress: off}}}}\n"
    )
    result = convert(tmp_path, text, "mixed")
    assert_refused(result, "gives energy [eV], but", "gives energy [eV] + forces")
    assert not list(tmp_path.glob("*mttdata*")) and not list(tmp_path.glob(".mixed*"))


def test_an_element_of_a_streamed_validation_set_that_training_lacks(tmp_path):
    frames = ase.io.read(EMT_DATA, ":")
    ase.io.write(tmp_path / "cu.xyz", [a for a in frames if set(a.get_chemical_symbols()) == {"Cu"}])
    ase.io.write(tmp_path / "others.xyz", [a for a in frames if "Pt" in a.get_chemical_symbols()][:5])
    for name in ("cu", "others"):
        text = f"systems: {name}.xyz\ntargets: {{energy: {{key: energy, forces: on, stress: on}}}}\n"
        assert convert(tmp_path, text, name).returncode == 0
    options = training_options("cu.mttdata", validation="others.mttdata")
    result = run_mtt("train", str(write_options(tmp_path, options)), cwd=tmp_path)
    assert_refused(result, "structure 0 of", "others.mttdata' in the validation set has Pt", folder=tmp_path)


def test_conversion_stopped_by_ctrl_c_leaves_nothing(tmp_path):
    frames = ase.io.read(EMT_DATA, ":")
    write_options(tmp_path, DATASET.replace(str(EMT_DATA), "many.xyz"), "dataset.yaml")
    # the signal must come while the partial folder is being filled: a conversion that ended
    # before this process saw the folder (a loaded machine can hold it back for seconds)
    # is run again, ten times longer
    for copies in (100, 1000):
        ase.io.write(tmp_path / "many.xyz", frames * copies)
        process = subprocess.Popen(
            [sys.executable, "-m", "mtt", "data", "convert", "dataset.yaml", "-o", "many"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while process.poll() is None and not list(tmp_path.glob(".many.mttdata.partial-*")):
            assert time.monotonic() < deadline, "the conversion never started writing"
            time.sleep(0.002)
        if process.poll() is None:
            break
        process.communicate()
        shutil.rmtree(tmp_path / "many.mttdata", ignore_errors=True)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "conversion stopped; nothing was written at many.mttdata" in stderr
    assert not (tmp_path / "many.mttdata").exists() and not list(tmp_path.glob(".many*"))


def test_a_full_disk_is_said_and_leaves_nothing(tmp_path):
    """The file-size limit stands in for a full disk: the space is taken before parsing."""
    import resource

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    write_options(tmp_path, DATASET, "dataset.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "mtt", "data", "convert", "dataset.yaml", "-o", "emt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
        env={**os.environ},
    )
    assert_refused(result, "no room for the converted dataset", "nothing was written", "Free disk space")
    assert not list(tmp_path.glob("*mttdata*")) and not list(tmp_path.glob(".emt*"))


# -- batches packed by atom count ---------------------------------------------------------------


def test_packed_batches_hold_at_most_the_atoms_and_ranks_share_them():
    from mtt.data.batching import packed_batches, share_by_atoms

    n_atoms = np.array([2, 500, 30, 30, 30, 4, 4, 64, 200, 3])
    batches = packed_batches(list(range(10)), n_atoms, 100)
    assert batches == [[0], [1], [2, 3, 4, 5, 6], [7], [8], [9]]  # 500 and 200 atoms: alone
    assert sorted(i for b in batches for i in b) == list(range(10))
    parts = [share_by_atoms([2, 3, 4, 5, 6], n_atoms, rank, 2) for rank in (0, 1)]
    assert parts == [[2, 3], [4, 5, 6]]  # 60 and 38 atoms
    assert share_by_atoms([1], n_atoms, 1, 2) == []  # that rank computes with no share of the loss


def test_two_ranks_with_packed_batches_match_one_process(converted, tmp_path):
    options = training_options(str(converted), ", max_atoms_per_batch: 60")
    single = tmp_path / "single"
    single.mkdir()
    overrides = ("architecture.training.max_atoms_per_batch=120",)
    result = run_mtt("train", str(write_options(single, options)), *overrides, cwd=single)
    assert result.returncode == 0, result.stderr
    assert "batches packed to 120 atoms" in result.stdout
    result = torchrun_train(write_options(tmp_path, options), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "batches packed to 60 atoms per rank (120 in all)" in result.stdout
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(single))


def test_read_from_short_form_and_a_restart_of_a_streamed_run(converted, tmp_path):
    options = training_options(f"{{read_from: {converted}}}", validation=f"{{read_from: {converted}}}")
    path = write_options(tmp_path, options)
    result = run_mtt("train", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "90 training, 100 validation, 10 test structures" in result.stdout
    again = run_mtt("train", str(path), "--restart", "auto", "architecture.training.num_epochs=3", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "continuing after epoch 2" in again.stdout
