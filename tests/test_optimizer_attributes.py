"""What an optimizer or a schedule reads beyond torch's groups is compared too, before either carries on.

An optimizer class of the user's own keeps a setting as its own attribute (`self.clip`, as SAM and Lookahead-style
wrappers keep theirs, or a wrapped optimizer); a LambdaLR calls a bound method of a settings object (`rule.at`),
a method reading its class's attribute, a function that captured a value, or a numpy or torch rate table. Each
is read for what it is: an edit makes a new optimizer or schedule, as the user's loop would make one, and the
summary names what changed ("self.clip 1 -> 0.001", "Rule.gamma 0.8 -> 0.5"); nothing edited carries on (a
numpy table compared by value, not refused as "cannot tell").

Generated: the optimizer class (torch's SGD, a clipping subclass, a wrapper keeping an inner optimizer) x the edit
(none, the same value again, its own attribute, the wrapped optimizer's momentum) x a schedule (none, or one of
the kinds below, edited or not); and every schedule kind x edited or not over a clipping optimizer. Each against
test_edited_values' plain loop: a new optimizer and schedule where a value changed, the same ones where none did.
Weights bit for bit at fp32 on the CPU.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch.utils.data import TensorDataset


from helpers import weights_differ
from test_edited_values import PlainLoop, fit, make_model, rows

CELL = """
import abc
import dataclasses
import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
LR, CLIP, INNER_MOMENTUM, SCALE = 0.1, 1.0, 0.9, 1.0


def grads(optimizer):
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class ClippedSGD(torch.optim.SGD):
    def __init__(self, params, lr, clip):
        super().__init__(params, lr=lr)
        self.clip = clip

    @torch.no_grad()
    def step(self, closure=None):
        for grad in grads(self):
            grad.clamp_(-self.clip, self.clip)
        return super().step(closure)


class Wrapped(torch.optim.Optimizer):
    '''SAM-style: an inner optimizer over its groups, a setting of its own.'''

    def __init__(self, params, inner, scale):
        super().__init__(params, {})
        self.inner = inner(self.param_groups)
        self.param_groups = self.inner.param_groups
        self.scale = scale

    @torch.no_grad()
    def step(self, closure=None):
        for grad in grads(self):
            grad.mul_(self.scale)
        return self.inner.step()


class Rule:
    def __init__(self, gamma):
        self.gamma = gamma

    def at(self, epoch):
        return self.gamma ** epoch


class ClassRule:
    gamma = 0.8

    def at(self, epoch):
        return type(self).gamma ** epoch


class Schedule(abc.ABC):
    @abc.abstractmethod
    def at(self, epoch): ...


@dataclasses.dataclass
class Settings(Schedule):
    gamma: float = 0.8

    def at(self, epoch):
        return self.gamma ** epoch


def decaying(g):
    return lambda epoch: g ** epoch


rule, class_rule, made, settings = Rule(0.8), ClassRule(), decaying(0.8), Settings()
TABLE = np.linspace(1.0, 0.1, 50)
BIG = torch.linspace(1.0, 0.1, 10_000)  # past what is copied to compare: compared by its checksum

