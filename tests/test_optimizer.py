"""mtt's fused Adam and schedule give torch.optim's numbers and read and write its states."""

import math

import pytest
import torch

from mtt.training.optimizer import FusedAdam, LearningRateSchedule


def _parameters(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in [(7, 5), (5,), (3, 2, 4)]]


def _loss(parameters, step: int) -> torch.Tensor:
    # a different, non-quadratic loss at every step; the last parameter gets no gradient at step 0
    used = parameters if step > 0 else parameters[:-1]
    return sum(((p - 0.1 * step) ** 2).sum() + torch.sin(3 * p).sum() for p in used)


def _cosine(step: int) -> float:
    return 0.5 * (1 + math.cos(math.pi * min(step / 6, 1.0)))


def _train(parameters, optimizer, schedule, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        _loss(parameters, step).backward()
        optimizer.step()
        schedule.step()


@pytest.mark.parametrize("decoupled", [False, True])
def test_fused_adam_follows_torch_and_restarts_from_its_state(decoupled):
    ours, theirs = _parameters(0), _parameters(0)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    reference = kind(theirs, lr=0.01, weight_decay=0.1, fused=True)
    reference_schedule = torch.optim.lr_scheduler.LambdaLR(reference, _cosine)
    optimizer = FusedAdam(ours, lr=0.01, weight_decay=0.1, decoupled_weight_decay=decoupled)
    schedule = LearningRateSchedule(optimizer, _cosine)

    _train(theirs, reference, reference_schedule, range(4))
    _train(ours, optimizer, schedule, range(4))
    for mine, expected in zip(ours, theirs):
        torch.testing.assert_close(mine, expected, rtol=0, atol=0)
    assert optimizer.param_groups[0]["lr"] == reference.param_groups[0]["lr"]

    # each continues from the other's state (a checkpoint of either kind)
    ours_again, theirs_again = [p.detach().clone().requires_grad_() for p in ours], _parameters(1)
    with torch.no_grad():
        for copy, source in zip(theirs_again, theirs):
            copy.copy_(source)
    continued = FusedAdam(ours_again, lr=0.01, weight_decay=0.1, decoupled_weight_decay=decoupled)
    continued_schedule = LearningRateSchedule(continued, _cosine)
    continued.load_state_dict(reference.state_dict())
    continued_schedule.load_state_dict(reference_schedule.state_dict())
    continued_reference = kind(theirs_again, lr=0.01, weight_decay=0.1, fused=True)
    continued_reference_schedule = torch.optim.lr_scheduler.LambdaLR(continued_reference, _cosine)
    continued_reference.load_state_dict(optimizer.state_dict())
    continued_reference_schedule.load_state_dict(schedule.state_dict())

    _train(theirs, reference, reference_schedule, range(4, 8))
    _train(ours_again, continued, continued_schedule, range(4, 8))
    _train(theirs_again, continued_reference, continued_reference_schedule, range(4, 8))
    for mine, restarted, expected in zip(ours_again, theirs_again, theirs):
        torch.testing.assert_close(mine, expected, rtol=0, atol=0)
        torch.testing.assert_close(restarted, expected, rtol=0, atol=0)


def test_fused_adam_refuses_a_state_of_other_parameters():
    optimizer = FusedAdam(_parameters(0), lr=0.01)
    other = torch.optim.Adam(_parameters(0)[:2], lr=0.01, fused=True)
    with pytest.raises(ValueError, match="does not match"):
        optimizer.load_state_dict(other.state_dict())
