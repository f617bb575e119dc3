"""The user's LR schedule is stepped as written (issue 37, items 1, 2 and 14).

Every scheduler class in torch.optim.lr_scheduler, given as a factory and as an object, with and without
an LR rule (scale_lr, lr=) and a warm-up, stepped every optimizer step, every epoch and by default, trains
in nbtrain bit for bit as a plain hand-written loop stepping the same schedule the same way: the same rate
at every step, the same weights. Where a rule is asked for, the plain loop writes the schedule the way a
person would for the scaled rate: its optimizer's rates and every rate written in the scheduler's
arguments times the rule's factor (a power of two here, so scaling a built schedule and building a scaled
one agree to the last bit).
"""
from __future__ import annotations

import inspect
import itertools

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain.config import TrainConfig

N, BATCH, STEPS, FEATURES = 16, 4, 12, 3  # 4 steps an epoch: an epoch-stepped schedule steps 3 times
LR = 0.1

# How each scheduler is written for rates `k` times the optimizer's (k=1: as the user wrote it).
WRITTEN = {
    "LambdaLR": lambda o, k: S.LambdaLR(o, lambda epoch: 1 / (1 + epoch)),
    "MultiplicativeLR": lambda o, k: S.MultiplicativeLR(o, lambda epoch: 0.8),
    "StepLR": lambda o, k: S.StepLR(o, step_size=3, gamma=0.5),
    "MultiStepLR": lambda o, k: S.MultiStepLR(o, milestones=[2, 5], gamma=0.3),
    "ConstantLR": lambda o, k: S.ConstantLR(o, factor=0.25, total_iters=3),
    "LinearLR": lambda o, k: S.LinearLR(o, start_factor=0.25, total_iters=5),
    "ExponentialLR": lambda o, k: S.ExponentialLR(o, gamma=0.7),
    "PolynomialLR": lambda o, k: S.PolynomialLR(o, total_iters=10, power=2.0),
    "CosineAnnealingLR": lambda o, k: S.CosineAnnealingLR(o, T_max=7, eta_min=0.01 * k),
    "ChainedScheduler": lambda o, k: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=3),
                                                         S.ExponentialLR(o, gamma=0.9)], optimizer=o),
    "SequentialLR": lambda o, k: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=3),
                                                    S.CosineAnnealingLR(o, T_max=8, eta_min=0.005 * k)], milestones=[3]),
    # never "better" (threshold 1): it halves the rate at each validation, down to min_lr
    "ReduceLROnPlateau": lambda o, k: S.ReduceLROnPlateau(o, factor=0.5, patience=0, threshold=1.0,
                                                          min_lr=0.03 * k, eps=1e-8 * k),
    "CyclicLR": lambda o, k: S.CyclicLR(o, base_lr=0.01 * k, max_lr=0.1 * k, step_size_up=3),
    "OneCycleLR": lambda o, k: S.OneCycleLR(o, max_lr=0.5 * k, total_steps=STEPS),
    "CosineAnnealingWarmRestarts": lambda o, k: S.CosineAnnealingWarmRestarts(o, T_0=3, eta_min=0.01 * k),
}
COUNTS_STEPS = {"CyclicLR", "OneCycleLR"}  # stepped every optimizer step by default; the others every epoch
# The rule asked for, as options, and its factor: scale_lr (global batch 4 vs 2), lr= over the optimizer's.
RULES = {"none": ({}, 1.0), "scale_lr": ({"scale_lr": "linear", "base_batch_size": 2}, 2.0),
         "lr": ({"lr": LR / 2}, 0.5)}


def scheduler_classes() -> set[str]:
    """Every scheduler torch.optim.lr_scheduler offers that is built over an optimizer."""
    return {name for name, cls in inspect.getmembers(S, inspect.isclass)
            if issubclass(cls, S.LRScheduler) and cls.__module__ == S.__name__ and not name.startswith("_")
            and cls is not S.LRScheduler}


