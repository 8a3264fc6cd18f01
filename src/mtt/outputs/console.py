"""The terminal's one line that is rewritten in place (the step bar), and the log handler
that clears it before each message, so that messages never land in the middle of a bar."""

from __future__ import annotations

import logging
import shutil
import sys
from typing import TextIO

#: the terminal width a line must fit when the terminal does not say
DEFAULT_COLUMNS = 80


def columns(stream: TextIO) -> int:
    """The width of the terminal (``COLUMNS`` wins), 80 for files and pipes."""
    if stream.isatty():
        return max(40, shutil.get_terminal_size((DEFAULT_COLUMNS, 24)).columns)
    return DEFAULT_COLUMNS


class StatusLine:
    """The one line that is rewritten in place (the step bar); log messages clear it first."""

    shown = False
    stream: TextIO = sys.stdout

    @classmethod
    def show(cls, text: str) -> None:
        cls.stream.write("\r" + text[: columns(cls.stream) - 1].ljust(columns(cls.stream) - 1))
        cls.stream.flush()
        cls.shown = True

    @classmethod
    def clear(cls) -> None:
        if cls.shown:
            cls.stream.write("\r" + " " * (columns(cls.stream) - 1) + "\r")
            cls.stream.flush()
            cls.shown = False


class ConsoleHandler(logging.StreamHandler):
    """Log messages on stdout, clearing the step bar before each one."""

    def emit(self, record: logging.LogRecord) -> None:
        StatusLine.clear()
        super().emit(record)
