"""The device check's first step: what is installed and where it comes from (a probe in
the interpreter that the trainings use), the GPU and nvidia-smi, and whether the packaged
YAML configs compose from src/ on PYTHONPATH.
"""

from __future__ import annotations

import json
import subprocess

from harness import EMT, ROOT
from runner import PYTHON, Check, StepFailed, tail

# run with ``python -c`` (the data file as its argument); prints one line ``PROBE {json}``
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
found["packaged_configs"] = sorted(
    str(p.name) for p in conf.iterdir()
    if not p.name.startswith("_") and (p.name.endswith(".yaml") or p.is_dir())
)
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


def environment(check: Check, record: dict) -> None:
    done = check.run([PYTHON, "-c", PROBE, str(EMT)], check.work / "probe", timeout=120)
    line = next((l for l in done.stdout.splitlines() if l.startswith("PROBE ")), None)
    if line is None:
        raise StepFailed("the probe of the installed packages failed: " + tail(done.stderr, 5))
    found = json.loads(line[len("PROBE ") :])
    check.results["environment"] = found
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except Exception:
        commit = ""
    check.results["commit"] = commit or "unknown"
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        check.results["nvidia_smi"] = smi.stdout or smi.stderr
    except (OSError, subprocess.TimeoutExpired) as error:
        check.results["nvidia_smi"] = None if check.args.cpu_only else f"nvidia-smi: {error}"
    for name, package in found["packages"].items():
        check.say(f"  {name}: {package['version'] + ' from ' + package['where'] if package else 'not installed'}")
    check.say(f"  mtt {found['mtt']['version']} from {found['mtt']['where']}; architectures {found['architectures']}")
    check.say(
        f"  torch {found['torch']}, CUDA {found['torch_cuda']}, GPU {found.get('gpu', 'none')}, "
        f"NCCL {found.get('nccl', '-')}, {found['cores']} cores"
    )
    if check.results.get("nvidia_smi"):
        print(check.results["nvidia_smi"], flush=True)
    missing = [n for n, p in found["packages"].items() if p is None and n not in ("e3nn", "featomic-torch")]
    check.row(
        "environment",
        "torch, GPU, cores",
        f"torch {found['torch']} (CUDA {found['torch_cuda']}), {found.get('gpu', 'no GPU')}, "
        f"NCCL {found.get('nccl', '-')}, {found['cores']} cores",
        "ok" if not missing else "missing: " + ", ".join(missing),
    )
    composed = found["composed_distributed"] and "architecture" in found["composed_options"]
    check.row(
        "environment",
        "packaged YAML configs, from src/ on PYTHONPATH",
        ", ".join(found["packaged_configs"]) + "; options composed with distributed=true",
        "ok" if composed else "FAILED",
    )
    if check.cuda and not found["cuda_available"] and not check.args.pretend_gpu:
        check.cuda = False
        record.setdefault("failures", []).append("torch sees no GPU: the CUDA parts are not run")
    check.architectures = found["architectures"]
