"""The errors users meet, each saying whose problem it is and how to fix it.

The dispatcher in :mod:`mtt.__main__` prints these as one short message. Anything else
that escapes a command is an internal bug of mtt, and is reported as such.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence


class MttError(Exception):
    """Base class of every error with a message written for the user."""

    #: shown before the message, says whose problem it is
    kind = "error"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n{self.hint}"
        return self.message

    def __reduce__(self):
        # whole across processes (DataLoader workers): pickling an exception keeps its args only
        return (_rebuilt, (type(self), self.message, self.hint))


def _rebuilt(kind: type, message: str, hint: str | None) -> MttError:
    error = kind.__new__(kind)
    MttError.__init__(error, message, hint)
    return error


class OptionsError(MttError):
    """The options file or a command-line override is wrong."""

    kind = "invalid options"


class OptionsProblems(OptionsError):
    """Several problems in the options, reported together in one message."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        count = len(self.problems)
        super().__init__(
            f"{count} problem{'s' if count > 1 else ''} in the options:\n"
            + "\n".join(f"  - {p}" for p in self.problems),
            hint="Fix these in the options file or in the command-line overrides.",
        )


class DataError(MttError):
    """A dataset file is missing, malformed or inconsistent with the options."""

    kind = "invalid data"


class CheckpointError(MttError):
    """A checkpoint cannot be used (missing, corrupt, foreign or too new)."""

    kind = "invalid checkpoint"


class EnvironmentProblem(MttError):
    """The machine or cluster is not set up as the run needs (ports, launchers, GPUs)."""

    kind = "environment problem"


class ArchitectureError(MttError):
    """An exception raised inside an architecture's own code."""

    kind = "architecture error"

    def __init__(self, architecture: str, maintainers: Sequence[str], original: BaseException):
        who = ", ".join(maintainers) if maintainers else "its authors"
        message = (
            f"this error most likely originates from the '{architecture}' architecture; "
            f"please report it to its maintainers ({who}), with the error.log file of the "
            f"run.\n{type(original).__name__}: {original}"
        )
        super().__init__(message)
        self.architecture = architecture
        self.original = original


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """A short ' Did you mean X?' suffix, or an empty string when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""


class TrainingDiverged(MttError):
    """The loss became NaN or infinite."""

    kind = "training diverged"
