"""Find the checkpoint `--restart auto` continues from."""

from __future__ import annotations

from pathlib import Path

import torch


def _recorded_epoch(path: Path) -> int | None:
    try:
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        epoch = content.get("epoch") if isinstance(content, dict) else None
        return epoch if isinstance(epoch, int) else None
    except Exception:  # unreadable files are simply not candidates
        return None


def find_latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint with the highest recorded epoch (not the newest file)."""
    best, best_epoch = None, -1
    for path in sorted(root.glob("*/*/checkpoints/*.ckpt")) + sorted(root.glob("*/*/model.ckpt")):
        epoch = _recorded_epoch(path)
        if epoch is not None and epoch > best_epoch:
            best, best_epoch = path, epoch
    return best
