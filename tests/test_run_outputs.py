"""What a run shows and writes, through the CLI: the table on an 80-column terminal, the
summary, the learning curve, TensorBoard and W&B logs, early stopping and the plateau
schedule (and their restarts)."""

from __future__ import annotations

import csv
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_SOAP, emt_options, run_mtt, write_options

#: energy, forces, stress and a second per-structure target: four quantities
FOUR_TERMS = emt_options(
    SMALL_SOAP,
    "{batch_size: 8, num_epochs: 3, checkpoint_interval: 1}",
    "energy: {key: energy, unit: eV, forces: on, stress: on}\ncopy: {key: energy, unit: eV}",
    seed=7,
)

COMPOSITION = emt_options("name: composition", "{num_epochs: 10, batch_size: 10}", seed=0, validation=0.2)


def metrics(folder: Path) -> list[dict[str, str]]:
    """The rows of the newest run's metrics.csv."""
    with open(sorted(folder.glob("outputs/*/*/metrics.csv"))[-1]) as file:
        return list(csv.DictReader(file))


def on_a_terminal(folder: Path, *args: str, columns: int = 80) -> tuple[int, str]:
    """Run `mtt` with a pseudo-terminal of ``columns`` columns as its output; returns its
    status and what the terminal shows at the end (lines rewritten in place resolved)."""
    import fcntl
    import struct
    import termios

    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "24", "OMP_NUM_THREADS": "2"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mtt", *args], cwd=folder, stdin=follower, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    raw = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes with the process
            break
        if not chunk:
            break
        raw += chunk
    os.close(leader)
    status = process.wait(timeout=600)
    text = raw.decode(errors="replace").replace("\r\n", "\n")
    return status, text


