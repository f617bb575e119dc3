"""A scheduler class of the user's own under an LR rule (scale_lr, lr=) keeps the rule's rate at every step.

Such a class may keep its rates where nbtrain cannot see them (`self.peaks = [g["lr"] for g in ...]`): scaling
the rates torch's own schedulers keep would leave those, and the rate would fall back to the unscaled curve
after step 0 (0.2 -> 0.09 in the issue). A factory of one is built over the rates the rule already scaled, as
the user's loop under that rule builds it, and the summary says so.

Generated: the user's class (its peak in its own attribute, a warm-up-then-decay over its own list, one reading
torch's base_lrs, a subclass of torch's StepLR) x the rule (none, scale_lr, lr=) x interval (step, epoch) x one
or two param groups; each against the plain loop that builds the optimizer at the scaled rates and the
scheduler over it. Rates and weights bit for bit at fp32 on the CPU.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S

import nbtrain

from test_schedules_as_written import BATCH, FEATURES, LR, N, RULES, STEPS, data

TOTAL = 10


class PeakDecay(S.LRScheduler):
    """Linear decay from a peak it keeps itself (the issue's case)."""

    def __init__(self, optimizer):
        self.peaks = [g["lr"] for g in optimizer.param_groups]
        super().__init__(optimizer)

    def get_lr(self):
        return [p * max(0.0, 1 - self.last_epoch / TOTAL) for p in self.peaks]


class WarmThenDecay(S.LRScheduler):
    """A ramp to its first group's rate, kept as one number, then a halving every 4 steps."""

    def __init__(self, optimizer):
        self.peak = optimizer.param_groups[0]["lr"]
        self.ratios = [g["lr"] / self.peak for g in optimizer.param_groups]
        super().__init__(optimizer)

    def get_lr(self):
        e = self.last_epoch
        at = self.peak * (e + 1) / 3 if e < 3 else self.peak * 0.5 ** ((e - 3) // 4)
        return [at * r for r in self.ratios]


class FromBase(S.LRScheduler):
    """Reads only torch's own base_lrs."""

    def get_lr(self):
        return [b / (1 + self.last_epoch) for b in self.base_lrs]


class Halving(S.StepLR):
    """torch's StepLR under a class of the user's own."""

    def __init__(self, optimizer):
        super().__init__(optimizer, step_size=2, gamma=0.5)


CLASSES = {"PeakDecay": PeakDecay, "WarmThenDecay": WarmThenDecay, "FromBase": FromBase, "Halving": Halving}


def groups(model, k: float, two: bool):
    if not two:
        return model.parameters()
    return [{"params": [model.weight]}, {"params": [model.bias], "lr": LR * k / 4}]


def plain_loop(cls, k: float, interval: str, two: bool):
    """The user's loop under the rule: the optimizer at the scaled rates, the scheduler built over it."""
    torch.manual_seed(2)
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(groups(model, k, two), lr=LR * k, momentum=0.9)
    scheduler = cls(optimizer)
    x, y = data().tensors
    rates = []
    for step in range(STEPS):
        rates.append(optimizer.param_groups[0]["lr"])
        start = step * BATCH % N
        nn.functional.mse_loss(model(x[start:start + BATCH]), y[start:start + BATCH]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if interval == "step" or (step + 1) * BATCH % N == 0:
            scheduler.step()
    return model, rates


CASES = list(itertools.product(CLASSES, RULES, ("step", "epoch"), (False, True)))


@pytest.mark.parametrize("name,rule,interval,two", CASES)
def test_a_scheduler_class_of_the_users_own_keeps_the_rules_rate_at_every_step(name, rule, interval, two):
    torch.manual_seed(2)
    model = nn.Linear(FEATURES, 1)
    result = nbtrain.fit(model, data(), loss_fn=nn.MSELoss(), scheduler=CLASSES[name], scheduler_interval=interval,
                         optimizer=lambda p: torch.optim.SGD(groups(model, 1.0, two), lr=LR, momentum=0.9),
                         batch_size=BATCH, max_steps=STEPS, shuffle=False, accelerator="cpu",
                         log_every_n_steps=STEPS, **RULES[rule][0])
    reference, expected = plain_loop(CLASSES[name], RULES[rule][1], interval, two)
    rates = list(result.log.columns["lr"])
    assert rates == expected, f"rates {rates}\nplain {expected}\nnotes {result.summary.notes}"
    for (key, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{key} differs by {(a - b).abs().max().item():.3g}"
    said = [n for n in result.summary.notes if "schedule built over the rates the LR rule scaled" in n]
    assert bool(said) == (rule != "none"), result.summary.notes
