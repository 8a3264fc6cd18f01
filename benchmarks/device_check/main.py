"""The check of mtt on a GPU machine: CUDA training against the CPU, torchrun with NCCL,
MD through metatomic's ASE calculator on CUDA, and CPU scaling over the machine's cores.

    bash benchmarks/device_check.sh [--cpu-only] [--out DIR] [options below]

Run through benchmarks/device_check.sh (or benchmarks/device_check/run.sh, which it runs),
which installs the carried wheels and sets PYTHONPATH. Every step is time-boxed; a step that
fails is recorded and the others still run. After each step, device_check.md (one table) and
device_check.json (every figure) are written again to $OUT, or --out, so that a run cut short
still leaves what it measured. --cpu-only runs every step that a CPU can run (a dry run).
docs/src/performance.rst, "On a GPU machine", says how a session with a GPU runs it.

Data: the ethanol set that benchmarks/device_check/wheels.sh copies into .whl/data (the
../shared beside a checkout does not travel to the GPU machine), else EMT metals only;
examples/data/emt_metals.xyz for the periodic model; a larger EMT set generated on the
spot (examples/data/generate_emt_dataset.py) for the scaling runs.

This file holds the options and the list of steps. The steps are in the modules beside it:
environment.py, train.py ("train" and "message-passing"), torchrun.py, md.py (which runs
md_process.py, one process per system) and scaling.py; runner.py runs commands and
``mtt train`` within the budget, and report.py writes device_check.md, .json and .log.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# benchmarks/ on the path, for harness.py (this folder is on it already: the modules beside this one)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environment import environment
from md import md
from runner import ROOT, Check
from scaling import scaling
from torchrun import torchrun
from train import MESSAGE_PASSING, train_message_passing, train_soap


@dataclass
class Step:
    label: str  # the step, as the table's rows name it
    share: float  # the most the step may take, as a fraction of the budget; what it leaves goes to the next
    run: Callable[[Check, dict], None]  # run(check, record)


STEPS = {
    "environment": Step("environment", 0.12, environment),
    "train": Step("train SOAP-BPNN", 0.38, train_soap),
    "torchrun": Step("torchrun", 0.22, torchrun),
    "md": Step("MD", 0.26, md),
    "message-passing": Step(f"train {MESSAGE_PASSING}", 0.2, train_message_passing),
    "scaling": Step("CPU scaling", 1.0, scaling),
}


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
        default=list(STEPS),
        help="which steps to run, in this order",
    )
    args = parser.parse_args()

    check = Check(args)
    check.say(
        f"mtt device check ({check.results['mode']}): figures to {check.out}, runs in {check.work}, "
        f"budget {args.budget:.0f} s"
    )
    for name in args.steps:
        step = STEPS[name]
        check.step(name, step.label, step.share * args.budget, step.run)
    check.write()
    print("\n" + (check.out / "device_check.md").read_text(), flush=True)
    failed = [n for n, s in check.results["steps"].items() if s["status"] == "failed"]
    check.say(f"done in {check.elapsed():.0f} s; " + (f"failed: {', '.join(failed)}" if failed else "no step failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