def shown(text: str) -> list[str]:
    """The lines left on screen: what follows the last carriage return of each."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def test_the_terminal_shows_a_table_of_80_columns_and_a_summary(tmp_path):
    write_options(tmp_path, FOUR_TERMS)
    status, text = on_a_terminal(tmp_path, "train", "options.yaml")
    assert status == 0, text
    lines = shown(text)
    assert all(len(line) <= 80 for line in lines), "\n".join(line for line in lines if len(line) > 80)
    assert "steps" in text, "a step bar on a terminal"
    assert not any("steps" in line for line in lines), "the bar is cleared"
    header = next(line for line in lines if line.lstrip().startswith("epoch"))
    # four quantities on the training and validation sets do not fit: the validation ones stay
    assert header.split()[1:] == ["valid", "E", "valid", "F", "valid", "S", "valid", "cop", "ETA"]
    rows = [line for line in lines if re.match(r"\s+\d/3 ", line)]
    assert [row.split()[0] for row in rows] == ["1/3", "2/3", "3/3"]
    validation = metrics(tmp_path)
    shown_forces = [float(row.split()[2]) for row in rows]
    assert shown_forces == pytest.approx([float(r["validation_forces_rmse [meV/A]"]) for r in validation], rel=1e-3)
    summary = lines[lines.index("Summary") :]
    assert re.match(r"  best model: epoch \d of 3", summary[1])
    assert re.search(r"forces RMSE \[meV/A\] +[\d.]+ +[\d.]+$", "\n".join(summary), re.M)
    for name in ("run folder:", "model:", "checkpoint:", "learning curve:"):
        assert any(line.strip().startswith(name) for line in summary), name


def test_a_pipe_gets_the_same_table_and_train_log_every_error(tmp_path):
    write_options(tmp_path, FOUR_TERMS.replace("    copy: {key: energy, unit: eV}\n", ""))
    result = run_mtt("train", "options.yaml", "architecture.training.num_epochs=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("epoch"))
    assert header.split()[1:] == "train E train F train S valid E valid F valid S ETA".split()
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    log = next(tmp_path.glob("outputs/*/*/train.log")).read_text()
    assert re.search(r"epoch 2/2: train .*stress mae [\d.]+ meV/A\^3, loss [\d.]+ \| validation .*learning rate", log)
    assert "test set (10 structures): energy per atom rmse" in log


def test_learning_curve_tensorboard_and_wandb(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_options(tmp_path, FOUR_TERMS.replace("    copy: {key: energy, unit: eV}\n", ""))
    result = run_mtt("train", "options.yaml", "logger=[tensorboard,wandb]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (folder,) = tmp_path.glob("outputs/*/*")
    curve = folder / "learning_curve.png"
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(rf"learning curve: +{re.escape(str(curve.relative_to(tmp_path)))}", result.stdout)

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    rows = metrics(tmp_path)
    for tag in ("validation/forces_rmse [meV/A]", "train/loss", "validation/loss"):
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        column = tag.replace("/", "_", 1)
        assert logged == [(int(r["epoch"]), pytest.approx(float(r[column]), rel=1e-6)) for r in rows], tag
    assert [e.value for e in events.Scalars("learning_rate")] == pytest.approx(
        [float(r["learning_rate"]) for r in rows]
    )

    (run,) = (folder / "wandb").glob("offline-run-*/run-*.wandb")
    recorded = run.read_bytes()
    for key in (b"validation/forces_rmse [meV/A]", b"train/loss", b"learning_rate"):
        assert key in recorded, key
    assert f"wandb sync {run.parent.relative_to(tmp_path)}" in result.stdout


def test_a_missing_logger_package_is_named_before_anything_is_written(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "wandb.py").write_text("raise ImportError('No module named wandb')\n")
    write_options(tmp_path, COMPOSITION)
    result = run_mtt("train", "options.yaml", "logger=wandb", cwd=tmp_path, env={"PYTHONPATH": str(shim)})
    assert result.returncode == 2
    assert "mtt: environment problem: logger: wandb needs the wandb package" in result.stderr
    assert "pip install 'mtt[wandb]'" in result.stderr
    assert not (tmp_path / "outputs").exists()


def test_early_stopping_and_its_restart(tmp_path):
    """The composition model has no weights: its validation figure never improves after
    the first epoch, so a patience of 2 stops after epoch 3, whatever the machine."""
    write_options(tmp_path, COMPOSITION)
    first = run_mtt("train", "options.yaml", "architecture.training.early_stopping_patience=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "early stopping after epoch 3: no better validation rmse prod for 2 epochs (best: epoch 1)" in first.stdout
    assert [row["epoch"] for row in metrics(tmp_path)] == ["1", "2", "3"]

    again = run_mtt(
        "train", "options.yaml", "--restart", "auto", "architecture.training.early_stopping_patience=2", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert "already complete (stopped early at epoch 3" in again.stdout
    longer = run_mtt(
        "train", "options.yaml", "--restart", "auto", "architecture.training.early_stopping_patience=4", cwd=tmp_path
    )
    assert longer.returncode == 0, longer.stderr
    assert "continuing after epoch 3" in longer.stdout
    assert "early stopping after epoch 5" in longer.stdout
    assert [row["epoch"] for row in metrics(tmp_path)] == ["1", "2", "3", "4", "5"]


PLATEAU = FOUR_TERMS.replace("    copy: {key: energy, unit: eV}\n", "").replace(
    "training: {batch_size: 8, num_epochs: 3, checkpoint_interval: 1}",
    "training: {batch_size: 8, num_epochs: 8, checkpoint_interval: 1, learning_rate: 0.05, "
    "warmup_fraction: 0.0, scheduler_patience: 1, scheduler_factor: 0.5}",
)


def expected_rates(rows: list[dict[str, str]], peak: float, patience: int, factor: float) -> list[float]:
    """metatrain's (and torch's) reduce-on-plateau rule, applied to the logged validation losses."""
    rates, best, bad, scale = [], math.inf, 0, 1.0
    for row in rows:
        rates.append(peak * scale)  # the rate of the epoch's steps
        loss = float(row["validation_loss"])
        if loss < best * (1 - 1e-4):
            best, bad = loss, 0
        else:
            bad += 1
            if bad > patience:
                scale, bad = scale * factor, 0
    return rates


def test_the_plateau_schedule_and_its_restart(tmp_path):
    straight = tmp_path / "straight"
    straight.mkdir()
    write_options(straight, PLATEAU)
    result = run_mtt("train", "options.yaml", cwd=straight)
    assert result.returncode == 0, result.stderr
    rows = metrics(straight)
    logged = [float(row["learning_rate"]) for row in rows]  # the rate of each epoch's steps
    assert logged == pytest.approx(expected_rates(rows, 0.05, 1, 0.5))
    assert min(logged) < 0.05, "the schedule lowered the rate at least once in this run"

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    write_options(resumed, PLATEAU)
    checkpoint = next(straight.glob("outputs/*/*/checkpoints/epoch_4.ckpt"))
    result = run_mtt("train", "options.yaml", "--restart", str(checkpoint), cwd=resumed)
    assert result.returncode == 0, result.stderr
    again = metrics(resumed)
    for mine, reference in zip(again, rows):
        assert {k: v for k, v in mine.items() if k != "time [s]"} == {
            k: v for k, v in reference.items() if k != "time [s]"
        }
