"""The layout of a run once launched: what the launcher said (:class:`Launch`) and the
environment every layer above uses for its collectives (:class:`DistributedEnvironment`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Launch:
    """What the launcher told us, before any network is touched."""

    launcher: str  # "slurm", "torchrun" or "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    job_id: str | None = None
    gpus_per_node: int | None = None


def _threads(device: torch.device) -> str:
    if device.type != "cpu":
        return ""
    count = torch.get_num_threads()
    return f" with {count} thread{'s' if count != 1 else ''}"


@dataclass
class DistributedEnvironment:
    """The layout of this run once the rendezvous is done."""

    launch: Launch
    enabled: bool
    device: torch.device
    backend: str | None = None
    port: int | None = None

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size if self.enabled else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        if not self.enabled:
            threads = _threads(self.device)
            return f"one process on {self.device}{threads}"
        return (
            f"{self.world_size} ranks on {self.launch.num_nodes} node(s), launched by "
            f"{self.launch.launcher}, {self.backend} backend, rendezvous at "
            f"{self.launch.master_addr}:{self.port}; this rank {self.rank} uses {self.device}" + _threads(self.device)
        )

    # -- collectives used by the trainer and the train command -------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return tensor
        reduced = tensor.to(self.device)
        torch.distributed.all_reduce(reduced)
        return reduced.to(tensor.device)

    def broadcast_object(self, value: Any) -> Any:
        if not self.enabled:
            return value
        holder = [value]
        torch.distributed.broadcast_object_list(holder, src=0)
        return holder[0]

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Make every rank start from rank 0's weights and baseline."""
        if not self.enabled:
            return
        for tensor in module.state_dict().values():
            moved = tensor.to(self.device)
            torch.distributed.broadcast(moved, src=0)
            tensor.copy_(moved.to(tensor.device))

    def average_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Average the gradients of all ranks in one collective (what DDP does).

        A parameter that no rank has a gradient for (the network of an element that no
        structure of the global batch has) keeps none, as in one process: the optimiser then
        leaves it alone, where a zero gradient would still move it by Adam's momentum."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        has_gradient = [float(p.grad is not None) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads] + [grads[0].new_tensor(has_gradient)]).to(self.device)
        torch.distributed.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        ranks_with_gradient = flat[-len(parameters) :].tolist()
        for parameter, grad, present in zip(parameters, grads, ranks_with_gradient):
            count = grad.numel()
            if present > 0:
                parameter.grad = flat[offset : offset + count].reshape(grad.shape).to(grad.device)
            else:
                parameter.grad = None
            offset += count

    def all_reduce_max(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor.item())

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one."""
        if not self.enabled:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item() > 0)

    def barrier(self) -> None:
        """Wait until every rank is here."""
        if self.enabled:
            torch.distributed.barrier()

    def shutdown(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
