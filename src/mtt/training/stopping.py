"""Stop cleanly when asked: SIGUSR1 (SLURM's --signal before a time limit), SIGTERM
(scancel, preemption) or a first Ctrl-C (SIGINT). The Trainer finishes its step, writes a
checkpoint and exits; a second Ctrl-C ends the run at once, without a checkpoint."""

from __future__ import annotations

import signal
import sys

from ..errors import MttError

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class StopRequested(MttError):
    """Training stopped on a signal after writing a checkpoint; it can be continued."""

    kind = "stopped"
    #: EX_TEMPFAIL: job scripts can requeue on it
    exit_status = 75

    def __init__(self, message: str, hint: str | None = None, signal_name: str | None = None):
        super().__init__(message, hint)
        if signal_name == "SIGINT":  # the user's Ctrl-C: the shell's status, not a requeue
            self.exit_status = 130


class InterruptedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C while the run was finishing its step to stop."""


class StopSignals:
    """Records that a stop signal arrived, for the training loop to act on between steps."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous = {}

    def __enter__(self) -> "StopSignals":
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: object) -> None:
        name = signal.Signals(number).name
        if name == "SIGINT" and self.received is not None:  # a Ctrl-C while stopping: at once
            raise InterruptedAtOnce("stopped at once by a second Ctrl-C; no checkpoint was written")
        if self.received is None:
            self.received = name
            if name == "SIGINT":
                sys.stderr.write(
                    "\nmtt: Ctrl-C: finishing this step to write a checkpoint; Ctrl-C again stops at once\n"
                )
                sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
