"""Restarts as users run them, through the CLI: which options may change, which run
``--restart auto`` continues, finished runs, Ctrl-C, and the model file of an earlier run."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import pytest
import yaml
from conftest import EMT_DATA, ROOT, SMALL_SOAP, emt_options, logged_test_errors, run_mtt, write_options

PLUGINS = ROOT / "tests" / "plugins"

SOAP = emt_options(
    SMALL_SOAP,
    "{batch_size: 8, num_epochs: 2, checkpoint_interval: 1, lr_schedule: constant, warmup_fraction: 0.0}",
    "energy: {key: energy, unit: eV, forces: on, stress: off}",
    seed=7,
)

#: trains in a second: the composition model has no weights, only its baseline
COMPOSITION = emt_options("name: composition", "{num_epochs: 2, batch_size: 10}", validation=0.2)


def runs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("outputs/*/*") if p.is_dir())


def train(folder: Path, *args: str, options: str = "options.yaml", env: dict | None = None):
    result = run_mtt("train", options, *args, cwd=folder, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def soap_run(tmp_path_factory) -> Path:
    """A finished two-epoch SOAP-BPNN run, copied by the tests that restart it."""
    folder = tmp_path_factory.mktemp("soap")
    write_options(folder, SOAP)
    train(folder)
    return folder


def copy_of(run: Path, tmp_path: Path) -> Path:
    subprocess.run(["cp", "-r", f"{run}/.", str(tmp_path)], check=True)
    return tmp_path


@pytest.mark.parametrize(
    "change", ["architecture.model.soap.cutoff.radius=4.0", "architecture.model.soap.max_radial=4"]
)
def test_a_restart_refuses_another_model_listing_every_change(soap_run, change):
    folder = soap_run  # the run of this very options file, which nothing here may change
    model = (folder / "model.pt").read_bytes()
    before = runs(folder)
    epochs = "architecture.training.num_epochs=3"
    result = run_mtt("train", "options.yaml", "--restart", "auto", change, epochs, cwd=folder)
    assert result.returncode == 2, result.stdout + result.stderr
    stderr = result.stderr
    assert stderr.startswith("mtt: invalid checkpoint: the options differ") and stderr.count("mtt: ") == 1
    key = change.split("=")[0]
    assert f"{key}: " in stderr and "(cannot change: the model)" in stderr
    assert "architecture.training.num_epochs: 2 in the checkpoint, 3 now (applied)" in stderr
    assert "internal error" not in stderr and "Traceback" not in stderr
    assert runs(folder) == before, "a refused restart leaves no run folder"
    assert (folder / "model.pt").read_bytes() == model


def test_a_restart_applies_and_logs_epochs_and_learning_rate(soap_run, tmp_path):
    folder = copy_of(soap_run, tmp_path)
    result = train(
        folder,
        "--restart",
        "auto",
        "architecture.training.num_epochs=3",
        "architecture.training.learning_rate=0.002",
    )
    assert "architecture.training.num_epochs: 2 in the checkpoint, 3 now (applied)" in result.stdout
    assert "architecture.training.learning_rate: 0.01 in the checkpoint, 0.002 now (applied)" in result.stdout
    with open(runs(folder)[-1] / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    # the continued run's metrics start with the history of the run it continues
    assert [row["epoch"] for row in rows] == ["1", "2", "3"]
    assert [float(row["learning_rate"]) for row in rows] == [0.01, 0.01, 0.002]


def test_a_restart_keeps_the_structures_of_each_step(soap_run, tmp_path):
    folder = copy_of(soap_run, tmp_path)
    checkpoint = next(folder.glob("outputs/*/*/checkpoints/epoch_1.ckpt"))
    smaller = "architecture.training.batch_size=4"
    result = run_mtt("train", "options.yaml", "--restart", str(checkpoint), smaller, cwd=folder)
    assert result.returncode == 2
    assert "trained with 8 structures per step, but batch_size 4 on 1 rank(s) gives 4" in result.stderr
    assert "architecture.training.batch_size=8 keeps it" in result.stderr


def test_a_restart_checks_the_data_not_its_path(soap_run, tmp_path):
    folder = copy_of(soap_run, tmp_path)
    checkpoint = next(folder.glob("outputs/*/*/checkpoints/epoch_1.ckpt"))
    (folder / "moved").mkdir()
    shutil.copyfile(EMT_DATA, folder / "moved" / "emt_metals.xyz")  # the same structures elsewhere
    moved = write_options(folder, SOAP.replace(str(EMT_DATA), "moved/emt_metals.xyz"), name="moved.yaml")
    result = train(folder, "--restart", str(checkpoint), options=str(moved))
    assert "continuing after epoch 1" in result.stdout

    frames = ase.io.read(EMT_DATA, ":")
    frames[3].calc.results["energy"] += 0.5  # one energy changed in place
    ase.io.write(folder / "moved" / "emt_metals.xyz", frames)
    result = run_mtt("train", str(moved), "--restart", str(checkpoint), cwd=folder)
    assert result.returncode == 2
    assert "structures are not those" in result.stderr and "a dataset file changed" in result.stderr


def test_restart_auto_continues_only_a_run_of_the_same_options(tmp_path):
    write_options(tmp_path, COMPOSITION + "seed: 1\n", name="other.yaml")
    train(tmp_path, "architecture.training.num_epochs=6", options="other.yaml")
    write_options(tmp_path, COMPOSITION + "seed: 0\n")
    # overrides after the flags, --debug before the command
    epochs = "architecture.training.num_epochs=1"
    first = run_mtt("--debug", "train", "options.yaml", "--restart", "auto", epochs, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "1 run(s) under outputs have other options and are not continued" in first.stdout
    assert "differs in seed" in first.stdout
    assert "starting from scratch" in first.stdout
    own = runs(tmp_path)[-1]
    assert yaml.safe_load((own / "options.yaml").read_text())["architecture"]["training"]["num_epochs"] == 1

    second = train(tmp_path, "--restart", "auto", "architecture.training.num_epochs=2")
    expected = Path("outputs") / own.relative_to(tmp_path / "outputs")
    assert f"continuing after epoch 1 from {expected}/" in second.stdout, second.stdout


def test_restart_auto_of_a_finished_run_trains_and_writes_nothing(tmp_path):
    write_options(tmp_path, COMPOSITION + "seed: 0\n")
    train(tmp_path)
    before, model = runs(tmp_path), (tmp_path / "model.pt").stat()
    result = train(tmp_path, "--restart", "auto")
    assert "is already complete (epoch 2 of 2): nothing to train, nothing written" in result.stdout
    assert "architecture.training.num_epochs" in result.stdout
    assert runs(tmp_path) == before
    assert (tmp_path / "model.pt").stat().st_mtime_ns == model.st_mtime_ns
    assert not (tmp_path / "model.1.pt").exists()


def test_a_restart_keeps_a_seed_drawn_at_random(tmp_path):
    """Without a seed, each run draws one: a restart must take the checkpoint's, or the
    split (and so the validation set) would change under the half-trained model."""
    write_options(tmp_path, COMPOSITION)
    train(tmp_path, "architecture.training.num_epochs=1")
    first = runs(tmp_path)[-1]
    train(tmp_path, "--restart", "auto")
    second = runs(tmp_path)[-1]
    assert first != second
    seeds = [yaml.safe_load((run / "options.yaml").read_text())["seed"] for run in (first, second)]
    assert seeds[0] == seeds[1]
    for name in ("training", "validation", "test"):
        assert (first / "indices" / f"{name}.txt").read_text() == (second / "indices" / f"{name}.txt").read_text()


#: equivariant_mp, whose default precision is float32, at its smallest
SMALL_MP = emt_options(
    "name: equivariant_mp\nmodel: {channels: 8, max_l: 1, hidden_l: 1, correlation: 2, num_layers: 1}",
    "{batch_size: 8, num_epochs: 1}",
    "energy: {key: energy, unit: eV, forces: on}",
    seed=3,
)


def test_the_precision_is_the_architectures_and_a_restart_keeps_the_checkpoints(tmp_path):
    """A run without base_precision runs at its architecture's (equivariant_mp: float32) and
    says so; a float64 run, as every run of an mtt before architectures had their own, is
    continued in float64 by a restart whose options set no precision."""
    write_options(tmp_path, SMALL_MP)
    result = train(tmp_path)
    assert "precision: float32, equivariant_mp's default (base_precision: 64 for float64)" in result.stdout
    assert re.search(r"precision:\s+float32", result.stdout.split("Summary")[1])
    assert yaml.safe_load((runs(tmp_path)[-1] / "options.yaml").read_text())["base_precision"] == 32
    assert exported_dtype(tmp_path / "model.pt") == "float32"

    train(tmp_path, "base_precision=64", "seed=4")
    older = runs(tmp_path)[-1]
    result = train(tmp_path, "seed=4", "architecture.training.num_epochs=2", "--restart", "auto")
    assert f"continuing after epoch 1 from outputs/{older.relative_to(tmp_path / 'outputs')}" in result.stdout
    assert "precision: float64, the restarted run's" in result.stdout
    assert yaml.safe_load((runs(tmp_path)[-1] / "options.yaml").read_text())["base_precision"] == 64
    assert exported_dtype(tmp_path / "model.pt") == "float64"


def exported_dtype(model: Path) -> str:
    """The dtype an exported model declares, read in a process without mtt."""
    script = (
        "import sys; from metatomic.torch import load_atomistic_model; "
        "print(load_atomistic_model(sys.argv[1], extensions_directory=sys.argv[2]).capabilities().dtype)"
    )
    output = subprocess.run(
        [sys.executable, "-c", script, str(model), str(model.parent / "extensions")],
        capture_output=True,
        text=True,
        check=True,
    )
    return output.stdout.strip()


def test_an_earlier_model_file_is_kept(tmp_path):
    write_options(tmp_path, COMPOSITION + "seed: 0\n")
    train(tmp_path, "architecture.training.num_epochs=1")
    first = runs(tmp_path)[-1]
    result = train(tmp_path, "architecture.training.num_epochs=1", "seed=3")
    assert (tmp_path / "model.1.pt").read_bytes() == (first / "model.pt").read_bytes()
    assert (tmp_path / "model.pt").read_bytes() == (runs(tmp_path)[-1] / "model.pt").read_bytes()
    assert "previous model: model.1.pt (it was at model.pt)" in result.stdout


# -- Ctrl-C -------------------------------------------------------------------------------
SLOW = COMPOSITION.replace("name: composition", "name: failing") + "seed: 0\n"


def start_slow_run(folder: Path, seconds_per_step: float) -> subprocess.Popen:
    """A run whose every forward call takes ``seconds_per_step`` (the test architecture)."""
    write_options(folder, SLOW)
    env = {
        **os.environ,
        "PYTHONPATH": str(PLUGINS),
        "MTT_TEST_FAIL_RANK": "none",
        "MTT_TEST_SECONDS_PER_CALL": str(seconds_per_step),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "mtt", "train", "options.yaml", "architecture.training.num_epochs=100"],
        cwd=folder,
        stdout=open(folder / "stdout.txt", "w"),
        stderr=open(folder / "stderr.txt", "w"),
        env=env,
    )


def wait_for(condition, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"mtt ended first, with status {process.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_ctrl_c_finishes_the_step_and_writes_a_checkpoint(tmp_path):
    process = start_slow_run(tmp_path, 0.05)
    wait_for(lambda: any("epoch 1/100" in log.read_text() for log in tmp_path.glob("outputs/*/*/train.log")), process)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 130
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Ctrl-C again stops at once" in stderr
    assert "mtt: training stopped on SIGINT" in stderr and "--restart auto" in stderr
    (checkpoint,) = tmp_path.glob("outputs/*/*/checkpoints/epoch_*.ckpt")
    assert str(checkpoint.relative_to(tmp_path)) in stderr

    epoch = int(checkpoint.stem.split("_")[1])  # epoch_<E>.ckpt or epoch_<E>_step_<S>.ckpt: E epochs done
    one_more = f"architecture.training.num_epochs={epoch + 1}"
    result = run_mtt(
        "train", "options.yaml", "--restart", "auto", one_more,
        cwd=tmp_path, env={"PYTHONPATH": str(PLUGINS), "MTT_TEST_FAIL_RANK": "none"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"from {checkpoint.relative_to(tmp_path)}" in result.stdout
    assert logged_test_errors(tmp_path).startswith("test set")


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    process = start_slow_run(tmp_path, 3.0)  # a step lasts 3 s: the second Ctrl-C comes within it
    wait_for(lambda: "RMSE:" in (tmp_path / "stdout.txt").read_text(), process)
    process.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again stops at once" in (tmp_path / "stderr.txt").read_text(), process)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 130
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "mtt: interrupted: stopped at once by a second Ctrl-C; no checkpoint was written" in stderr
    assert not list(tmp_path.glob("outputs/*/*/checkpoints/*.ckpt"))
