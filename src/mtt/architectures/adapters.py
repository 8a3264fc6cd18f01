"""What fine-tuning trains of a model: all of it, its heads, or low-rank adapters.

``lora`` (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) adds to
every weight matrix W outside the heads a product A B of rank r, and trains A and B only:
W stays as trained, and B starts at zero, so the fine-tuned model starts as the original.
A weight of more than two axes (one matrix per element or per degree) gets one product
per matrix. The adapters are torch parametrizations: the architecture's code reads its
weights as before, and :func:`merged` folds them in for export. The heads (new targets'
among them) are trained fully, as they are small and specific to the new data.
"""

from __future__ import annotations

import copy
import math

import torch
from torch.nn.utils import parametrize

from .base import ShallowEnsemble


class LowRankUpdate(torch.nn.Module):
    """W + (alpha / rank) A B over the last two axes of W."""

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float):
        super().__init__()
        *leading, rows, columns = weight.shape
        options = {"dtype": weight.dtype, "device": weight.device}
        # A as a linear layer's default initialisation, B zero: no change at the start
        bound = 1.0 / math.sqrt(rows)
        self.a = torch.nn.Parameter(torch.empty(*leading, rows, rank, **options).uniform_(-bound, bound))
        self.b = torch.nn.Parameter(torch.zeros(*leading, rank, columns, **options))
        self.scale = alpha / rank

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.a @ self.b)


def _head_parameters(model: torch.nn.Module) -> set[int]:
    return {id(p) for head in model.heads() for p in head.parameters()}


def add_adapters(model: torch.nn.Module, rank: int, alpha: float) -> int:
    """Give every weight matrix of ``model`` outside its heads a low-rank adapter; returns
    how many. Called on a model built from hyperparameters, before its (fine-tuned)
    weights are loaded: checkpoints of a ``lora`` run hold the adapters."""
    heads = _head_parameters(model)
    chosen = [
        (module, name)
        for module in list(model.modules())
        for name, parameter in list(module.named_parameters(recurse=False))
        if parameter.dim() >= 2 and id(parameter) not in heads and not isinstance(module, ShallowEnsemble)
    ]
    for module, name in chosen:
        parametrize.register_parametrization(module, name, LowRankUpdate(getattr(module, name), rank, alpha))
    return len(chosen)


def has_adapters(model: torch.nn.Module) -> bool:
    return any(parametrize.is_parametrized(module) for module in model.modules())


def choose_trained(model: torch.nn.Module, method: str) -> tuple[int, int]:
    """Set ``requires_grad`` for ``method``: every weight (full), the heads only, or the
    adapters and heads (lora). Returns (trained, all) numbers of weights."""
    heads = _head_parameters(model) if method != "full" else set()
    total = trained = 0
    for name, parameter in model.named_parameters():
        adapter = ".parametrizations." in name and not name.endswith(".original")
        # a shallow ensemble's members are heads too, whatever the architecture says of its own
        member = name.startswith("shallow_ensemble.")
        chosen = method == "full" or id(parameter) in heads or member or (method == "lora" and adapter)
        parameter.requires_grad_(chosen)
        trained += parameter.numel() if chosen else 0
        total += 0 if adapter else parameter.numel()
    return trained, total


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself without adapters, else a copy with each adapter folded into its
    weight: what TorchScript compiles and what simulation engines run."""
    if not has_adapters(model):
        return model
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return model
