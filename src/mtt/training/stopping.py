"""Stop cleanly when the cluster asks: SIGUSR1 (SLURM's --signal before a time limit) or
SIGTERM (scancel, preemption). The Trainer finishes its step, writes a checkpoint, exits."""

from __future__ import annotations

import signal

from ..errors import MttError

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequested(MttError):
    """Training stopped on a signal after writing a checkpoint; it can be continued."""

    kind = "stopped"
    #: EX_TEMPFAIL: job scripts can requeue on it
    exit_status = 75


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
        self.received = signal.Signals(number).name

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
