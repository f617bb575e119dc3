"""A notebook edits a value its optimizer or schedule reads (`LR = 0.01`), then trains again with the same
line: nbtrain trains at the new value, because whether the optimizer and schedule carry on is decided by what
they are (the factory's new one compared, value by value, with what the live one was built as), never by the
factory's object or code. Equal values carry on with their state; other values make a new optimizer or
schedule, and the summary says which values changed. Where a value cannot be compared, nbtrain asks.

The generated cases: optimizer classes (SGD, Adam, AdamW) x the hyperparameter edited between calls (none,
the same value assigned again, lr, momentum/betas, weight decay, a second group's own rate) x one or two param
groups x a schedule reading an edited global (none, StepLR's gamma, LambdaLR's factor), each against a plain
loop that does what the user wrote: a new optimizer (fresh state) and schedule where a value changed, the same
ones where none did. Weights bit for bit at fp32 on the CPU.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain.api import live_engine
from nbtrain.recipe import RecipeError

from helpers import weights_differ

N, FEATURES, CLASSES, BATCH = 40, 5, 3, 8

# What a notebook's cells define: the factories read the notebook's globals (exec'd into one namespace, as
# a kernel's cells are), so assigning a global between calls is the edit a user makes.
CELL = """
import torch
LR, LR2, MOM, WD, GAMMA, FACTOR = 0.1, 0.05, 0.9, 0.0, 0.5, 0.8

def groups(p):
    p = list(p)
    return [{"params": p[:2]}, {"params": p[2:], "lr": LR2}] if TWO_GROUPS else p

