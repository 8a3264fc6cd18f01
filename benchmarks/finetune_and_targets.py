"""Accuracy of fine-tuning and of the new targets, on the shared ethanol data.

1. A SOAP-BPNN model trained on DFT ethanol (``ethanol_reduced_100.xyz``) is fine-tuned on
   GFN2-xTB ethanol (``ethanol_xtb_2000.xyz``, another level of theory) with each method,
   and compared with a model of the same hyperparameters trained from scratch on the xTB
   data alone: errors on the xTB test structures, and on the DFT run's validation
   structures before and after (the cost table of ``mtt train``).
2. Models of GFN2-xTB partial charges and dipole moments (SOAP-BPNN and equivariant_mp):
   test RMSEs, beside the spread of the references.

Usage: ``python benchmarks/finetune_and_targets.py [--epochs N] [--structures N] [--part ...]``; results
are printed as Markdown and written to ``.bench/finetune_and_targets/results_<part>.md``. Timings
are not measured: run it on a busy machine if need be.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import torch
from harness import BENCH, DATA

WORK = BENCH / "finetune_and_targets"
SOAP = "name: soap_bpnn\n  model:\n    soap: {max_radial: 6, max_angular: 4}"
MP = "name: equivariant_mp\n  model: {channels: 16, max_l: 2, hidden_l: 1, correlation: 2, num_layers: 2}"


def mtt(folder: Path, *arguments: str) -> str:
    result = subprocess.run([sys.executable, "-m", "mtt", *arguments], cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(result.stdout + result.stderr)
    return result.stdout


def run(folder: Path, text: str, *arguments: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "options.yaml").write_text(text)
    return mtt(folder, "train", "options.yaml", *arguments)


def options(architecture: str, training: str, data: Path, targets: str | None = None) -> str:
    block = f"training_set:\n  systems: {data}\n  targets:\n{targets}" if targets else f"training_set: {data}\n"
    return (
        f"seed: 1\narchitecture:\n  {architecture}\n  training: {training}\n{block}validation_set: 0.1\ntest_set: 0.1\n"
    )


def test_errors(stdout: str) -> dict[str, float]:
    """The summary's test column: metric -> value, in the units shown."""
    errors = {}
    for line in stdout.splitlines():
        if "validation:" in line:  # the rows of the cost table
            continue
        match = re.match(r"\s+(.+?RMSE) \[(.+?)\]\s+(\S+)\s+(\S+)$", line)
        if match:
            errors[f"{match.group(1)} [{match.group(2)}]"] = float(match.group(4))
    return errors


def cost_rows(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if "validation: " in line and "RMSE" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--structures", type=int, default=400, help="xTB structures for fine-tuning")
    parser.add_argument("--part", choices=["finetune", "targets", "all"], default="all")
    arguments = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    frames = ase.io.read(DATA / "ethanol_xtb_2000.xyz", ":")
    # the four trajectories, interleaved: a fine-tuning set drawn from all of them
    chosen = [frames[i] for i in np.random.default_rng(0).choice(len(frames), arguments.structures, replace=False)]
    xtb = WORK / "xtb.xyz"
    ase.io.write(xtb, chosen)
    training = f"{{num_epochs: {arguments.epochs}, batch_size: 16}}"
    lines = ["# Fine-tuning and new targets", ""]
    if arguments.part != "targets":
        lines += finetuning(arguments, xtb, training)
    if arguments.part != "finetune":
        lines += targets(frames, training, arguments.epochs)
    text = "\n".join(lines) + "\n"
    (WORK / f"results_{arguments.part}.md").write_text(text)
    print(text)


def finetuning(arguments: argparse.Namespace, xtb: Path, training: str) -> list[str]:
    lines = []

    dft = "    energy: {key: energy, unit: kcal/mol, forces: on}\n"  # rMD17's units
    stdout = run(WORK / "dft", options(SOAP, training, DATA / "ethanol_reduced_100.xyz", dft))
    checkpoint = next((WORK / "dft").glob("outputs/*/*/model.ckpt"))
    lines += [f"## 1. DFT ethanol model fine-tuned on {arguments.structures} GFN2-xTB structures", ""]
    lines += [f"DFT model, test: {test_errors(stdout)}", ""]
    scratch = run(WORK / "scratch", options(SOAP, training, xtb))
    lines += [f"- from scratch on the xTB data, test: {test_errors(scratch)}"]
    for method in ("full", "heads", "lora"):
        finetune = f"{{read_from: {checkpoint}, method: {method}, refit_baseline: true}}"
        text = options(
            SOAP.splitlines()[0], f"{{num_epochs: {arguments.epochs}, batch_size: 16, finetune: {finetune}}}", xtb
        )
        stdout = run(WORK / method, text)
        lines += [f"- fine-tuned, {method}, test: {test_errors(stdout)}", "", "  ```"]
        lines += [f"  {row}" for row in cost_rows(stdout)] + ["  ```", ""]
    return lines


def targets(frames: list, training: str, epochs: int) -> list[str]:
    lines = ["## 2. Partial charges and dipole moments (GFN2-xTB)", ""]
    dipoles = np.array([f.calc.results["dipole"] for f in frames])
    charges = np.concatenate([f.calc.results["charges"] for f in frames])
    lines += [
        f"References: dipole RMS {np.sqrt(np.mean(dipoles**2)):.4f} e*Å, std {dipoles.std(axis=0).mean():.4f} e*Å "
        f"per component; charges std {charges.std():.4f} e (all elements together)",
        "",
    ]
    targets = (
        "    charges: {key: charges, sample_kind: atom, unit: e}\n"
        "    dipole: {key: dipole, type: {cartesian: {rank: 1}}, unit: e*angstrom}\n"
    )
    everything = WORK / "ethanol_xtb_1000.xyz"
    ase.io.write(everything, frames[::2])
    for architecture in (SOAP, MP):
        name = architecture.split("\n")[0].removeprefix("name: ")
        stdout = run(WORK / f"dipole_{name}", options(architecture, training, everything, targets))
        lines += [f"- {name}, 800 training structures, {epochs} epochs, test: {test_errors(stdout)}"]
    return lines


if __name__ == "__main__":
    main()
