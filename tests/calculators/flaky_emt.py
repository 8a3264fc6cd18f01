"""ASE's EMT, made to fail the way reference methods do, for the tests of `mtt learn`'s
labelling: ``raise_every``-th structure raises, ``nan_every``-th gives NaN forces, and the
``interrupt_at``-th stops the run as Ctrl-C does. Each structure it computes is counted in
``log`` (a file: the pool's processes share it), so a test sees what was labelled twice."""

from __future__ import annotations

import fcntl
from pathlib import Path

import numpy as np
from ase.calculators.emt import EMT


class FlakyEMT(EMT):
    def __init__(self, log: str, raise_every: int = 0, nan_every: int = 0, interrupt_at: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.log, self.raise_every, self.nan_every, self.interrupt_at = Path(log), raise_every, nan_every, interrupt_at

    def _count(self, atoms) -> int:  # noqa: ANN001
        """This call's number, and the structure it computes (a digest of its positions) in the log."""
        with self.log.open("a+") as stream:
            fcntl.flock(stream, fcntl.LOCK_EX)
            stream.seek(0)
            count = len(stream.read().splitlines()) + 1
            stream.write(f"{atoms.positions.sum():.8f}\n")
        return count

    def calculate(self, atoms=None, properties=("energy",), system_changes=()):  # noqa: ANN001
        count = self._count(atoms)
        if self.interrupt_at and count == self.interrupt_at:
            raise KeyboardInterrupt
        if self.raise_every and count % self.raise_every == 0:
            raise RuntimeError("SCF did not converge")
        super().calculate(atoms, properties, system_changes)
        if self.nan_every and count % self.nan_every == 0:
            self.results["forces"] = np.full_like(self.results["forces"], np.nan)
