"""Distributed training for real: the launcher variables, torchrun, and a SLURM cluster.

The SLURM tests start the single-node cluster of ../shared/slurm (idempotent); CI stops it
when it ends. Every launch is wrapped in an outer timeout: a hang is a failure.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SHARED_DATA, SMALL_SOAP, emt_options, logged_test_errors, torchrun_train, write_options

import mtt.distributed
from mtt.distributed import (
    Launch,
    choose_port,
    detect_launch,
    expand_nodelist,
    parse_gpus_per_node,
    share,
    threads_per_rank,
)

PLUGINS = ROOT / "tests" / "plugins"
SLURM_SCRIPTS = SHARED_DATA.parent / "slurm"


# -- the launcher's variables ------------------------------------------------------------
def test_slurm_variables():
    launch = detect_launch(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_TASKS_PER_NODE": "4(x2)",
            "SLURM_GPUS_PER_NODE": "a100:4",
        }
    )
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == ("slurm", 5, 8, 1)
    assert (launch.num_nodes, launch.local_world_size, launch.master_addr) == (2, 4, "gpu07")
    assert launch.gpus_per_node == 4


def test_slurm_defaults_to_one_node():
    launch = detect_launch({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "vm"})
    assert (launch.num_nodes, launch.local_world_size, launch.master_addr) == (1, 2, "vm")


def test_torchrun_variables_win_inside_a_slurm_job():
    launch = detect_launch(
        {
            "SLURM_JOB_ID": "9",
            "SLURM_PROCID": "0",
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29400",
        }
    )
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == ("torchrun", 3, 4, 1)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.1", 29400)


def test_no_launcher():
    assert detect_launch({}).launcher == "none"


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[9-10],b", ["a9", "a10", "b"]),
        ("x[001-002]-ib", ["x001-ib", "x002-ib"]),
    ],
)
def test_nodelist_expansion(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("value, gpus", [("2", 2), ("a100:2", 2), ("gpu:h100:4(IDX:0-3)", 4), (None, None), ("", None)])
def test_gpus_per_node(value, gpus):
    assert parse_gpus_per_node(value) == gpus


def test_port_choice():
    job = Launch(launcher="slurm", job_id="123456")
    other = Launch(launcher="slurm", job_id="123457")
    assert choose_port(None, job) != choose_port(None, other)
    assert 1024 < choose_port(None, job) < 65536
    assert choose_port(31000, job) == 31000
    assert choose_port(None, Launch(launcher="torchrun", master_port=29400)) == 29400


def test_share_splits_contiguously():
    items = list(range(10))
    parts = [share(items, rank, 3) for rank in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert share([1], 1, 2) == []


@pytest.mark.parametrize(
    "launcher_env, env, expected",
    [
        ({}, {"OMP_NUM_THREADS": "1"}, 4),  # torchrun's own default: 8 cores shared by 2 ranks
        ({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "1"}, 1),  # the user's 1, given to torchrun
        ({}, {"OMP_NUM_THREADS": "3"}, 3),  # the user's
        ({}, {}, 4),
        (None, {"OMP_NUM_THREADS": "1"}, 4),  # no /proc: torchrun's 1 taken for its default
    ],
    ids=["torchrun-default", "user-one", "user-three", "unset", "no-proc"],
)
def test_threads_per_torchrun_rank(monkeypatch, launcher_env, env, expected):
    monkeypatch.setattr(mtt.distributed.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(mtt.distributed, "_launcher_environment", lambda: launcher_env)
    launch = Launch(launcher="torchrun", world_size=2, local_world_size=2)
    assert threads_per_rank(launch, env) == expected


def test_threads_per_slurm_task(monkeypatch):
    monkeypatch.setattr(mtt.distributed.os, "sched_getaffinity", lambda pid: set(range(8)))
    launch = Launch(launcher="slurm", world_size=4, local_world_size=4)
    assert threads_per_rank(launch, {}) == 2
    assert threads_per_rank(launch, {"OMP_NUM_THREADS": "1"}) == 1  # srun sets none itself
    assert threads_per_rank(launch, {"SLURM_CPUS_PER_TASK": "8"}) == 8  # the task's own cores
    assert threads_per_rank(Launch(launcher="none"), {}) is None


def expected_threads(environment: dict) -> int:
    """Threads per rank of 2 ranks on this machine: the user's OMP_NUM_THREADS, else half the cores."""
    if environment.get("OMP_NUM_THREADS"):
        return int(environment["OMP_NUM_THREADS"])
    return max(1, len(os.sched_getaffinity(0)) // 2)


# -- real launches ---------------------------------------------------------------------
OPTIONS = emt_options(
    SMALL_SOAP,
    "{batch_size: 8, num_epochs: 3, checkpoint_interval: 1}",
    "energy: {key: energy, unit: eV, forces: on, stress: on}",
    seed=3,
)


def epoch_metrics(folder: Path) -> list[dict[str, float]]:
    """Every figure of metrics.csv (losses, RMSEs, MAEs, learning rate) but the wall time."""
    (path,) = folder.glob("outputs/*/*/metrics.csv")
    with open(path) as file:
        return [{k: float(v) for k, v in row.items() if k != "time [s]"} for row in csv.DictReader(file)]


def assert_same_epochs(distributed: list[dict[str, float]], single: list[dict[str, float]]) -> None:
    """The same columns and figures, the losses included, to rounding in the last digits."""
    assert [list(row) for row in distributed] == [list(row) for row in single]
    assert any("loss" in key for key in single[0])
    for mine, reference in zip(distributed, single):
        assert mine == pytest.approx(reference, rel=1e-6)


def single_process_reference(tmp_path: Path, *overrides: str) -> str:
    """The test-set line of a one-process run with the same global batch (16); its
    metrics.csv stays in tmp_path/single."""
    folder = tmp_path / "single"
    folder.mkdir()
    options = write_options(folder, OPTIONS)
    result = subprocess.run(
        [sys.executable, "-m", "mtt", "train", str(options), "architecture.training.batch_size=16", *overrides],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return logged_test_errors(folder)


def test_torchrun_two_processes_match_one(tmp_path):
    options = write_options(tmp_path, OPTIONS)
    result = torchrun_train(options, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 ranks on 1 node(s), launched by torchrun, gloo backend" in result.stdout
    # torchrun's OMP_NUM_THREADS=1 is its default, not the user's: the ranks share the cores
    threads = expected_threads(os.environ)
    assert f"uses cpu with {threads} thread{'s' if threads != 1 else ''}\n" in result.stdout
    # identical up to the last printed digit: the ranks split each global batch exactly
    assert logged_test_errors(tmp_path) == single_process_reference(tmp_path)
    # and so is every epoch's row, the training and validation losses included
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(tmp_path / "single"))


def test_torchrun_matches_one_process_when_a_global_batch_lacks_an_element(tmp_path):
    """With 8 structures a step, some steps have no Au atom: in one process its network
    gets no gradient and Adam leaves it alone, and so must the ranks (a zero gradient would
    move it by the optimiser's momentum)."""
    text = emt_options(SMALL_SOAP, "{batch_size: 4, num_epochs: 2}", seed=4)
    options = write_options(tmp_path, text)
    result = torchrun_train(options, tmp_path)
    assert result.returncode == 0, result.stderr
    single = tmp_path / "single"
    single.mkdir()
    options = str(write_options(single, text))
    command = [sys.executable, "-m", "mtt", "train", options, "architecture.training.batch_size=8"]
    reference = subprocess.run(command, cwd=single, capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(single))


def one_process(tmp_path: Path, text: str, prepare=None) -> Path:
    """The folder of a one-process run of the options ``text`` with batches of 16 (two
    ranks' of 8), its data made by ``prepare(folder)`` when given."""
    single = tmp_path / "single"
    single.mkdir()
    if prepare is not None:
        prepare(single)
    command = [
        sys.executable,
        "-m",
        "mtt",
        "train",
        str(write_options(single, text)),
        "architecture.training.batch_size=16",
    ]
    reference = subprocess.run(command, cwd=single, capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr
    return single


def test_torchrun_matches_one_process_with_per_atom_targets(tmp_path):
    """A per-atom target's loss is a mean over the atoms of the whole batch: each rank weighs
    its part by its atoms, as for forces."""
    text = emt_options(
        SMALL_SOAP,
        "{batch_size: 8, num_epochs: 2}",
        "energy: {key: energy, unit: eV, forces: off, stress: off}\n"
        "direct: {key: forces, sample_kind: atom, num_subtargets: 3}",
        seed=4,
    )
    options = write_options(tmp_path, text)
    result = torchrun_train(options, tmp_path)
    assert result.returncode == 0, result.stderr
    single = one_process(tmp_path, text)
    assert any("direct" in key for key in epoch_metrics(tmp_path)[0])
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(single))


def test_torchrun_matches_one_process_with_datasets_of_different_targets(tmp_path):
    """With variants a term's share of a batch counts only the structures that have it."""
    from test_targets import write_variants

    text = write_variants(tmp_path)
    result = torchrun_train(write_options(tmp_path, text), tmp_path)
    assert result.returncode == 0, result.stderr
    single = one_process(tmp_path, text, write_variants)
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(single))


@pytest.fixture(scope="session")
def slurm():
    """A running single-node SLURM cluster from ../shared/slurm."""
    if not SLURM_SCRIPTS.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide the SLURM scripts at {SLURM_SCRIPTS}")
        pytest.skip(f"no local SLURM scripts at {SLURM_SCRIPTS}")
    running = subprocess.run(["sinfo"], capture_output=True).returncode == 0 if shutil.which("sinfo") else False
    started = subprocess.run(
        ["bash", str(SLURM_SCRIPTS / "start-local-slurm.sh")], capture_output=True, text=True, timeout=300
    )
    assert started.returncode == 0, started.stderr
    yield
    if not running:
        subprocess.run(["bash", str(SLURM_SCRIPTS / "stop-local-slurm.sh")], capture_output=True, timeout=120)


def srun(tmp_path: Path, *args: str, tasks: int = 2, env: dict | None = None, timeout: float = 600):
    command = ["srun", "-n", str(tasks), sys.executable, "-m", "mtt", "train", *args]
    return subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.mark.slurm
def test_srun_two_tasks_match_one_process(slurm, tmp_path):
    options = write_options(tmp_path, OPTIONS)
    result = srun(tmp_path, str(options), "distributed=true")
    assert result.returncode == 0, result.stderr
    assert "2 ranks on 1 node(s), launched by slurm, gloo backend" in result.stdout
    assert logged_test_errors(tmp_path) == single_process_reference(tmp_path)
    assert_same_epochs(epoch_metrics(tmp_path), epoch_metrics(tmp_path / "single"))
    folders = list(tmp_path.glob("outputs/*/*"))
    assert len(folders) == 1, "every rank must write into the one folder rank 0 chose"
    assert (folders[0] / "model.pt").is_file()


@pytest.mark.slurm
def test_srun_without_distributed_is_refused(slurm, tmp_path):
    options = write_options(tmp_path, OPTIONS)
    result = srun(tmp_path, str(options))
    assert result.returncode != 0
    assert "2 copies of mtt were launched by slurm, but distributed training is off" in result.stderr
    assert "distributed=true" in result.stderr
    assert not (tmp_path / "outputs").exists()


def _held_port(kind: str):
    """A port held by a plain program, or by the TCP store of another job (which rank 1 joins)."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def holder():
        if kind == "socket":
            with socket.socket() as sock:
                sock.bind(("0.0.0.0", 0))
                sock.listen()
                yield sock.getsockname()[1]
        else:
            with socket.socket() as probe:
                probe.bind(("0.0.0.0", 0))
                port = probe.getsockname()[1]
            store = torch.distributed.TCPStore("0.0.0.0", port, 2, is_master=True, wait_for_workers=False)
            yield port
            del store

    return holder()


@pytest.mark.slurm
@pytest.mark.parametrize("kind", ["socket", "another-store"])
def test_port_in_use_ends_every_rank(slurm, tmp_path, kind):
    """Rank 0 cannot bind the port and says so; the others stop as soon as it does, not at
    the rendezvous timeout (here longer than the outer timeout: a wait would fail the test)."""
    options = write_options(tmp_path, OPTIONS)
    with _held_port(kind) as port:
        result = srun(
            tmp_path,
            str(options),
            "distributed=true",
            f"distributed.port={port}",
            "distributed.timeout=900",
            timeout=240,
        )
    assert result.returncode != 0
    assert f"mtt: environment problem: port {port}" in result.stderr and "already in use" in result.stderr
    assert "distributed.port=" in result.stderr
    # rank 1 says why it stops, or was ended by the signal before it could listen for it
    assert "rank 1 stops: rank 0 could not host the rendezvous" in result.stderr or "task 1" in result.stderr


@pytest.mark.slurm
def test_a_failing_rank_ends_every_rank(slurm, tmp_path):
    options = write_options(
        tmp_path,
        OPTIONS.replace("name: soap_bpnn", "name: failing").replace(
            "  model:\n    soap: {max_radial: 3, max_angular: 2}\n", ""
        ),
    )
    started = time.monotonic()
    result = srun(
        tmp_path,
        str(options),
        "distributed=true",
        timeout=180,
        env={"PYTHONPATH": str(PLUGINS), "MTT_TEST_FAIL_RANK": "1", "MTT_TEST_FAIL_AFTER": "3"},
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 120
    assert "mtt (rank 1): architecture error" in result.stderr
    assert "The Test Maintainers" in result.stderr
    assert "mtt (rank 0): environment problem: rank 0 stopped because another rank stopped first" in result.stderr
    folder = next(tmp_path.glob("outputs/*/*"))
    assert (folder / "error.rank0.log").is_file() and (folder / "error.rank1.log").is_file()


@pytest.mark.slurm
def test_sigusr1_checkpoints_and_restart_auto_finishes_the_same(slurm, tmp_path):
    # enough epochs that the signal, sent when epoch 1 is logged, lands well before the
    # last one ends (an epoch takes about 0.4 s; a signal during the last epoch rightly
    # lets the run finish, and with 3 epochs that happened in CI)
    epochs = "architecture.training.num_epochs=15"
    reference = single_process_reference(tmp_path, epochs)
    options = write_options(tmp_path, OPTIONS)
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        ["srun", "-n", "2", sys.executable, "-m", "mtt", "train", str(options), "distributed=true", epochs],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(
        "epoch 1/15" in log.read_text() for log in tmp_path.glob("outputs/*/*/train.log")
    ):
        time.sleep(0.5)
    first.send_signal(signal.SIGUSR1)  # srun passes it on to every task
    assert first.wait(timeout=300) == 75
    output = (tmp_path / "first.log").read_text()
    assert "checkpoint written to" in output
    assert "--restart auto" in output

    second = srun(tmp_path, str(options), "distributed=true", epochs, "--restart", "auto")
    assert second.returncode == 0, second.stderr
    assert "continuing after epoch" in second.stdout
    assert logged_test_errors(tmp_path) == reference


@pytest.mark.slurm
def test_example_sbatch_script(slurm, tmp_path):
    write_options(tmp_path, OPTIONS)
    shutil.copy(ROOT / "examples" / "slurm" / "train.sbatch", tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sbatch", "--wait", "train.sbatch"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    output = "".join(p.read_text() for p in tmp_path.glob("mtt-*.out"))
    assert result.returncode == 0, result.stderr + output
    assert "launched by slurm" in output
    assert re.search(r"model: +model\.pt", output)
    assert (tmp_path / "model.pt").is_file()
