"""Distributed runs: who launched us (SLURM, torchrun or nobody), the rendezvous
(:mod:`.rendezvous`), and the few collective operations the rest of mtt needs.

This is the only package that reads ``SLURM_*``, ``RANK``, ``MASTER_PORT`` and friends.
Every wait is bounded: a rendezvous that cannot complete ends the process with a message
naming the address, the port and the world size, instead of hanging.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

import torch

from ..errors import EnvironmentProblem
from .environment import DistributedEnvironment, Launch
from .rendezvous import rendezvous

__all__ = ["DistributedEnvironment", "Launch", "available_cores", "peer_failure", "setup", "share"]


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list (``node[01-03,07],gpu1``) as a list of host names."""
    hosts, part = [], ""
    depth = 0
    pieces = []
    for char in nodelist:  # split on commas outside brackets
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            pieces.append(part)
            part = ""
        else:
            part += char
    pieces.append(part)
    for piece in filter(None, pieces):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", piece)
        if not match:
            hosts.append(piece)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            if "-" in item:
                start, end = item.split("-", 1)
                width = len(start)
                hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(start), int(end) + 1)]
            else:
                hosts.append(f"{prefix}{item}{suffix}")
    return hosts


def parse_gpus_per_node(value: str | None) -> int | None:
    """``2``, ``a100:2`` or ``gpu:a100:2`` -> 2; None when unset or unreadable."""
    if not value:
        return None
    match = re.search(r"(\d+)\s*(?:\(|$)", value.split(",")[0])
    return int(match.group(1)) if match else None


