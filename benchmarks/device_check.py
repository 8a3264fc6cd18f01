"""The check of mtt on a GPU machine: CUDA training against the CPU, torchrun with NCCL,
MD through metatomic's ASE calculator on CUDA, and CPU scaling over the machine's cores.

    bash benchmarks/device_check.sh [--cpu-only] [--out DIR] [options below]

Run through device_check.sh, which installs the carried wheels and sets PYTHONPATH. Every
step is time-boxed; a step that fails is recorded and the others still run. After each
step, device_check.md (one table) and device_check.json (every figure) are written again
to $OUT, or --out, so that a run cut short still leaves what it measured. --cpu-only runs
every step that a CPU can run (a dry run). docs/src/performance.rst, "On a GPU machine",
says how a session with a GPU runs it.

Data: the ethanol set that benchmarks/device_wheels.sh copies into .whl/data (the
../shared beside a checkout does not travel to the GPU machine), else EMT metals only;
examples/data/emt_metals.xyz for the periodic model; a larger EMT set generated on the
spot (examples/data/generate_emt_dataset.py) for the scaling runs.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_folder import peak_memory_mb, run_folder, seconds_per_epoch  # noqa: E402

PYTHON = sys.executable
EMT = ROOT / "examples" / "data" / "emt_metals.xyz"
GENERATOR = ROOT / "examples" / "data" / "generate_emt_dataset.py"
CARRIED_ETHANOL = ROOT / ".whl" / "data" / "ethanol_reduced_100.xyz"
MESSAGE_PASSING = "equivariant_mp"

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


ETHANOL_TARGETS = "{key: energy, unit: kcal/mol, forces: forces}"
EMT_TARGETS = "{key: energy, unit: eV, forces: on, stress: on}"

PROBE = r"""
import json, os, sys
from importlib import metadata
found = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    found["cores"] = len(os.sched_getaffinity(0))
except AttributeError:
    found["cores"] = os.cpu_count()
packages = {}
for name in ["torch", "numpy", "metatensor-core", "metatensor-operations", "metatensor-torch",
             "metatomic-torch", "metatomic-ase", "featomic", "featomic-torch", "vesin", "wigners",
             "hydra-core", "omegaconf", "antlr4-python3-runtime", "ase", "scipy", "e3nn"]:
    try:
        dist = metadata.distribution(name)
        packages[name] = {"version": dist.version, "where": str(dist.locate_file(""))}
    except metadata.PackageNotFoundError:
        packages[name] = None