sgd = lambda p: torch.optim.SGD(groups(p), lr=LR, momentum=MOM, weight_decay=WD)
adam = lambda p: torch.optim.Adam(groups(p), lr=LR, betas=(MOM, 0.999), weight_decay=WD)
adamw = lambda p: torch.optim.AdamW(groups(p), lr=LR, betas=(MOM, 0.999), weight_decay=WD)
step_lr = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=GAMMA)
lambda_lr = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: FACTOR ** e)
"""


def notebook(two_groups: bool = False) -> dict:
    namespace = {"TWO_GROUPS": two_groups}
    exec(CELL, namespace)
    return namespace


def rows() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, FEATURES, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.4).long())


def make_model() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def fit(model, dataset, namespace, optimizer: str, scheduler: str | None, steps: int):
    result = nbtrain.fit(model, dataset, loss_fn=nn.CrossEntropyLoss(), optimizer=namespace[optimizer],
                         scheduler=namespace[scheduler] if scheduler else None, scheduler_interval="step",
                         max_steps=steps, batch_size=BATCH, shuffle=False, accelerator="cpu", log_every_n_steps=1)
    assert result.status == "completed", result.message
    return result


# --- the plain loop: what the user wrote --------------------------------------------------------


class PlainLoop:
    """One optimizer and schedule that a hand-written loop keeps while their values stay, and makes again
    (fresh) where the user's edit changed one; batches in the data set's order, pass after pass."""

    def __init__(self, model, dataset):
        self.model, self.dataset, self.at = model, dataset, 0
        self.optimizer = self.scheduler = None
        self.made_with: dict = {}

    def train(self, namespace, optimizer: str, scheduler: str | None, steps: int, values: dict) -> None:
        optimizer_values = {k: v for k, v in values.items() if k not in ("GAMMA", "FACTOR")}
        if self.optimizer is None or optimizer_values != self.made_with.get("optimizer"):
            self.optimizer = namespace[optimizer](self.model.parameters())
            self.scheduler = namespace[scheduler](self.optimizer) if scheduler else None
        elif scheduler and values != self.made_with.get("all"):  # a new schedule from the optimizer's own rates
            base = [g["initial_lr"] for g in self.optimizer.param_groups]
            for group, lr in zip(self.optimizer.param_groups, base):
                group["lr"] = lr
                group.pop("initial_lr")
            self.scheduler = namespace[scheduler](self.optimizer)
        self.made_with = {"optimizer": optimizer_values, "all": dict(values)}
        for _ in range(steps):
            x, y = self.dataset[torch.arange(self.at, min(self.at + BATCH, N))]
            self.at = 0 if self.at + BATCH >= N else self.at + BATCH
            nn.functional.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.scheduler is not None:
                self.scheduler.step()


# --- the cases, one by one --------------------------------------------------------------


def test_an_edited_rate_read_by_the_optimizer_factory_trains_at_the_new_rate_with_a_fresh_optimizer():
    namespace, model, twin = notebook(), make_model(), make_model()
    data, plain = rows(), PlainLoop(twin, rows())
    fit(model, data, namespace, "sgd", None, 3)
    plain.train(namespace, "sgd", None, 3, {"LR": 0.1})
    namespace["LR"] = 0.01
    result = fit(model, data, namespace, "sgd", None, 3)
    plain.train(namespace, "sgd", None, 3, {"LR": 0.01})
    assert result.log.columns["lr"] == pytest.approx([0.01] * 3)
    assert "new optimizer: lr 0.1 -> 0.01" in result.summary.notes, result.summary.notes
    assert weights_differ(model, twin) is None, weights_differ(model, twin)


def test_the_same_values_made_again_carry_on_the_optimizer_and_its_momentum():
    namespace, model, twin = notebook(), make_model(), make_model()
    data, plain = rows(), PlainLoop(twin, rows())
    fit(model, data, namespace, "sgd", None, 3)
    namespace["sgd"] = eval("lambda p: torch.optim.SGD(p, momentum=MOM, lr=0.1)", namespace)  # new code, same SGD
    result = fit(model, data, namespace, "sgd", None, 3)
    plain.train(namespace, "sgd", None, 6, {"LR": 0.1})
    assert "optimizer carried on (same SGD, lr 0.1, momentum 0.9)" in result.summary.notes, result.summary.notes
    assert weights_differ(model, twin) is None, weights_differ(model, twin)


def test_an_edited_gamma_read_by_the_scheduler_factory_is_a_new_schedule():
    namespace, model = notebook(), make_model()
    data = rows()
    first = fit(model, data, namespace, "sgd", "step_lr", 4)
    namespace["GAMMA"] = 0.1
    second = fit(model, data, namespace, "sgd", "step_lr", 4)
    assert first.log.columns["lr"] == pytest.approx([0.1, 0.1, 0.05, 0.05])
    assert second.log.columns["lr"] == pytest.approx([0.1, 0.1, 0.01, 0.01])  # a fresh curve at the new gamma
    assert "new schedule: StepLR gamma 0.5 -> 0.1" in second.summary.notes, second.summary.notes
    assert "optimizer carried on (same SGD, lr 0.1, momentum 0.9)" in second.summary.notes


def test_a_cell_run_again_with_a_new_learning_rate_trains_at_it(ip):
    ip.run_cell("import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
                "torch.manual_seed(2)\n"
                "model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))\n"
                "g = torch.Generator().manual_seed(5)\nx = torch.randn(40, 5, generator=g)\n"
                "train_data = TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.4).long())\n"
                "loss_fn = nn.CrossEntropyLoss()\n"
                "optimizer = lambda p: torch.optim.SGD(p, lr=learning_rate, momentum=0.9)\n")
    flags = f"%%nbtrain --max-steps 3 --batch-size {BATCH} --shuffle false --no-plot --no-progress\n"
    ip.run_cell(flags + "learning_rate = 0.1")
    ip.run_cell(flags + "learning_rate = 0.01")
    twin = make_model()
    plain = PlainLoop(twin, rows())
    namespace = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}
    plain.train(namespace, "sgd", None, 3, {"LR": 0.1})
    namespace["sgd"] = lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)
    plain.train(namespace, "sgd", None, 3, {"LR": 0.01})
    assert live_engine(ip.user_ns["model"]).optimizer.param_groups[0]["lr"] == 0.01
    assert weights_differ(ip.user_ns["model"], twin) is None, weights_differ(ip.user_ns["model"], twin)


class Decay:
    """A value of the user's own class whose attributes are computed when read: nbtrain cannot compare it (a plain
    object, whose attributes are its state, is compared: test_optimizer_attributes.py)."""

    def __getattr__(self, name):
        if name == "rate":
            return 0.9
        raise AttributeError(name)


class Slotted:
    """Its state kept in slots, outside any __dict__: nbtrain cannot read it as attributes."""
    __slots__ = ("rate",)

    def __init__(self):
        self.rate = 0.9

    def at(self, epoch):
        return self.rate ** epoch


UNCOMPARABLE = {"computed attribute": (Decay, "lambda e: decay.rate ** e",
                                       "(lr_lambdas reads `decay`, which is a Decay, which nbtrain cannot compare)"),
                "method of a slotted object": (Slotted, "decay.at",
                                               "(lr_lambdas is a Slotted, which nbtrain cannot compare)")}


@pytest.mark.parametrize("kind", list(UNCOMPARABLE))
def test_a_schedule_reading_a_value_nbtrain_cannot_compare_is_asked_about_and_nothing_changes(kind):
    value, function, said = UNCOMPARABLE[kind]
    namespace, model = notebook(), make_model()
    namespace["decay"] = value()
    namespace["decaying"] = eval(f"lambda o: torch.optim.lr_scheduler.LambdaLR(o, {function})", namespace)
    data = rows()
    fit(model, data, namespace, "sgd", "decaying", 3)
    engine = live_engine(model)
    before = (engine.optimizer, engine.schedule, engine.step, [p.clone() for p in model.parameters()])
    with pytest.raises(RecipeError) as asked:
        fit(model, data, namespace, "sgd", "decaying", 3)
    assert str(asked.value).startswith("scheduler: nbtrain cannot tell whether it makes the schedule stepped so far "
                                       + said), str(asked.value)
    assert (engine.optimizer, engine.schedule, engine.step) == before[:3]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before[3]))


# --- generated: optimizer class x the value edited x groups x schedule ----------------------------


EDITS = {"none": {}, "same value again": {"LR": 0.1}, "lr": {"LR": 0.03}, "momentum": {"MOM": 0.8},
         "weight decay": {"WD": 0.01}, "second group's rate": {"LR2": 0.2}}
SCHEDULES = {None: {}, "step_lr": {"GAMMA": 0.25}, "lambda_lr": {"FACTOR": 0.5}}


@dataclass
class Case:
    optimizer: str
    edit: str
    two_groups: bool
    scheduler: str | None
    edit_schedule: bool
    steps: list = field(default_factory=list)

    def __str__(self):
        return (f"{self.optimizer} {'2 groups' if self.two_groups else '1 group'} edit:{self.edit} "
                f"schedule:{self.scheduler}{'(edited)' if self.edit_schedule else ''} steps:{self.steps}")


def cases() -> list[Case]:
    rng = random.Random(37)
    out = []
    for optimizer, edit, two_groups in itertools.product(("sgd", "adam", "adamw"), EDITS, (False, True)):
        if edit == "second group's rate" and not two_groups:
            continue
        scheduler = rng.choice(list(SCHEDULES))
        out.append(Case(optimizer, edit, two_groups, scheduler, scheduler is not None and rng.random() < 0.6,
                        [rng.randint(2, 6) for _ in range(rng.randint(2, 3))]))
    return out


@pytest.mark.parametrize("case", cases(), ids=str)
def test_edited_values_train_as_the_plain_loop_that_makes_a_new_optimizer_only_where_a_value_changed(case):
    namespace, model, twin = notebook(case.two_groups), make_model(), make_model()
    data, plain = rows(), PlainLoop(twin, rows())
    values = {name: namespace[name] for name in ("LR", "LR2", "MOM", "WD", "GAMMA", "FACTOR")}
    for call, steps in enumerate(case.steps):
        if call == 1:  # the edit, between the first and the second call
            edits = {**EDITS[case.edit], **(SCHEDULES[case.scheduler] if case.edit_schedule else {})}
            namespace.update(edits)
            values.update(edits)
        result = fit(model, data, namespace, case.optimizer, case.scheduler, steps)
        plain.train(namespace, case.optimizer, case.scheduler, steps, values if case.two_groups else
                    {k: v for k, v in values.items() if k != "LR2"})
        notes = " | ".join(result.summary.notes)
        if call == 1:
            changed = case.edit not in ("none", "same value again")
            assert ("new optimizer" in notes) == changed and ("optimizer carried on" in notes) == (not changed), notes
            if case.scheduler and not changed:
                assert ("new schedule" in notes) == case.edit_schedule, notes
        problem = weights_differ(model, twin)
        assert problem is None, f"{problem} after call {call + 1} of {case}; notes: {notes}"


def test_the_generated_cases_cover_every_class_edit_and_schedule():
    made = cases()
    assert {c.optimizer for c in made} == {"sgd", "adam", "adamw"} and {c.edit for c in made} == set(EDITS)
    assert {c.scheduler for c in made} == set(SCHEDULES) and any(c.edit_schedule for c in made)


# --- every kind of schedule: what it is, compared (its settings, what it wrote into the groups, its children) --

SCHEDULERS = {
    "OneCycleLR": ("lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=X, total_steps=20)", 0.5, 0.4),
    "CyclicLR": ("lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.01, X, step_size_up=4)", 0.1, 0.2),
    "SequentialLR": ("lambda o: torch.optim.lr_scheduler.SequentialLR(o, [torch.optim.lr_scheduler.LinearLR("
                     "o, start_factor=X, total_iters=4), torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12)], "
                     "milestones=[4])", 0.1, 0.2),
    "ChainedScheduler": ("lambda o: torch.optim.lr_scheduler.ChainedScheduler([torch.optim.lr_scheduler."
                         "ExponentialLR(o, gamma=X), torch.optim.lr_scheduler.StepLR(o, 3)])", 0.9, 0.8),
    "MultiStepLR": ("lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[X, 8])", 2, 4),
    "CosineAnnealingLR": ("lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=X)", 10, 20),
    "PolynomialLR": ("lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=6, power=X)", 1.0, 2.0),
}


@pytest.mark.parametrize("edited", [False, True], ids=["same value", "edited"])
@pytest.mark.parametrize("kind", list(SCHEDULERS))
def test_each_kind_of_schedule_carries_on_while_its_values_stay_and_is_new_when_one_changes(kind, edited):
    source, before, after = SCHEDULERS[kind]
    namespace, model, data = notebook(), make_model(), rows()
    namespace["X"] = before
    namespace["schedule"] = eval(source, namespace)
    fit(model, data, namespace, "sgd", "schedule", 2)
    schedule = live_engine(model).schedule.scheduler
    namespace["X"] = after if edited else type(before)(before)
    notes = fit(model, data, namespace, "sgd", "schedule", 1).summary.notes
    assert (live_engine(model).schedule.scheduler is not schedule) is edited
    assert any(n.startswith("new schedule" if edited else "schedule carried on") for n in notes), notes
