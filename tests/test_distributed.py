"""Distributed training for real: the launcher variables, torchrun, and a SLURM cluster.

The SLURM tests start the single-node cluster of ../shared/slurm (idempotent); CI stops it
when it ends. Every launch is wrapped in an outer timeout: a hang is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EMT_DATA, ROOT, SHARED_DATA, write_options

from mtt.distributed import Launch, choose_port, detect_launch, expand_nodelist, parse_gpus_per_node, share

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


# -- real launches ---------------------------------------------------------------------
OPTIONS = f"""
seed: 3
architecture:
  name: soap_bpnn
  model:
    soap: {{max_radial: 3, max_angular: 2}}
  training: {{batch_size: 8, num_epochs: 3, checkpoint_interval: 1}}
training_set:
  systems: {EMT_DATA}
  targets:
    energy: {{key: energy, unit: eV, forces: on, stress: on}}
validation_set: 0.1
test_set: 0.1
"""


def printed_test_metrics(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("test set"))


def single_process_reference(tmp_path: Path, *overrides: str) -> str:
    """The test-set line of a one-process run with the same global batch (16)."""
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
    return printed_test_metrics(result.stdout)


def test_torchrun_two_processes_match_one(tmp_path):
    options = write_options(tmp_path, OPTIONS)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "mtt",
            "train",
            str(options),
            "distributed=true",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "2 ranks on 1 node(s), launched by torchrun, gloo backend" in result.stdout
    # identical up to the last printed digit: the ranks split each global batch exactly
    assert printed_test_metrics(result.stdout) == single_process_reference(tmp_path)


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
    assert printed_test_metrics(result.stdout) == single_process_reference(tmp_path)
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


@pytest.mark.slurm
def test_port_in_use_ends_every_rank(slurm, tmp_path):
    options = write_options(tmp_path, OPTIONS)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = srun(
            tmp_path,
            str(options),
            "distributed=true",
            f"distributed.port={port}",
            "distributed.timeout=10",
            timeout=120,
        )
        elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert "distributed.port=" in result.stderr
    assert "rank 1 could not complete the rendezvous" in result.stderr
    assert elapsed < 60


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
    while "epoch 1/15" not in (tmp_path / "first.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    first.send_signal(signal.SIGUSR1)  # srun passes it on to every task
    assert first.wait(timeout=300) == 75
    output = (tmp_path / "first.log").read_text()
    assert "checkpoint written to" in output
    assert "--restart auto" in output

    second = srun(tmp_path, str(options), "distributed=true", epochs, "--restart", "auto")
    assert second.returncode == 0, second.stderr
    assert "continuing after epoch" in second.stdout
    assert printed_test_metrics(second.stdout) == reference


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
    assert "final model written to model.pt" in output
    assert (tmp_path / "model.pt").is_file()