sgd = lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9)
clipped = lambda p: ClippedSGD(p, LR, CLIP)
wrapped = lambda p: Wrapped(p, lambda g: torch.optim.SGD(g, lr=LR, momentum=INNER_MOMENTUM), SCALE)
method = lambda o: LambdaLR(o, rule.at)
class_attribute = lambda o: LambdaLR(o, class_rule.at)
dataclass_method = lambda o: LambdaLR(o, settings.at)
captured = lambda o: LambdaLR(o, made)
table = lambda o: LambdaLR(o, lambda e: float(TABLE[e]))
big_table = lambda o: LambdaLR(o, lambda e: float(BIG[e]))
"""

# Each schedule kind's edit, run in the notebook's namespace, and what the summary names.
SCHEDULE_EDITS = {"method": ("rule.gamma = 0.5", "Rule.gamma 0.8 -> 0.5"),
                  "class_attribute": ("ClassRule.gamma = 0.5", "ClassRule.gamma 0.8 -> 0.5"),
                  "dataclass_method": ("settings.gamma = 0.5", "Settings.gamma 0.8 -> 0.5"),
                  "captured": ("made = decaying(0.5)", "captured `g` 0.8 -> 0.5"),
                  "table": ("TABLE *= 0.5", "reads `TABLE` [1, 0.981633"),
                  "big_table": ("BIG.mul_(0.5)", "reads `BIG`")}
# Each optimizer edit: (the optimizers it applies to, the edit, whether it changes the optimizer, what is named).
OPTIMIZER_EDITS = {"none": (("sgd", "clipped", "wrapped"), "", False, None),
                   "same value again": (("clipped", "wrapped"), "CLIP = 1.0; SCALE = 1.0", False, None),
                   "own attribute": (("clipped", "wrapped"), "CLIP = 0.001; SCALE = 0.25", True, "self."),
                   "wrapped momentum": (("wrapped",), "INNER_MOMENTUM = 0.5", True, "self.inner group 0 momentum")}


def notebook() -> dict:
    namespace = {"__name__": "__main__"}  # a kernel's cells run in __main__: their classes are the user's own
    exec(CELL, namespace)
    return namespace


def train(case_optimizer, case_edit, schedule, edit_schedule, steps):
    namespace, model, twin = notebook(), make_model(), make_model()
    plain = PlainLoop(twin, rows())
    data = TensorDataset(*rows().tensors)
    values = {"optimizer": 0, "FACTOR": 0}  # markers the plain loop reads: a new optimizer / schedule where one moves
    for call, n in enumerate(steps):
        if call == 1:
            _, edit, changes, _ = OPTIMIZER_EDITS[case_edit]
            exec(edit, namespace)
            values["optimizer"] += changes
            if schedule and edit_schedule:
                exec(SCHEDULE_EDITS[schedule][0], namespace)
                values["FACTOR"] += 1
        result = fit(model, data, namespace, case_optimizer, schedule, n)
        plain.train(namespace, case_optimizer, schedule, n, dict(values))
        notes = " | ".join(result.summary.notes)
        if call == 1:
            _, _, changes, named = OPTIMIZER_EDITS[case_edit]
            assert ("new optimizer" in notes) == changes and ("optimizer carried on" in notes) == (not changes), notes
            assert named is None or named in notes, notes
            if schedule and not changes:
                assert ("new schedule" in notes) == edit_schedule and ("schedule carried on" in notes) != \
                    edit_schedule, notes
                assert not edit_schedule or SCHEDULE_EDITS[schedule][1] in notes, notes
        problem = weights_differ(model, twin)
        assert problem is None, f"{problem} after call {call + 1}; notes: {notes}"


def optimizer_cases():
    rng = random.Random(49)
    for edit, (optimizers, *_) in OPTIMIZER_EDITS.items():
        for optimizer, schedule in itertools.product(optimizers, (None, rng.choice(list(SCHEDULE_EDITS)))):
            yield optimizer, edit, schedule, schedule is not None and rng.random() < 0.5, \
                [rng.randint(2, 5) for _ in range(rng.randint(2, 3))]


@pytest.mark.parametrize("optimizer,edit,schedule,edit_schedule,steps", list(optimizer_cases()), ids=str)
def test_an_optimizers_own_attributes_decide_whether_it_carries_on_as_the_plain_loop(optimizer, edit, schedule,
                                                                                     edit_schedule, steps):
    train(optimizer, edit, schedule, edit_schedule, steps)


@pytest.mark.parametrize("schedule,edited", list(itertools.product(SCHEDULE_EDITS, (False, True))))
def test_what_a_schedules_function_reads_decides_whether_it_carries_on_as_the_plain_loop(schedule, edited):
    train("clipped", "none", schedule, edited, [3, 4, 2])


def test_a_changed_global_is_named_with_its_values_not_two_function_reprs():
    from test_edited_values import notebook as cells
    namespace, model, data = cells(), make_model(), rows()
    fit(model, data, namespace, "sgd", "lambda_lr", 2)
    namespace["FACTOR"] = 0.5
    notes = fit(model, data, namespace, "sgd", "lambda_lr", 2).summary.notes
    assert "new schedule: LambdaLR lr_lambdas: reads `FACTOR` 0.8 -> 0.5" in notes, notes


class PointsBack(torch.optim.SGD):
    """A wrapper and its inner optimizer pointing at each other (and at itself)."""

    def __init__(self, params):
        super().__init__(params, lr=0.05)
        self.me, self.inner = self, torch.optim.SGD(self.param_groups, lr=0.05)
        self.inner.outer = self


def test_optimizers_pointing_at_each_other_are_compared_without_end_and_carry_on():
    model, data = make_model(), rows()
    namespace = {"points_back": lambda p: PointsBack(p)}
    fit(model, data, namespace, "points_back", None, 2)
    notes = fit(model, data, namespace, "points_back", None, 2).summary.notes
    assert any(n.startswith("optimizer carried on (same PointsBack") for n in notes), notes

