"""How a run begins, decided once: a new model, a fine-tuning of a trained one, or a restart
of an interrupted run of either kind. Each is a :class:`~mtt.starts.base.RunStart`;
`mtt train` goes the same way through all of them.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ComposedOptions
from .base import NewRun, RunParts, RunStart
from .finetune import Finetuning, read_finetune_source
from .restart import Restart, find_restart_point

__all__ = ["RunParts", "RunStart", "choose_start"]


def choose_start(
    options: ComposedOptions, restart_request: str | None, options_file: Path, world_size: int
) -> RunStart:
    """The start these options and ``--restart`` ask for; checks them, writes nothing."""
    source = read_finetune_source(options)  # before the restart's checks: the model becomes the checkpoint's
    begun: RunStart = NewRun(options) if source is None else Finetuning(options, source)
    point = find_restart_point(restart_request, options, options_file, world_size)
    return begun if point is None else Restart(point, begun)