found["packages"] = packages
import torch
found["torch"] = torch.__version__
found["torch_threads"] = torch.get_num_threads()
found["cuda_available"] = torch.cuda.is_available()
found["torch_cuda"] = torch.version.cuda
if torch.cuda.is_available():
    found["gpu"] = torch.cuda.get_device_name(0)
    found["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    found["gpu_count"] = torch.cuda.device_count()
    try:
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as error:
        found["nccl"] = f"unknown ({error})"
import mtt, mtt.architectures
found["mtt"] = {"version": mtt.__version__, "where": os.path.dirname(mtt.__file__)}
found["architectures"] = sorted(mtt.architectures.available())
for module in ["metatensor.torch", "metatomic.torch", "featomic", "vesin.metatomic", "metatomic_ase", "hydra", "ase"]:
    __import__(module)
from importlib import resources
conf = resources.files("mtt.config") / "conf"
found["packaged_configs"] = sorted(str(p.name) for p in conf.iterdir() if not p.name.startswith("_") and (p.name.endswith(".yaml") or p.is_dir()))
import tempfile
from mtt.config import load_options
with tempfile.TemporaryDirectory() as folder:
    options = os.path.join(folder, "options.yaml")
    open(options, "w").write("training_set: " + sys.argv[1] + "\n")
    composed = load_options(options, ["distributed=true"])
    found["composed_options"] = sorted(composed.raw)
    found["composed_distributed"] = bool(composed.run.distributed.enabled)
print("PROBE " + json.dumps(found))
"""


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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def parse_metrics(line: str) -> dict[str, float]:
    """``test set (10 structures): energy per atom rmse 27.62 meV/atom, ...`` as a dict."""
    metrics = {}
    for item in line.split(": ", 1)[1].split(", "):
        match = re.fullmatch(r"(.+?) ([-+0-9.eE]+|nan|inf)(?: (\S+))?", item.strip())
        if match:
            name, value, unit = match.groups()
            metrics[f"{name} [{unit}]" if unit else name] = float(value)
    return metrics


def relative_differences(first: dict[str, float], second: dict[str, float]) -> dict[str, float]:
    return {key: abs(first[key] - second[key]) / max(abs(second[key]), 1e-30) for key in first if key in second}


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.start = time.monotonic()
        self.deadline = self.start + args.budget
        self.step_deadline = self.deadline
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        # never under --out: only a few files may come back from the GPU machine's $OUT
        self.work = Path(args.work).resolve() if args.work else ROOT / "outputs" / "device_check-work"
        if self.work.exists():
            import shutil

            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.log = open(self.out / "device_check.log", "w")
        self.cuda = not args.cpu_only
        # what the "cuda" runs really use: the GPU, or the CPU with --pretend-gpu (a test of
        # this script's GPU path on a machine without one)
        self.gpu, self.gpu_backend = ("cpu", "gloo") if args.pretend_gpu else ("cuda", "nccl")
        self.rows: list[tuple[str, str, str, str]] = []
        self.results: dict = {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "mode": "cpu-only dry run"
            if args.cpu_only
            else ("GPU path, CPU pretending" if args.pretend_gpu else "GPU"),
            "options": {k: v for k, v in vars(args).items()},
            "steps": {},
        }
        self.models: dict[str, Path] = {}  # run folders of trained models, for MD

    # -- output ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        line = f"[{self.elapsed():6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def note(self, text: str) -> None:
        """To the log file only (long outputs of failed commands)."""
        self.log.write(text.rstrip() + "\n")
        self.log.flush()

    def row(self, step: str, what: str, value: str, verdict: str = "") -> None:
        self.rows.append((step, what, value, verdict))

    def write(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        (self.out / "device_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "device_check.md").write_text(self.markdown())

    def markdown(self) -> str:
        env = self.results.get("environment", {})
        lines = [
            f"# mtt device check ({self.results['mode']})",
            "",
            f"{self.results['started']}, {self.results['elapsed_s']} s; "
            f"commit {self.results.get('commit', 'unknown')}; "
            f"torch {env.get('torch', '?')}, CUDA {env.get('torch_cuda', '-')}, "
            f"GPU {env.get('gpu', 'none')}, {env.get('cores', '?')} cores.",
            "",
            "| step | measurement | value | check |",
            "| --- | --- | --- | --- |",
        ]
        lines += [f"| {s} | {w} | {v} | {c} |" for s, w, v, c in self.rows]
        lines += ["", "## Steps", ""]
        for name, step in self.results["steps"].items():
            text = f"- {name}: {step.get('status')} in {step.get('seconds', 0):.0f} s"
            if step.get("reason"):
                text += f": {step['reason']}"
            lines.append(text)
        if env.get("packages"):
            lines += ["", "## Versions", ""]
            versions = [f"{n} {p['version']}" for n, p in env["packages"].items() if p]
            lines.append(", ".join(versions) + f"; mtt from {env.get('mtt', {}).get('where', '?')}")
        if self.results.get("nvidia_smi"):
            lines += ["", "## nvidia-smi", "", "```", self.results["nvidia_smi"].rstrip(), "```"]
        return "\n".join(lines) + "\n"

    # -- running things ----------------------------------------------------------------
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

    def step(self, name: str, budget: float, function) -> None:
        left = self.deadline - time.monotonic()
        record: dict = {}
        self.results["steps"][name] = record
        if left < 15:
            record.update(status="skipped", reason=f"out of time ({left:.0f} s of the budget left)", seconds=0)
            self.say(f"{name}: skipped, out of time")
            self.write()
            return
        self.step_deadline = time.monotonic() + min(budget, left)
        self.current = {
            "train": "train SOAP-BPNN",
            "md": "MD",
            "message-passing": f"train {MESSAGE_PASSING}",
            "scaling": "CPU scaling",
        }.get(name, name)
        started = time.monotonic()
        self.say(f"{name}: starting (at most {min(budget, left):.0f} s)")
        try:
            function(record)
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

    def attempt(self, record: dict, what: str, function):
        """One part of a step; its failure is recorded and the step goes on."""
        try:
            return function()
        except Exception as error:
            record.setdefault("failures", []).append(f"{what}: {error}")
            self.row(getattr(self, "current", ""), what, f"{error}"[:300], "FAILED")
            self.note(traceback.format_exc())
            self.say(f"  {what} FAILED: {error}")
            return None

    # -- mtt train -----------------------------------------------------------------------
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
        if ranks is None:
            command = [PYTHON, "-m", "mtt", "train", "options.yaml", *overrides]
        else:
            command = [
                PYTHON,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(ranks),
                f"--master-port={free_port()}",
                "-m",
                "mtt",
                "train",
                "options.yaml",
                "distributed=true",
                *overrides,
            ]
        done = self.run(command, folder, timeout, env)
        if done.timed_out:
            raise StepFailed(f"mtt train killed at its time limit after {done.seconds:.0f} s")
        if done.returncode != 0:
            message = [line for line in done.stderr.splitlines() if line.startswith("mtt")]
            raise StepFailed(
                f"mtt train exited {done.returncode}: " + (message[0] if message else tail(done.stderr, 3))
            )
        test_line = next(line for line in done.stdout.splitlines() if line.startswith("test set"))
        sizes = re.search(r"(\d+) training, (\d+) validation, (\d+) test structures", done.stdout)
        described = re.search(r"^distributed: (.*)$", done.stdout, re.M)
        run = run_folder(folder)
        rows = list(csv.DictReader(open(run / "metrics.csv")))
        per_epoch = seconds_per_epoch(run)
        n_train, n_validation = int(sizes.group(1)), int(sizes.group(2))
        # the loss is left out: its set average weighs each batch by its structures, so it
        # depends on how a set is cut into batches and ranks, where the errors do not
        final_validation = {k: v for k, v in rows[-1].items() if k.startswith("validation_") and "loss" not in k}
        return {
            "folder": str(run),
            "wall_s": round(done.seconds, 2),
            "epoch_times_s": [float(r["time [s]"]) for r in rows],
            "seconds_per_epoch": per_epoch,
            "structures_per_s": (n_train + n_validation) / per_epoch,
            "fixed_cost_s": round(done.seconds - sum(float(r["time [s]"]) for r in rows), 2),
            "structures": {"train": n_train, "validation": n_validation, "test": int(sizes.group(3))},
            "test_line": test_line,
            "test": parse_metrics(test_line),
            "final_validation": final_validation,
            "distributed": described.group(1) if described else None,
            "peak_memory_mb": peak_memory_mb(run),
        }

    # -- the steps -----------------------------------------------------------------------
    def environment(self, record: dict) -> None:
        done = self.run([PYTHON, "-c", PROBE, str(EMT)], self.work / "probe", timeout=120)
        line = next((l for l in done.stdout.splitlines() if l.startswith("PROBE ")), None)
        if line is None:
            raise StepFailed("the probe of the installed packages failed: " + tail(done.stderr, 5))
        found = json.loads(line[len("PROBE ") :])
        self.results["environment"] = found
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except Exception:
            commit = ""
        self.results["commit"] = commit or "unknown"
        try:
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
            self.results["nvidia_smi"] = smi.stdout or smi.stderr
        except (OSError, subprocess.TimeoutExpired) as error:
            self.results["nvidia_smi"] = None if self.args.cpu_only else f"nvidia-smi: {error}"
        for name, package in found["packages"].items():
            self.say(f"  {name}: {package['version'] + ' from ' + package['where'] if package else 'not installed'}")
        self.say(
            f"  mtt {found['mtt']['version']} from {found['mtt']['where']}; architectures {found['architectures']}"
        )
        self.say(
            f"  torch {found['torch']}, CUDA {found['torch_cuda']}, GPU {found.get('gpu', 'none')}, "
            f"NCCL {found.get('nccl', '-')}, {found['cores']} cores"
        )
        if self.results.get("nvidia_smi"):
            print(self.results["nvidia_smi"], flush=True)
        missing = [n for n, p in found["packages"].items() if p is None and n not in ("e3nn", "featomic-torch")]
        self.row(
            "environment",
            "torch, GPU, cores",
            f"torch {found['torch']} (CUDA {found['torch_cuda']}), {found.get('gpu', 'no GPU')}, "
            f"NCCL {found.get('nccl', '-')}, {found['cores']} cores",
            "ok" if not missing else "missing: " + ", ".join(missing),
        )
        composed = found["composed_distributed"] and "architecture" in found["composed_options"]
        self.row(
            "environment",
            "packaged YAML configs, from src/ on PYTHONPATH",
            ", ".join(found["packaged_configs"]) + "; options composed with distributed=true",
            "ok" if composed else "FAILED",
        )
        if self.cuda and not found["cuda_available"] and not self.args.pretend_gpu:
            self.cuda = False
            record.setdefault("failures", []).append("torch sees no GPU: the CUDA parts are not run")
        self.architectures = found["architectures"]

    def ethanol(self) -> Dataset | None:
        path = Path(self.args.ethanol) if self.args.ethanol else CARRIED_ETHANOL
        return Dataset("ethanol", path.resolve(), ETHANOL_TARGETS) if path.is_file() else None

    def compare_devices(self, record: dict, step: str, architecture: str, dataset: Dataset, noise_reference: bool):
        """The same training on CUDA and on the CPU in float32 (and float64 on the CPU: how
        far float32 rounding alone moves the results)."""
        runs = {}
        plan = ([("cuda float32", self.gpu, 32)] if self.cuda else []) + [("cpu float32", "cpu", 32)]
        if noise_reference:
            plan.append(("cpu float64", "cpu", 64))
        epochs = self.args.epochs
        for label, device, precision in plan:
            folder = self.work / step / label.replace(" ", "-")
            figures = self.attempt(
                record,
                f"{dataset.name} {label}",
                lambda: self.train(
                    folder,
                    dataset,
                    [f"device={device}", f"base_precision={precision}"],
                    architecture=architecture,
                    epochs=epochs,
                ),
            )
            if figures is None:
                continue
            runs[label] = figures
            self.say(
                f"  {architecture} {dataset.name} {label}: {figures['structures_per_s']:.1f} structures/s, "
                f"{figures['seconds_per_epoch']:.3f} s/epoch, fixed cost {figures['fixed_cost_s']:.1f} s; "
                f"{figures['test_line']}"
            )
        record[dataset.name] = runs
        what = f"{architecture} {dataset.name}, {epochs} epochs"
        cuda, cpu, cpu64 = runs.get("cuda float32"), runs.get("cpu float32"), runs.get("cpu float64")
        if cuda and cpu:
            self.row(
                step,
                f"{what}: training + validation structures/s, float32",
                f"CUDA {cuda['structures_per_s']:.1f}, CPU {cpu['structures_per_s']:.1f} "
                f"({cuda['structures_per_s'] / cpu['structures_per_s']:.2f}x)",
            )
            self.row(
                step,
                f"{what}: fixed cost of a run (s)",
                f"CUDA {cuda['fixed_cost_s']:.1f}, CPU {cpu['fixed_cost_s']:.1f}",
            )
        elif cpu:
            self.row(step, f"{what}: training + validation structures/s, CPU float32", f"{cpu['structures_per_s']:.1f}")
        noise = None
        if cpu and cpu64:
            noise = max(relative_differences(cpu["test"], cpu64["test"]).values())
            record[f"{dataset.name}_float32_noise"] = noise
            self.row(
                step,
                f"{what}: test errors, CPU float32 against float64 (largest relative difference)",
                f"{fmt(noise)}",
                "the float32 noise",
            )
        if cuda and cpu:
            differences = relative_differences(cuda["test"], cpu["test"])
            worst = max(differences.values())
            tolerance = max(3 * noise, 2e-3) if noise is not None else 2e-2
            agree = worst <= tolerance
            record[f"{dataset.name}_cuda_vs_cpu"] = {
                "relative_differences": differences,
                "tolerance": tolerance,
                "agree": agree,
            }
            self.row(
                step,
                f"{what}: test errors, CUDA against CPU float32 (largest relative difference)",
                f"{fmt(worst)} (tolerance {fmt(tolerance)})",
                "agree" if agree else "DISAGREE",
            )
            if not agree:
                record.setdefault("failures", []).append(f"CUDA and CPU test errors differ by {worst:.3g}")
        for label, figures in runs.items():
            self.row(step, f"{what}: test set, {label}", figures["test_line"].split(": ", 1)[1])
        return runs

    def train_soap(self, record: dict) -> None:
        datasets = [d for d in (self.ethanol(),) if d] or [Dataset("EMT metals", EMT, EMT_TARGETS)]
        if datasets[0].name != "ethanol":
            self.say(
                "  no ethanol data (run benchmarks/device_wheels.sh, which copies it into .whl/data): "
                "training on examples/data/emt_metals.xyz instead"
            )
            self.row("train SOAP-BPNN", "data", "no ethanol data carried: EMT metals instead", "note")
        record["dataset"] = datasets[0].name
        self.reference = (
            datasets[0],
            self.compare_devices(record, "train SOAP-BPNN", "soap_bpnn", datasets[0], not self.args.no_noise_reference),
        )

    def train_message_passing(self, record: dict) -> None:
        if MESSAGE_PASSING not in getattr(self, "architectures", []):
            raise Skipped(
                f"architecture '{MESSAGE_PASSING}' is not in this mtt yet "
                f"(available: {', '.join(getattr(self, 'architectures', []))})"
            )
        dataset = self.ethanol() or Dataset("EMT metals", EMT, EMT_TARGETS)
        self.compare_devices(record, f"train {MESSAGE_PASSING}", MESSAGE_PASSING, dataset, noise_reference=False)

    def torchrun(self, record: dict) -> None:
        label, device, backend = ("cuda", self.gpu, self.gpu_backend) if self.cuda else ("cpu", "cpu", "gloo")
        dataset, runs = getattr(self, "reference", (self.ethanol() or Dataset("EMT metals", EMT, EMT_TARGETS), {}))
        single = runs.get(f"{label} float32")

        def one_rank() -> None:
            figures = self.train(
                self.work / "torchrun" / f"one-rank-{label}",
                dataset,
                [f"device={device}", "base_precision=32"],
                epochs=self.args.epochs,
                ranks=1,
            )
            record["one_rank"] = figures
            described = figures["distributed"] or ""
            ok = f"{backend} backend" in described
            self.row(
                "torchrun",
                f"--nproc-per-node 1, distributed=true, {label}",
                f"{described}; {figures['structures_per_s']:.1f} structures/s",
                "ok" if ok else "FAILED",
            )
            if not ok:
                record.setdefault("failures", []).append(f"not the {backend} backend: {described}")
            if single:
                same = figures["test_line"] == single["test_line"]
                worst = max(relative_differences(figures["test"], single["test"]).values())
                self.row(
                    "torchrun",
                    f"test errors against one process on {label}",
                    "identical" if same else f"largest relative difference {fmt(worst)}",
                    "ok" if same or worst <= 2e-3 else "DIFFERENT",
                )
            self.say(f"  torchrun, 1 rank, {backend}: {described}; {figures['test_line']}")

        self.attempt(record, f"torchrun one rank ({backend})", one_rank)

        cases = [("cpu", "cpu", "gloo")] + ([("cuda", self.gpu, self.gpu_backend)] if self.cuda else [])
        seen = {}
        for case_label, case_device, case_backend in cases:
            result = self.attempt(
                record,
                f"port in use ({case_backend} on {case_label})",
                lambda: self.port_in_use(dataset, case_label, case_device, case_backend),
            )
            if result is None:
                continue
            seen[case_label] = result
            record[f"port_in_use_{case_label}"] = result
            expected = result["mtt_exit"] == 3 and "could not complete the rendezvous" in result["message"]
            self.row(
                "torchrun",
                f"port in use, {case_backend} on {case_label}",
                f"torchrun exit {result['torchrun_exit']}, rank exit {result['mtt_exit']} after "
                f"{result['seconds']:.0f} s: `{result['message'][:160]}`",
                "ok" if expected else "UNEXPECTED",
            )
        if "cpu" in seen and "cuda" in seen:
            same = all(seen["cpu"][key] == seen["cuda"][key] for key in ("message", "mtt_exit", "torchrun_exit"))
            self.row(
                "torchrun",
                f"port in use: {self.gpu_backend} on cuda against gloo on cpu",
                "same message and exits" if same else "different",
                "ok" if same else "DIFFERENT",
            )
            if not same:
                record.setdefault("failures", []).append("the port-in-use case differs between NCCL and gloo")

    def port_in_use(self, dataset: Dataset, label: str, device: str, backend: str) -> dict:
        with socket.socket() as holder:
            holder.bind(("0.0.0.0", 0))
            holder.listen()
            port = holder.getsockname()[1]
            folder = self.work / "torchrun" / f"port-in-use-{label}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "options.yaml").write_text(
                OPTIONS.format(
                    seed=self.args.seed,
                    architecture="soap_bpnn",
                    epochs=1,
                    batch=16,
                    data=dataset.path,
                    targets=dataset.targets,
                )
            )
            done = self.run(
                [
                    PYTHON,
                    "-m",
                    "torch.distributed.run",
                    "--nproc-per-node",
                    "1",
                    f"--master-port={free_port()}",
                    "-m",
                    "mtt",
                    "train",
                    "options.yaml",
                    "distributed=true",
                    f"distributed.port={port}",
                    f"distributed.timeout={self.args.port_timeout}",
                    f"device={device}",
                ],
                folder,
                timeout=self.args.port_timeout + 60,
            )
        if done.timed_out:
            raise StepFailed(
                f"killed at its time limit, {done.seconds:.0f} s after being given a port in use "
                f"(distributed.timeout={self.args.port_timeout})"
            )
        messages = [line for line in done.stderr.splitlines() if line.startswith("mtt")]
        rank_exit = re.search(r"exitcode\s*:\s*(-?\d+)", done.stderr)
        message = (messages[0] if messages else tail(done.stderr, 1)).replace(str(port), "PORT")
        self.say(
            f"  port in use ({backend} on {label}): torchrun exit {done.returncode}, after {done.seconds:.0f} s: {message}"
        )
        return {
            "torchrun_exit": done.returncode,
            "mtt_exit": int(rank_exit.group(1)) if rank_exit else None,
            "message": message,
            "seconds": done.seconds,
        }

    def md(self, record: dict) -> None:
        label, device = ("cuda", self.gpu) if self.cuda else ("cpu", "cpu")
        devices = [f"cuda={self.gpu}", "cpu"] if self.cuda else ["cpu"]
        systems = []
        dataset, runs = getattr(self, "reference", (None, {}))
        ethanol_run = runs.get(f"{label} float32") if dataset and dataset.name == "ethanol" else None
        if ethanol_run:
            systems.append(("ethanol", Path(ethanol_run["folder"]), self.args.md_steps, 10))
        else:
            self.say("  no ethanol model trained in float32 on this device: MD of the metal cell only")
            self.row("MD", "ethanol", "no ethanol model trained on this device", "skipped")
        metal = self.attempt(
            record,
            "metal model for MD",
            lambda: self.train(
                self.work / "md" / "emt-model",
                Dataset("EMT metals", EMT, EMT_TARGETS),
                [f"device={device}", "base_precision=32"],
                epochs=self.args.md_train_epochs,
            ),
        )
        if metal:
            systems.append(("cu1008", Path(metal["folder"]), self.args.md_steps_large, 2))
        for system, run, steps, warmup in systems:
            command = [
                PYTHON,
                str(ROOT / "benchmarks" / "device_md.py"),
                "--model",
                str(run / "model.pt"),
                "--checkpoint",
                str(run / "model.ckpt"),
                "--system",
                system,
                "--devices",
                *devices,
                "--steps",
                str(steps),
                "--seconds",
                str(self.args.md_seconds),
                "--warmup",
                str(warmup),
                "--fd-atoms",
                str(self.args.fd_atoms),
            ]
            if system == "ethanol":
                command += ["--structure", str(dataset.path)]
            result = self.attempt(record, f"MD {system}", lambda: self.md_worker(command, system))
            if result is None:
                continue
            record[system] = result
            name = {"ethanol": "ethanol (9 atoms)", "cu1008": "Cu fcc, periodic (1008 atoms)"}[system]
            rates = ", ".join(
                f"{d.upper() if d == 'cuda' else 'CPU'} {r['steps_per_s']:.1f}" for d, r in result["md"].items()
            )
            self.row("MD", f"{name}: VelocityVerlet steps/s", rates)
            drift = ", ".join(f"{d} {r['energy_drift_meV_per_atom']:+.3f}" for d, r in result["md"].items())
            steps = next(iter(result["md"].values()))["steps"]
            self.row("MD", f"{name}: total energy drift (meV/atom, {steps} steps)", drift)
            key = f"forces_{label}_vs_cpu_max_rel"
            if key in result:
                self.row(
                    "MD",
                    f"{name}: forces, CUDA against CPU (largest relative difference)",
                    fmt(result[key]),
                    "ok" if result[key] < 1e-3 else "LARGE",
                )
            if result.get("incomplete"):
                self.row("MD", f"{name}: the MD run", result["incomplete"], "INCOMPLETE")
                record.setdefault("failures", []).append(f"MD {system}: {result['incomplete']}")
            fd = result.get("finite_differences")
            if fd is None:
                continue
            self.row(
                "MD",
                f"{name}: forces against finite differences of the energy (float64 copy, {fd['device']})",
                f"largest error {fmt(fd['max_abs_error_eV_per_A'])} eV/A, forces up to "
                f"{fmt(fd['max_force_eV_per_A'])} eV/A",
                "ok" if fd["ok"] else "FAILED",
            )
            self.row(
                "MD",
                f"{name}: forces, float32 against float64",
                fmt(fd["float32_vs_float64_forces_max_rel"]),
                "ok" if fd["float32_vs_float64_forces_max_rel"] < 1e-3 else "LARGE",
            )
            if not fd["ok"]:
                record.setdefault("failures", []).append(f"{system}: forces disagree with finite differences")

    def md_worker(self, command: list[str], system: str) -> dict:
        done = self.run(command, self.work / "md" / system, timeout=None)
        results = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
        if not results:
            raise StepFailed(
                f"device_md.py {'killed at its time limit' if done.timed_out else 'exited ' + str(done.returncode)}: "
                + tail(done.stderr, 2)
            )
        result = json.loads(results[-1][len("RESULT ") :])
        if done.timed_out or done.returncode != 0:
            result["incomplete"] = "killed at its time limit" if done.timed_out else f"exited {done.returncode}"
            self.say(f"  MD {system}: {result['incomplete']}, keeping what it measured")
        for device, rate in result["md"].items():
            self.say(f"  MD {system} on {device}: {rate['steps_per_s']:.1f} steps/s ({rate['steps']} steps)")
        fd = result.get("finite_differences")
        if fd:
            self.say(
                f"  {system}: finite differences {'ok' if fd['ok'] else 'FAILED'}, largest error "
                f"{fd['max_abs_error_eV_per_A']:.2e} eV/A"
            )
        return result

    def scaling(self, record: dict) -> None:
        cores = self.results.get("environment", {}).get("cores") or os.cpu_count()
        data = self.generate_emt(self.args.scaling_structures)
        dataset = Dataset("EMT generated", data, EMT_TARGETS)
        batch = self.args.scaling_batch
        results = {}
        # one rank first (the reference), then the most ranks, then the rest: if time runs
        # out, the figures that matter most are in
        counts = sorted(set(self.args.ranks))
        if len(counts) > 2:
            counts = counts[:1] + counts[-1:] + counts[1:-1]
        plan = [(n, "mtt") for n in counts]
        if self.args.torchrun_threads_row and 2 in self.args.ranks:
            plan.append((2, "torchrun"))
        for ranks, threads in plan:
            if batch % ranks:
                self.row("CPU scaling", f"{ranks} ranks", f"global batch {batch} does not split in {ranks}", "skipped")
                continue
            # torchrun sets OMP_NUM_THREADS=1 for every rank when it is unset, and mtt then
            # leaves torch's threads alone; set but empty, torchrun keeps it and mtt shares
            # the cores itself (distributed._share_cores)
            env = {"OMP_NUM_THREADS": ""} if threads == "mtt" else {"OMP_NUM_THREADS": None}
            label = f"{ranks}" if threads == "mtt" else f"{ranks}-torchrun-threads"
            figures = self.attempt(
                record,
                f"{ranks} ranks ({threads} threads)",
                lambda: self.train(
                    self.work / "scaling" / f"{ranks}-{threads}",
                    dataset,
                    ["device=cpu"],
                    epochs=self.args.scaling_epochs,
                    batch=batch // ranks,
                    ranks=ranks,
                    env=env,
                ),
            )
            if figures is None:
                continue
            figures["ranks"] = ranks
            figures["threads_per_rank"] = max(1, cores // ranks) if threads == "mtt" else 1
            figures["threads_set_by"] = (
                "mtt (OMP_NUM_THREADS set but empty)" if threads == "mtt" else "torchrun (OMP_NUM_THREADS=1)"
            )
            results[label] = figures
            self.say(
                f"  {ranks} ranks x {figures['threads_per_rank']} threads ({figures['threads_set_by']}): "
                f"{figures['seconds_per_epoch']:.3f} s/epoch"
            )
        record["runs"] = results
        record["dataset"] = {
            "structures": self.args.scaling_structures,
            "global_batch": batch,
            "epochs": self.args.scaling_epochs,
            "cores": cores,
        }
        one = results.get("1")
        for label, figures in sorted(results.items(), key=lambda item: (item[1]["ranks"], item[0])):
            ranks = figures["ranks"]
            if one:
                speed_up = one["seconds_per_epoch"] / figures["seconds_per_epoch"]
                figures["speed_up"], figures["efficiency"] = speed_up, speed_up / ranks
                same = (
                    figures["test_line"] == one["test_line"] and figures["final_validation"] == one["final_validation"]
                )
                figures["identical_to_one_rank"] = same
                value = (
                    f"{figures['seconds_per_epoch']:.3f} s/epoch, speed-up {speed_up:.2f}x, "
                    f"efficiency {speed_up / ranks:.0%}, peak {figures['peak_memory_mb']:.0f} MB/rank"
                )
                verdict = "identical errors" if same else "ERRORS DIFFER"
                if not same:
                    record.setdefault("failures", []).append(f"{label} ranks: test errors differ from 1 rank")
            else:
                value, verdict = f"{figures['seconds_per_epoch']:.3f} s/epoch", "no 1-rank reference"
            threads = f"{figures['threads_per_rank']} thread{'s' if figures['threads_per_rank'] > 1 else ''}"
            if label.endswith("torchrun-threads"):
                threads += " (torchrun's OMP_NUM_THREADS=1)"
            self.row(
                "CPU scaling",
                f"{ranks} rank{'s' if ranks > 1 else ''} x {threads}; "
                f"{self.args.scaling_structures} EMT structures, global batch {batch}, "
                f"{self.args.scaling_epochs} epochs",
                value,
                verdict,
            )

    def generate_emt(self, count: int) -> Path:
        """``count`` EMT structures, made by four generator processes at once."""
        folder = self.work / "scaling"
        parts = 4 if count >= 40 else 1
        processes = []
        for part in range(parts):
            size = count // parts + (1 if part < count % parts else 0)
            command = [
                PYTHON,
                str(GENERATOR),
                "--n-structures",
                str(size),
                "--seed",
                str(100 + part),
                "--output",
                str(folder / f"part{part}.xyz"),
            ]
            processes.append(self.run_background(command, folder / f"generate{part}"))
        for process in processes:
            if process.wait(timeout=max(5, self.remaining())) != 0:
                raise StepFailed("generating the EMT structures failed")
        data = folder / f"emt_{count}.xyz"
        data.write_text("".join((folder / f"part{part}.xyz").read_text() for part in range(parts)))
        self.say(f"  {count} EMT structures generated")
        return data

    def run_background(self, command: list[str], cwd: Path) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(
            command, cwd=cwd, stdout=open(cwd / "stdout.txt", "w"), stderr=open(cwd / "stderr.txt", "w")
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--cpu-only", action="store_true", help="a dry run: every step a CPU can run")
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or str(ROOT / "outputs" / "device_check"),
        help="where device_check.md, .json and .log go (default: $OUT, else outputs/device_check)",
    )
    parser.add_argument(
        "--work", help="scratch folder for the runs, emptied first (default: outputs/device_check-work)"
    )
    parser.add_argument(
        "--budget", type=float, default=440, help="seconds for the whole check; steps past it are skipped"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the CUDA-against-CPU trainings")
    parser.add_argument("--ethanol", help="ethanol data (default: .whl/data/ethanol_reduced_100.xyz)")
    parser.add_argument(
        "--no-noise-reference", action="store_true", help="skip the float64 CPU training that measures float32 noise"
    )
    parser.add_argument("--port-timeout", type=int, default=8, help="distributed.timeout of the port-in-use case")
    parser.add_argument("--md-train-epochs", type=int, default=5, help="epochs of the metal model for MD")
    parser.add_argument("--md-steps", type=int, default=300, help="timed MD steps of ethanol (per device)")
    parser.add_argument("--md-steps-large", type=int, default=100, help="timed MD steps of the 1008-atom cell")
    parser.add_argument("--md-seconds", type=float, default=15, help="at most this long per timed MD run")
    parser.add_argument("--fd-atoms", type=int, default=3, help="atoms whose forces are checked by finite differences")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="gloo rank counts")
    parser.add_argument("--scaling-structures", type=int, default=1000)
    parser.add_argument("--scaling-batch", type=int, default=32, help="global batch of the scaling runs")
    parser.add_argument("--scaling-epochs", type=int, default=4)
    parser.add_argument(
        "--no-torchrun-threads-row",
        dest="torchrun_threads_row",
        action="store_false",
        help="skip the 2-rank run with torchrun's OMP_NUM_THREADS=1",
    )
    parser.add_argument(
        "--pretend-gpu",
        action="store_true",
        help="a test of this script: the GPU path, with the CPU (and gloo) standing in for CUDA",
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        default=["environment", "train", "torchrun", "md", "message-passing", "scaling"],
        help="which steps to run, in this order",
    )
    args = parser.parse_args()

    check = Check(args)
    check.say(
        f"mtt device check ({check.results['mode']}): figures to {check.out}, runs in {check.work}, "
        f"budget {args.budget:.0f} s"
    )
    # the most each step may take, as fractions of the budget; what a step leaves goes to the next
    shares = {"environment": 0.12, "train": 0.38, "torchrun": 0.22, "md": 0.26, "message-passing": 0.2, "scaling": 1.0}
    budgets = {name: share * args.budget for name, share in shares.items()}
    functions = {
        "environment": check.environment,
        "train": check.train_soap,
        "torchrun": check.torchrun,
        "md": check.md,
        "message-passing": check.train_message_passing,
        "scaling": check.scaling,
    }
    for name in args.steps:
        check.step(name, budgets[name], functions[name])
    check.write()
    print("\n" + (check.out / "device_check.md").read_text(), flush=True)
    failed = [n for n, s in check.results["steps"].items() if s["status"] == "failed"]
    check.say(f"done in {check.elapsed():.0f} s; " + (f"failed: {', '.join(failed)}" if failed else "no step failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
