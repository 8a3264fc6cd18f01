"""How the device check runs things: each step within its share of the time budget, its
failures recorded; each command in its own process group, killed at its time limit; and
``mtt train`` runs, read back into figures (speed, fixed cost, test errors).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from harness import (
    EMT,
    EMT_TARGETS,
    ETHANOL_TARGETS,
    ROOT,
    epoch_times,
    free_port,
    metrics,
    mtt_train,
    peak_memory_mb,
    run_folder,
    seconds_per_epoch,
    test_errors,
    test_line,
)
from report import Report

PYTHON = sys.executable
CARRIED_ETHANOL = ROOT / ".whl" / "data" / "ethanol_reduced_100.xyz"

OPTIONS = """\
seed: {seed}
architecture:
  name: {architecture}
  training: {{num_epochs: {epochs}, batch_size: {batch}}}
training_set:
  systems: {data}
  targets:
    energy: {targets}
validation_set: 0.1
test_set: 0.1
"""


@dataclass
class Dataset:
    name: str
    path: Path
    targets: str  # the energy target block, as a YAML flow mapping


EMT_METALS = Dataset("EMT metals", EMT, EMT_TARGETS)


class Skipped(Exception):
    """A step that does not apply here (no GPU, no such architecture, no data)."""


class StepFailed(Exception):
    pass


@dataclass
class Completed:
    returncode: int | None  # None when killed at its time limit
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def parse_metrics(line: str) -> dict[str, float]:
    """``test set (10 structures): energy per atom rmse 27.62 meV/atom, ...`` as
    ``{"energy per atom rmse [meV/atom]": 27.62, ...}``."""
    return {f"{name} [{unit}]" if unit else name: value for name, (value, unit) in test_errors(line).items()}


def relative_differences(first: dict[str, float], second: dict[str, float]) -> dict[str, float]:
    return {key: abs(first[key] - second[key]) / max(abs(second[key]), 1e-30) for key in first if key in second}


class Check(Report):
    """One run of the device check: its options, time budget and scratch folder, what its
    steps leave for the later ones, and how it runs commands and ``mtt train``."""

    def __init__(self, args: argparse.Namespace):
        self.cuda = not args.cpu_only
        mode = "cpu-only dry run" if args.cpu_only else ("GPU path, CPU pretending" if args.pretend_gpu else "GPU")
        super().__init__(Path(args.out).resolve(), mode, dict(vars(args)))
        self.args = args
        self.deadline = self.start + args.budget
        self.step_deadline = self.deadline
        # never under --out: only a few files may come back from the GPU machine's $OUT
        self.work = Path(args.work).resolve() if args.work else ROOT / "outputs" / "device_check-work"
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        # what the "cuda" runs really use: the GPU, or the CPU with --pretend-gpu (a test of
        # this script's GPU path on a machine without one)
        self.gpu, self.gpu_backend = ("cpu", "gloo") if args.pretend_gpu else ("cuda", "nccl")
        self.current = ""  # the running step, as its rows name it
        # what the steps leave for the later ones
        self.architectures: list[str] = []  # the environment's
        self.reference: tuple[Dataset, dict] | None = None  # SOAP-BPNN's dataset and runs, by label

    def ethanol(self) -> Dataset | None:
        path = Path(self.args.ethanol) if self.args.ethanol else CARRIED_ETHANOL
        return Dataset("ethanol", path.resolve(), ETHANOL_TARGETS) if path.is_file() else None

    # -- steps ---------------------------------------------------------------------------
    def step(self, name: str, label: str, budget: float, function) -> None:
        """Run ``function(self, record)`` as the step ``name``, whose rows say ``label``."""
        left = self.deadline - time.monotonic()
        record: dict = {}
        self.results["steps"][name] = record
        if left < 15:
            record.update(status="skipped", reason=f"out of time ({left:.0f} s of the budget left)", seconds=0)
            self.say(f"{name}: skipped, out of time")
            self.write()
            return
        self.step_deadline = time.monotonic() + min(budget, left)
        self.current = label
        started = time.monotonic()
        self.say(f"{name}: starting (at most {min(budget, left):.0f} s)")
        try:
            function(self, record)
            record["status"] = "failed" if record.get("failures") else "ok"
            if record.get("failures"):
                record["reason"] = "; ".join(record["failures"])
        except Skipped as why:
            record.update(status="skipped", reason=str(why))
            self.row(self.current, "skipped", str(why))
        except Exception as error:  # one step's failure must not stop the others
            record.update(status="failed", reason=f"{type(error).__name__}: {error}")
            self.note(traceback.format_exc())
            self.row(self.current, "failed", f"{type(error).__name__}: {error}"[:300], "FAILED")
        record["seconds"] = round(time.monotonic() - started, 1)
        self.step_deadline = self.deadline
        self.say(
            f"{name}: {record['status']} in {record['seconds']:.0f} s"
            + (f" ({record['reason']})" if record.get("reason") else "")
        )
        self.write()

    def attempt(self, record: dict, what: str, function, *args, **kwargs):
        """``function(*args, **kwargs)``, one part of a step; its failure is recorded and the
        step goes on. The arguments are given here, not closed over, so that a call in a loop
        gets that iteration's values."""
        try:
            return function(*args, **kwargs)
        except Exception as error:
            record.setdefault("failures", []).append(f"{what}: {error}")
            self.row(self.current, what, f"{error}"[:300], "FAILED")
            self.note(traceback.format_exc())
            self.say(f"  {what} FAILED: {error}")
            return None

    # -- commands ------------------------------------------------------------------------
    def remaining(self) -> float:
        return min(self.deadline, self.step_deadline) - time.monotonic()

    def run(self, command: list[str], cwd: Path, timeout: float | None = None, env: dict | None = None) -> Completed:
        """Run ``command`` in its own process group, killed (all of it) at its time limit."""
        limit = self.remaining() if timeout is None else min(timeout, self.remaining())
        if limit < 5:
            raise StepFailed("out of time before: " + " ".join(command[-6:]))
        environment = {**os.environ, **(env or {})}
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
        cwd.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(cwd / "stdout.txt", "w") as out, open(cwd / "stderr.txt", "w") as err:
            process = subprocess.Popen(
                command, cwd=cwd, stdout=out, stderr=err, env=environment, start_new_session=True, text=True
            )
            try:
                returncode = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                returncode = None
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(process.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        process.wait(timeout=5)
                        break
                    except subprocess.TimeoutExpired:
                        continue
        done = Completed(
            returncode, (cwd / "stdout.txt").read_text(), (cwd / "stderr.txt").read_text(), time.monotonic() - started
        )
        if done.timed_out or done.returncode:
            self.note(
                f"--- {' '.join(command)} (in {cwd}) -> "
                f"{'killed after ' + format(limit, '.0f') + ' s' if done.timed_out else done.returncode}"
            )
            self.note("stdout:\n" + tail(done.stdout, 40))
            self.note("stderr:\n" + tail(done.stderr, 60))
        return done

    def run_background(self, command: list[str], cwd: Path) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(
            command, cwd=cwd, stdout=open(cwd / "stdout.txt", "w"), stderr=open(cwd / "stderr.txt", "w")
        )

    # -- mtt train -----------------------------------------------------------------------
    def write_options(
        self, folder: Path, dataset: Dataset, *, architecture: str = "soap_bpnn", epochs: int, batch: int = 16
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "options.yaml").write_text(
            OPTIONS.format(
                seed=self.args.seed,
                architecture=architecture,
                epochs=epochs,
                batch=batch,
                data=dataset.path,
                targets=dataset.targets,
            )
        )

    def train(
        self,
        folder: Path,
        dataset: Dataset,
        overrides: list[str],
        *,
        architecture: str = "soap_bpnn",
        epochs: int,
        batch: int = 16,
        ranks: int | None = None,
        env: dict | None = None,
        timeout: float | None = None,
    ) -> dict:
        """One ``mtt train`` (under torchrun when ``ranks`` is given); its figures."""
        self.write_options(folder, dataset, architecture=architecture, epochs=epochs, batch=batch)
        port = None if ranks is None else free_port()
        command = mtt_train("options.yaml", overrides, ranks=ranks, port=port, python=PYTHON)
        done = self.run(command, folder, timeout, env)
        if done.timed_out:
            raise StepFailed(f"mtt train killed at its time limit after {done.seconds:.0f} s")
        if done.returncode != 0:
            message = [line for line in done.stderr.splitlines() if line.startswith("mtt")]
            raise StepFailed(
                f"mtt train exited {done.returncode}: " + (message[0] if message else tail(done.stderr, 3))
            )
        sizes = re.search(r"(\d+) training, (\d+) validation, (\d+) test structures", done.stdout)
        described = re.search(r"^distributed: (.*)$", done.stdout, re.M)
        run = run_folder(folder)
        test = test_line(run)
        rows = metrics(run)
        times = epoch_times(run)
        per_epoch = seconds_per_epoch(run)
        n_train, n_validation = int(sizes.group(1)), int(sizes.group(2))
        # the loss is left out: its set average weighs each batch by its structures, so it
        # depends on how a set is cut into batches and ranks, where the errors do not
        final_validation = {k: v for k, v in rows[-1].items() if k.startswith("validation_") and "loss" not in k}
        return {
            "folder": str(run),
            "wall_s": round(done.seconds, 2),
            "epoch_times_s": times,
            "seconds_per_epoch": per_epoch,
            "structures_per_s": (n_train + n_validation) / per_epoch,
            "fixed_cost_s": round(done.seconds - sum(times), 2),
            "structures": {"train": n_train, "validation": n_validation, "test": int(sizes.group(3))},
            "test_line": test,
            "test": parse_metrics(test),
            "final_validation": final_validation,
            "distributed": described.group(1) if described else None,
            "peak_memory_mb": peak_memory_mb(run),
        }
