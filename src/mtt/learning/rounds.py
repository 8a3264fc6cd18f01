"""What a round leaves on disk, and how a round trains: its files are written whole (a
temporary file renamed) and its stages recorded in ``round.json`` as they finish, so that
``--restart auto`` continues at the first stage not done; its training is an ordinary
`mtt train` in a subprocess, in the round's folder."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import MttError


def write_whole(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` into a temporary file beside ``path``, then rename it: all or nothing."""
    temporary = path.with_name(path.name + ".tmp")
    write(temporary)
    os.replace(temporary, path)


def write_text(path: Path, text: str) -> None:
    write_whole(path, lambda p: p.write_text(text))


class RoundState:
    """The stages a round has finished, with what each found (``round.json``)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / "round.json"
        self.stages: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, stage: str) -> bool:
        return stage in self.stages

    def finish(self, stage: str, found: Any) -> None:
        self.stages[stage] = found
        write_text(self.path, json.dumps(self.stages, indent=1))


def learned_block(path: Path, stress: bool) -> dict:
    """The dataset block of structures labelled by the loop: energy, forces (and stress) in eV and Å."""
    energy = {"key": "energy", "unit": "eV", "forces": "forces", "stress": "stress" if stress else False}
    return {"systems": {"read_from": str(path), "length_unit": "angstrom"}, "targets": {"energy": energy}}


def round_options(raw: dict, learned: list[dict], finetune_from: Path | None) -> dict:
    """The training options of a round: the starting options with every labelled file so
    far added to the training set, the uncertainty on, fine-tuned from ``finetune_from``."""
    options = copy.deepcopy(raw)
    blocks = options["training_set"] if isinstance(options["training_set"], list) else [options["training_set"]]
    options["training_set"] = list(blocks) + learned
    training = options["architecture"].setdefault("training", {})
    training["uncertainty"] = True
    training.pop("finetune", None)
    if finetune_from is not None:
        training["finetune"] = {"read_from": str(finetune_from)}
    return options


def train_round(folder: Path, options: dict, overrides: list[str], launcher: str, describe: str) -> tuple[Path, Path]:
    """Run `mtt train` on ``options`` in ``folder`` (continuing its own interrupted run);
    returns the checkpoint and the exported model."""
    options_path = folder / "options.yaml"
    write_text(options_path, yaml.safe_dump(options, sort_keys=False))
    command = [sys.executable, "-m", "mtt", "train", str(options_path), "-o", "model.pt", *overrides]
    if launcher:
        command = shlex.split(launcher) + command + ["distributed=true"]
    if any((folder / "outputs").glob("*/*/checkpoints/*.ckpt")):
        command += ["--restart", "auto"]
    log = folder / "train.log"
    with log.open("a") as stream:
        stream.write(f"$ {shlex.join(command)}\n")
        stream.flush()
        status = subprocess.run(command, cwd=folder, stdout=stream, stderr=subprocess.STDOUT).returncode
    if status == 130 or status < 0:
        raise KeyboardInterrupt(f"{describe}'s training was interrupted")
    checkpoints = sorted((folder / "outputs").glob("*/*/model.ckpt"), key=lambda p: p.stat().st_mtime)
    if status != 0 or not checkpoints:
        lines = log.read_text().splitlines()
        message = [line for line in lines if line.startswith("mtt")]
        shown = "\n".join(lines[lines.index(message[-1]) :] if message else lines[-15:])
        raise MttError(
            f"{describe}: `mtt train` failed (exit status {status}):\n{shown}",
            hint=f"Its whole output is in {log}. Fix the cause, then continue with --restart auto.",
        )
    return checkpoints[-1], folder / "model.pt"