def test_every_scheduler_class_of_torch_has_a_case():
    assert scheduler_classes() == set(WRITTEN), "write a case for each new scheduler class in WRITTEN"


def cases():
    """Each class in each form and interval, the rules and warm-ups turning over between them."""
    for c, name in enumerate(sorted(WRITTEN)):
        for j, (form, interval) in enumerate(itertools.product(("factory", "object"), ("step", "epoch", None))):
            yield name, form, interval, list(RULES)[(c + j) % 3], (0, 3)[(c + j // 3 + j) % 2]


def data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, FEATURES, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(N, 1, generator=g))


def held_out():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(8, FEATURES, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def model_and_optimizer(k: float = 1.0):
    torch.manual_seed(2)
    model = nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=LR * k, momentum=0.9)


def plain_loop(name: str, interval: str, k: float, warmup: int):
    """What a person writes by hand: the schedule stepped after each batch or each epoch, a linear warm-up
    multiplying its rate by (step + 1) / warmup, ReduceLROnPlateau stepped on the held-out loss."""
    model, optimizer = model_and_optimizer(k)
    scheduler = WRITTEN[name](optimizer, k)
    dataset, rates = data(), []
    x_val, y_val = held_out().tensors
    for step in range(STEPS):
        scheduled = scheduler.get_last_lr()
        for group, lr in zip(optimizer.param_groups, scheduled):
            group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        rates.append(optimizer.param_groups[0]["lr"])
        start = step * BATCH % N
        x, y = dataset.tensors[0][start:start + BATCH], dataset.tensors[1][start:start + BATCH]
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for group, lr in zip(optimizer.param_groups, scheduled):
            group["lr"] = lr  # the schedule's own rate back, without the ramp
        end_of_epoch = (step + 1) * BATCH % N == 0
        if name == "ReduceLROnPlateau":
            if (interval == "step" and (step + 1) % 3 == 0) or (interval != "step" and end_of_epoch):
                with torch.no_grad():
                    scheduler.step(nn.functional.mse_loss(model(x_val), y_val).item())
        elif interval == "step" or (interval is None and name in COUNTS_STEPS):
            scheduler.step()
        elif end_of_epoch:
            scheduler.step()
    return model, rates


def with_nbtrain(name: str, form: str, interval: str | None, rule: str, warmup: int):
    model, optimizer = model_and_optimizer()
    scheduler = WRITTEN[name](optimizer, 1.0) if form == "object" else (lambda o: WRITTEN[name](o, 1.0))
    optimizer = optimizer if form == "object" else (lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9))
    held = {"val_data": held_out(), "monitor": "val_loss", "mode": "min"} if name == "ReduceLROnPlateau" else {}
    if held and interval == "step":
        held["val_every_n_steps"] = 3  # a plateau schedule steps after each validation: every 3 steps here
    result = nbtrain.fit(model, data(), loss_fn=nn.MSELoss(), optimizer=optimizer, scheduler=scheduler,
                         scheduler_interval=None if name == "ReduceLROnPlateau" else interval, batch_size=BATCH,
                         max_steps=STEPS, warmup_steps=warmup, shuffle=False, accelerator="cpu",
                         log_every_n_steps=STEPS, **RULES[rule][0], **held)
    return model, list(result.log.columns["lr"]), result


@pytest.mark.parametrize("name, form, interval, rule, warmup", list(cases()),
                         ids=lambda v: str(v) if v is not None else "default")
