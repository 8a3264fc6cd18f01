"""Adam and AdamW as one fused update per step, and the learning-rate schedule.

The update is torch's own fused kernel (``torch._fused_adam_``, ``torch._fused_adamw_``,
what ``torch.optim.Adam(fused=True)`` runs), called on lists kept from one step to the
next. ``torch.optim.Optimizer`` imports ``torch._dynamo`` when it is built, a noticeable
part of every run's start-up, and sorts the tensors by device and dtype again at every
step (the figures are on the "Speed and memory" page of the docs).

Both state dicts have torch's layout (``torch.optim.Adam`` and ``LambdaLR``), so that
checkpoints load and run the same with either.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class FusedAdam:
    """Adam (L2 weight decay) or, with ``decoupled_weight_decay``, AdamW; with ``amsgrad``,
    the AMSGrad variant (the running maximum of the second moments)."""

    def __init__(
        self,
        parameters: list[torch.Tensor],
        lr: float,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        amsgrad: bool = False,
    ):
        self.parameters = list(parameters)
        if not self.parameters:
            raise ValueError("FusedAdam got an empty parameter list")
        if len({(p.device, p.dtype) for p in self.parameters}) != 1:
            raise ValueError("FusedAdam takes parameters of one device and dtype")
        self.param_groups: list[dict[str, Any]] = [
            {
                "lr": lr,
                "betas": betas,
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": amsgrad,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": True,
                "decoupled_weight_decay": decoupled_weight_decay,
            }
        ]
        # torch keeps each parameter's step count as a float32 tensor on the CPU
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in self.parameters]
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.parameters]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.parameters]
        self.amsgrad = amsgrad
        self.max_exp_avg_sqs = (
            [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.parameters] if amsgrad else []
        )
        self._update = torch._fused_adamw_ if decoupled_weight_decay else torch._fused_adam_

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of the parameters that have a gradient (the others keep their state)."""
        having = [i for i, p in enumerate(self.parameters) if p.grad is not None]
        if not having:
            return
        steps = [self.steps[i] for i in having]
        torch._foreach_add_(steps, 1)
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        self._update(
            [self.parameters[i] for i in having],
            [self.parameters[i].grad for i in having],
            [self.exp_avgs[i] for i in having],
            [self.exp_avg_sqs[i] for i in having],
            [self.max_exp_avg_sqs[i] for i in having] if self.amsgrad else [],
            steps,
            amsgrad=self.amsgrad,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's layout; parameters that never had a gradient have no state."""
        state = {
            i: {"step": self.steps[i], "exp_avg": self.exp_avgs[i], "exp_avg_sq": self.exp_avg_sqs[i]}
            for i in range(len(self.parameters))
            if float(self.steps[i]) > 0
        }
        if self.amsgrad:
            for i, entry in state.items():
                entry["max_exp_avg_sq"] = self.max_exp_avg_sqs[i]
        group = dict(self.param_groups[0], params=list(range(len(self.parameters))))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.parameters):
            raise ValueError("the optimiser state does not match the model's parameters")
        for key in ("lr", "initial_lr", "betas", "eps", "weight_decay"):
            if key in groups[0]:
                self.param_groups[0][key] = groups[0][key]
        position = {int(key): i for i, key in enumerate(groups[0]["params"])}  # torch's keys, in order
        for key, saved in state_dict["state"].items():
            i = position[int(key)]
            self.steps[i] = torch.as_tensor(saved["step"], dtype=torch.float32).clone()
            self.exp_avgs[i] = saved["exp_avg"].to(self.parameters[i]).clone()
            self.exp_avg_sqs[i] = saved["exp_avg_sq"].to(self.parameters[i]).clone()
            if self.amsgrad and "max_exp_avg_sq" in saved:
                self.max_exp_avg_sqs[i] = saved["max_exp_avg_sq"].to(self.parameters[i]).clone()


class LearningRateSchedule:
    """The learning rate of step k: the initial rate times ``factor(k)``, on every group.

    Works with any optimiser that has torch's ``param_groups``; its state dict is
    ``LambdaLR``'s.
    """

    def __init__(self, optimizer: Any, factor: Callable[[int], float]):
        self.optimizer = optimizer
        self.factor = factor
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.last_epoch = 0  # LambdaLR's name for the number of steps taken
        self.scale = 1.0  # the plateau schedule's factor (kept by the trainer, not in this state)
        self._apply()

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self.factor(self.last_epoch) * self.scale

    def set_scale(self, scale: float) -> None:
        """A factor on every rate from now on (the plateau schedule lowering it)."""
        self.scale = scale
        self._apply()

    def set_peak(self, learning_rate: float) -> None:
        """Another peak rate from now on: what a restart with another learning_rate asks."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = learning_rate
        self._apply()

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_lrs": [g["initial_lr"] for g in self.optimizer.param_groups],
            "last_epoch": self.last_epoch,
            "_step_count": self.last_epoch + 1,
            "_is_initial": False,
            "_get_lr_called_within_step": False,
            "_last_lr": [g["lr"] for g in self.optimizer.param_groups],
            "lr_lambdas": [None] * len(self.optimizer.param_groups),  # functions are not state
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = int(state_dict["last_epoch"])
        for group, base in zip(self.optimizer.param_groups, state_dict["base_lrs"]):
            group["initial_lr"] = base
        self._apply()
