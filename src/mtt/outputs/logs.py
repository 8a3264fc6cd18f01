"""The run's two loggers (terminal and train.log; train.log only) and the error log."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from .console import ConsoleHandler

LOGGER = logging.getLogger("mtt")
#: writes to the run's log file only (the full epoch lines, while the terminal shows a table)
FILE_LOGGER = logging.getLogger("mtt_file")


def setup_logging(log_file: Path | None, verbose: bool = True) -> None:
    """Messages to stdout, and to ``log_file`` when a run folder exists."""
    for logger in (LOGGER, FILE_LOGGER):
        logger.handlers.clear()
        logger.setLevel(logging.INFO)
        logger.propagate = False
    if verbose:
        console = ConsoleHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(console)
    if log_file is not None:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        LOGGER.addHandler(handler)
        FILE_LOGGER.addHandler(handler)


def write_error_log(folder: Path, error: BaseException, rank: int | None = None) -> Path:
    name = "error.log" if rank is None else f"error.rank{rank}.log"
    path = folder / name
    path.write_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    return path