def detect_launch(env: Mapping[str, str] | None = None) -> Launch:
    """Read the launcher's variables: torchrun's first (it may run inside a SLURM job)."""
    env = os.environ if env is None else env
    gpus = parse_gpus_per_node(env.get("SLURM_GPUS_PER_NODE"))
    if "RANK" in env and "LOCAL_RANK" in env and "WORLD_SIZE" in env:
        return Launch(
            launcher="torchrun",
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            num_nodes=int(env.get("GROUP_WORLD_SIZE", 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
            job_id=env.get("SLURM_JOB_ID"),
            gpus_per_node=gpus,
        )
    if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", 1)))
        world = int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", 1)))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
        local_world = world // max(nodes, 1)
        match = re.match(r"(\d+)", tasks_per_node)
        if match:
            local_world = int(match.group(1))
        return Launch(
            launcher="slurm",
            rank=int(env["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=max(local_world, 1),
            num_nodes=nodes,
            master_addr=env.get("MASTER_ADDR") or expand_nodelist(nodelist)[0],
            master_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
            job_id=env["SLURM_JOB_ID"],
            gpus_per_node=gpus,
        )
    return Launch(launcher="none")


def choose_port(configured: int | None, launch: Launch) -> int:
    """The options' port, else the launcher's MASTER_PORT, else one derived from the job.

    Two SLURM jobs sharing a node get different ports (their job ids differ); only job
    ids 20000 apart could collide, and then the port-in-use message says what to do.
    """
    if configured is not None:
        return configured
    if launch.master_port is not None:
        return launch.master_port
    if launch.job_id is not None and launch.job_id.split("_")[0].isdigit():
        return 20000 + int(launch.job_id.split("_")[0]) % 20000
    return 29500


def _pick_device(device_option: str, launch: Launch) -> torch.device:
    if device_option == "cpu" or not torch.cuda.is_available():
        if device_option.startswith("cuda") and not torch.cuda.is_available():
            raise EnvironmentProblem(
                f"device '{device_option}' was asked for, but torch sees no CUDA GPU here.",
                hint="Use device: auto or cpu, or run on a machine with a GPU and a CUDA build of torch.",
            )
        return torch.device("cpu")
    # SLURM's GPUs per node when it says, else what torch sees
    visible = launch.gpus_per_node or torch.cuda.device_count()
    if device_option not in ("auto", "cuda"):
        return torch.device(device_option)
    return torch.device("cuda", launch.local_rank % max(visible, 1))


def _launcher_environment() -> dict[str, str] | None:
    """The environment our parent process (the launcher) was started with, from /proc;
    None where it cannot be read. A process's own later changes are not in that file."""
    try:
        raw = Path(f"/proc/{os.getppid()}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def user_threads(launch: Launch, env: Mapping[str, str] | None = None) -> int | None:
    """The threads per rank the user asked for with OMP_NUM_THREADS, or None.

    torchrun sets OMP_NUM_THREADS=1 itself when it starts several processes and the
    variable is unset; that default is not the user's choice. It is told apart by the
    environment torchrun itself was started with (or, where that cannot be read, by the
    value 1 under torchrun with several local ranks).
    """
    env = os.environ if env is None else env
    value = env.get("OMP_NUM_THREADS", "").strip()
    if not value.isdigit() or int(value) < 1:
        return None
    if launch.launcher == "torchrun" and launch.local_world_size > 1 and value == "1":
        parent = _launcher_environment()
        if parent is None or "OMP_NUM_THREADS" not in parent:
            return None
    return int(value)


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_rank(launch: Launch, env: Mapping[str, str] | None = None) -> int | None:
    """How many threads each rank of this node gets, or None to keep torch's default."""
    env = os.environ if env is None else env
    if launch.local_world_size <= 1:
        return None
    asked = user_threads(launch, env)
    if asked is not None:
        return asked
    cores = available_cores()
    # SLURM's --cpus-per-task already gives each task its own cores
    return max(1, cores if "SLURM_CPUS_PER_TASK" in env else cores // launch.local_world_size)


def _share_cores(launch: Launch) -> None:
    """Ranks on one node share its cores; default torch threads would fight each other."""
    threads = threads_per_rank(launch)
    if threads is not None:
        torch.set_num_threads(threads)


def setup(enabled: bool, port: int | None, timeout: float, device_option: str) -> DistributedEnvironment:
    """Check the launch against the options and, if distributed, join the other ranks."""
    launch = detect_launch()
    if not enabled:
        if launch.world_size > 1:
            raise EnvironmentProblem(
                f"{launch.world_size} copies of mtt were launched by {launch.launcher}, but "
                "distributed training is off: they would all train the same model and race "
                "on one output folder.",
                hint="Add distributed=true to the command line (or `distributed: true` in the "
                "options), or launch a single process.",
            )
        return DistributedEnvironment(launch, enabled=False, device=_pick_device(device_option, launch))
    if launch.launcher == "none":
        raise EnvironmentProblem(
            "distributed=true, but mtt was not started by srun or torchrun.",
            hint="Launch it with `srun mtt train options.yaml distributed=true` inside a SLURM "
            "job, or `torchrun --nproc-per-node N -m mtt train options.yaml distributed=true`; "
            "for a single process, drop distributed=true.",
        )
    device = _pick_device(device_option, launch)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    chosen_port = choose_port(port, launch)
    environment = DistributedEnvironment(launch, True, device, backend, chosen_port)
    _share_cores(launch)
    rendezvous(environment, timeout)
    return environment


def share(items: list, rank: int, world_size: int) -> list:
    """This rank's contiguous part of ``items``, sizes differing by at most one."""
    size, extra = divmod(len(items), world_size)
    start = rank * size + min(rank, extra)
    return items[start : start + size + (1 if rank < extra else 0)]


def peer_failure(error: BaseException, environment: DistributedEnvironment | None) -> EnvironmentProblem | None:
    """Explain a collective that failed because another rank stopped."""
    if environment is None or not environment.enabled:
        return None
    text = str(error).lower()
    clues = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "nccl")
    if not any(clue in text for clue in clues):
        return None
    return EnvironmentProblem(
        f"rank {environment.rank} stopped because another rank stopped first ({str(error).splitlines()[0]}).",
        hint="The first rank to fail says why, on stderr and in its error.rank<N>.log file in the run folder.",
    )
