"""The checkpoint file format: versioned, written atomically, loaded without running pickled
code, upgraded from older versions. What a checkpoint holds is :class:`mtt.training.state.TrainingState`'s."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from . import __version__
from .errors import CheckpointError

FORMAT = "mtt-checkpoint"
#: bump when the layout changes, and add an upgrade from the previous version below
VERSION = 2


def _add_architecture_version(content: dict) -> dict:
    """Version 2 records the version of the architecture's own layout, 1 before it existed."""
    return {**content, "version": 2, "architecture_version": 1}


#: upgrades[v] turns a version-v checkpoint into a version v+1 one
UPGRADES: dict[int, Callable[[dict], dict]] = {1: _add_architecture_version}


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` so that a crash never leaves a half-written file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {"format": FORMAT, "version": VERSION, "mtt_version": __version__, **state}
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(content, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def is_exported_model(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (an exported model), not a checkpoint."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("constants.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and upgrade a checkpoint; refuse anything that is not one of ours."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist.")
    if is_exported_model(path):
        raise CheckpointError(
            f"'{path}' is an exported model, not a checkpoint.",
            hint="Exported models cannot be trained further or re-exported; use the run's "
            "model.ckpt or a file from its 'checkpoints' folder.",
        )
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises almost any type for foreign files (KeyError for text)
        reason = str(error).splitlines()[0].split(". ")[0] if str(error) else "truncated or corrupt"
        raise CheckpointError(
            f"'{path}' is not a readable mtt checkpoint ({type(error).__name__}: {reason}).",
            hint="It may be truncated or corrupt, or another program's file. Use a .ckpt "
            "file from the 'checkpoints' folder of an mtt run, or model.ckpt.",
        ) from error
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise CheckpointError(
            f"'{path}' is not an mtt checkpoint.",
            hint="Exported models (.pt) cannot be restarted from; use the run's .ckpt files.",
        )
    version = content.get("version")
    if not isinstance(version, int) or version > VERSION:
        writer = content.get("mtt_version")
        raise CheckpointError(
            f"'{path}' has checkpoint version {version}, newer than this mtt ({__version__}) reads (up to {VERSION}).",
            hint=f"Use it with the mtt that wrote it{f' (mtt {writer})' if isinstance(writer, str) else ''} or a "
            "newer one: install it from its source, as this one was.",
        )
    while content["version"] < VERSION:
        content = UPGRADES[content["version"]](content)
    return content
