"""The rendezvous of the ranks, bounded in time, and the stop of every rank when rank 0
cannot host it.

Rank 0 knows at once that its port is taken (EADDRINUSE); the others do not: they wait in
the TCP store's constructor, which ignores its timeout, or join the store of another job
that holds the port. So each rank keeps a watchdog thread that ends the process after
``distributed.timeout`` seconds, and under SLURM rank 0, before it stops, signals the
other tasks of its step (``scancel --signal=USR2``): their watchdog then stops them at
once, with a message that points to rank 0's. The watchdog hears the signal through
``signal.set_wakeup_fd``, because the main thread may be inside C++ code that never
returns to Python.
"""

from __future__ import annotations

import datetime
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import torch

from ..errors import EnvironmentProblem

if TYPE_CHECKING:
    from .environment import DistributedEnvironment

#: exit status of a rank whose rendezvous timed out, or that rank 0 stopped
RENDEZVOUS_TIMEOUT_STATUS = 3
#: the signal rank 0 sends the other tasks of its SLURM step when it cannot host
PEER_STOP = signal.SIGUSR2


def _port_in_use(error: BaseException) -> bool:
    text = str(error)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def _stop_the_others() -> None:
    """Signal the other tasks of this SLURM step that the rendezvous will not happen."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    scancel = shutil.which("scancel")
    if not job or not step or not step.isdigit() or scancel is None:
        return  # not in an srun step: the others stop at the timeout
    signal.signal(PEER_STOP, signal.SIG_IGN)  # the step's tasks include this one
    try:
        subprocess.run([scancel, f"--signal={PEER_STOP.name.removeprefix('SIG')}", f"{job}.{step}"], timeout=10)
    except (OSError, subprocess.SubprocessError):
        pass  # the watchdogs still end the others at the timeout


class _Watchdog:
    """Ends the process after ``timeout`` seconds, or at once on :data:`PEER_STOP`."""

    def __init__(self, environment: DistributedEnvironment, timeout: float):
        self.launch = environment.launch
        self.address = f"{self.launch.master_addr}:{environment.port}"
        self.timeout = timeout
        self.done = threading.Event()
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)
        self.previous_handler = signal.signal(PEER_STOP, lambda number, frame: None)  # so that it reaches the fd
        self.previous_fd = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _end(self, message: str) -> None:
        sys.stderr.write(message)
        sys.stderr.flush()
        os._exit(RENDEZVOUS_TIMEOUT_STATUS)

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.done.is_set():
            left = deadline - time.monotonic()
            ready = select.select([self.read_end], [], [], max(left, 0))[0] if left > 0 else []
            if self.done.is_set():
                return
            if not ready:
                self._end(
                    f"mtt: environment problem: rank {self.launch.rank} could not complete the rendezvous "
                    f"at {self.address} with {self.launch.world_size} ranks within {self.timeout:g} s.\n"
                    "Another rank may have failed to start (see its message), the port may be held by "
                    "another program or job, or a node cannot reach "
                    f"{self.launch.master_addr}. Choose another port with distributed.port=NNNNN, or a "
                    "longer wait with distributed.timeout=SECONDS.\n"
                )
            if PEER_STOP.value in os.read(self.read_end, 512):
                self._end(
                    f"mtt: environment problem: rank {self.launch.rank} stops: rank 0 could not host the "
                    f"rendezvous at {self.address} (see its message).\n"
                )

    def close(self) -> None:
        self.done.set()
        signal.set_wakeup_fd(self.previous_fd)
        if signal.getsignal(PEER_STOP) is not signal.SIG_IGN:  # ignored: rank 0 signalled its own step
            signal.signal(PEER_STOP, self.previous_handler)
        os.write(self.write_end, b"\0")  # wakes the thread, which sees it is done
        self.thread.join(timeout=5)
        os.close(self.read_end)
        os.close(self.write_end)


def rendezvous(environment: DistributedEnvironment, timeout: float) -> None:
    """Join the other ranks, or end the process within ``timeout`` seconds."""
    launch = environment.launch
    watchdog = _Watchdog(environment, timeout)
    try:
        wait = datetime.timedelta(seconds=timeout)
        if launch.launcher == "torchrun":
            os.environ["MASTER_PORT"] = str(environment.port)
            torch.distributed.init_process_group(
                environment.backend, init_method="env://", timeout=datetime.timedelta(minutes=30)
            )
        else:
            try:
                store = torch.distributed.TCPStore(
                    launch.master_addr,
                    environment.port,
                    launch.world_size,
                    is_master=launch.rank == 0,
                    timeout=wait,
                    wait_for_workers=False,
                )
            except Exception as error:
                if _port_in_use(error):
                    _stop_the_others()
                    raise EnvironmentProblem(
                        f"port {environment.port} on {socket.gethostname()} ({launch.master_addr}) "
                        "is already in use, so rank 0 cannot host the rendezvous.",
                        hint="Another job or program holds it. Choose a free port with "
                        "distributed.port=NNNNN (or set MASTER_PORT in the job script).",
                    ) from error
                raise
            torch.distributed.init_process_group(
                environment.backend,
                store=store,
                rank=launch.rank,
                world_size=launch.world_size,
                timeout=datetime.timedelta(minutes=30),
            )
        torch.distributed.barrier()
    finally:
        watchdog.close()