def test_every_scheduler_trains_as_the_plain_loop_stepping_it_as_written(name, form, interval, rule, warmup):
    trained, rates, result = with_nbtrain(name, form, interval, rule, warmup)
    reference, expected = plain_loop(name, interval, RULES[rule][1], warmup)
    assert rates == expected, f"rates {rates}\nplain  {expected}\n{result.summary.lr_note}"
    for (key, a), b in zip(trained.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{key} differs by {(a - b).abs().max().item():.3g}"
    rescaled = [n for n in result.summary.notes if "schedule rescaled" in n]
    assert bool(rescaled) == (rule != "none"), result.summary.notes  # said only where a rule was asked


# --- what the summary says, and the default interval ---------------------------------------------------


def test_a_steplr_given_without_an_interval_steps_once_an_epoch_and_the_summary_says_why():
    result = nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), shuffle=False, batch_size=BATCH,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
                         scheduler=lambda o: S.StepLR(o, step_size=1, gamma=0.5), max_epochs=3, accelerator="cpu")
    assert list(result.log.columns["lr"]) == [0.05] * 4 + [0.025] * 4 + [0.0125] * 4
    assert "then StepLR every epoch (by default" in result.summary.lr_note
    assert not [n for n in result.summary.notes if "collapsed" in n]


def test_a_one_cycle_schedule_given_without_an_interval_steps_every_optimizer_step():
    result = nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), shuffle=False, batch_size=BATCH,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), accelerator="cpu",
                         scheduler=lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=20), max_steps=8)
    lrs = list(result.log.columns["lr"])
    assert lrs[0] == pytest.approx(0.02) and lrs[5] == pytest.approx(0.5)  # max_lr / 25, then the peak
    assert "then OneCycleLR every step (by default: OneCycleLR counts optimizer steps)" in result.summary.lr_note


def test_a_rate_that_collapses_within_a_run_is_warned_of_once():
    result = nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), shuffle=False, batch_size=BATCH,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.05), scheduler_interval="step",
                         scheduler=lambda o: S.StepLR(o, step_size=1, gamma=0.5), max_epochs=10, accelerator="cpu")
    collapsed = [n for n in result.summary.notes if "collapsed" in n]
    assert len(collapsed) == 1 and "at step 21, under a millionth of the 0.05" in collapsed[0], collapsed
    assert "StepLR every step (as given)" in collapsed[0]


def test_a_given_interval_wins_over_the_default():
    result = nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), shuffle=False, batch_size=BATCH,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), scheduler_interval="epoch",
                         scheduler=lambda o: S.CyclicLR(o, 0.01, 0.1, step_size_up=4), max_steps=8, accelerator="cpu")
    assert list(result.log.columns["lr"]) == pytest.approx([0.01] * 4 + [0.0325] * 4)
    assert "then CyclicLR every epoch (as given)" in result.summary.lr_note


def test_a_schedule_without_a_rule_asked_for_is_never_rescaled():
    """The issue's case: warm-up then cosine trained at 10x its rates, with a note of a rule no one gave."""
    optimizer = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    scheduler = lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=4),  # noqa: E731
                                             S.CosineAnnealingLR(o, T_max=12)], milestones=[4])
    result = nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), optimizer=optimizer,
                         scheduler=scheduler, scheduler_interval="step", max_steps=16, batch_size=BATCH,
                         shuffle=False, accelerator="cpu")
    lrs = list(result.log.columns["lr"])
    assert lrs[0] == pytest.approx(0.01) and max(lrs) == pytest.approx(0.1)
    assert not [n for n in result.summary.notes if "rescaled" in n]


# --- the warm-up: what the texts say is what the ramp does ----------------------------------------------


def test_the_warm_up_ramp_starts_at_one_over_w_of_the_rate_as_every_text_says():
    result = nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), shuffle=False, batch_size=BATCH,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1), scale_lr="linear", base_batch_size=2,
                         warmup_steps=4, max_steps=6, accelerator="cpu")
    assert list(result.log.columns["lr"]) == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])  # 0.2 = 0.1 x 2
    help_text = TrainConfig.__dataclass_fields__["warmup_steps"].metadata["option"].help
    for text in (help_text, result.summary.lr_note):
        assert "from 1/" in text and "from the base" not in text, text
