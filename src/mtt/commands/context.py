"""What the dispatcher (:mod:`mtt.__main__`) needs to know about a command while it runs:
filled in by the command, read when it fails."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunContext:
    """Where a failure's error.log goes, and which rank it happened on."""

    run_folder: Path | None = None
    environment: object | None = None  # mtt.distributed.DistributedEnvironment, once set up
    arguments: list[str] | None = None  # the command line after `mtt`, as given
