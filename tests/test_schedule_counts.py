"""schedule_counts (issue 48 item 4): a schedule counted in steps is kept in steps, as written (the default), or,
asked, laid over the samples base_batch_size's steps held; never rescaled unasked. Each case against a plain loop
that does the same by hand: after optimizer step k the schedule has taken floor(k x batch / base) steps, and the
warm-up ramp reads that position."""
import itertools
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain

N, FEATURES, LR, STEPS, BASE = 96, 4, 0.05, 12, 8


def data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, FEATURES, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(N, 1, generator=g))


def written(optimizer):
    """The user's schedule, written for batch BASE in steps: 4 steps of warm-up, then cosine over 20."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / 4 if s < 4 else 0.5 * (1 + math.cos(math.pi * min(s - 4, 20) / 20)))


def model_and_optimizer():
    torch.manual_seed(2)
    model = nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def plain_loop(batch: int, counts: str, scheduled: bool, warmup: int):
    model, optimizer = model_and_optimizer()
    scheduler = written(optimizer) if scheduled else None
    dataset, rates = data(), []
    position = (lambda k: k * batch // BASE) if counts == "samples" else (lambda k: k)
    for step in range(STEPS):
        own = scheduler.get_last_lr() if scheduler else [LR]
        ramp = min(1.0, (position(step) + 1) / warmup) if warmup else 1.0
        for group, lr in zip(optimizer.param_groups, own):
            group["lr"] = lr * ramp
        rates.append(optimizer.param_groups[0]["lr"])
        start = step * batch % N
        x, y = dataset.tensors[0][start:start + batch], dataset.tensors[1][start:start + batch]
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for group, lr in zip(optimizer.param_groups, own):
            group["lr"] = lr
        for _ in range(position(step + 1) - position(step)) if scheduler else ():
            scheduler.step()
    return model, rates


def with_nbtrain(batch: int, counts: str, scheduled: bool, warmup: int):
    model, optimizer = model_and_optimizer()
    result = nbtrain.fit(model, data(), loss_fn=nn.MSELoss(), optimizer=optimizer,
                         scheduler=written if scheduled else None, scheduler_interval="step" if scheduled else None,
                         batch_size=batch, base_batch_size=BASE, schedule_counts=counts, max_steps=STEPS,
                         warmup_steps=warmup, shuffle=False, accelerator="cpu", log_every_n_steps=STEPS)
    return model, list(result.log.columns["lr"])


CASES = [(b, c, s, w) for b, c, (s, w) in itertools.product((32, 4, 12), ("steps", "samples"),
                                                               ((True, 0), (False, 6), (True, 3)))]


@pytest.mark.parametrize("batch, counts, scheduled, warmup", CASES)
def test_a_step_counted_schedule_trains_as_the_plain_loop_in_steps_or_laid_over_samples(batch, counts, scheduled,
                                                                                         warmup):
    trained, rates = with_nbtrain(batch, counts, scheduled, warmup)
    reference, expected = plain_loop(batch, counts, scheduled, warmup)
    assert rates == expected, f"rates {rates}\nplain  {expected}"
    for (key, a), b in zip(trained.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{key} differs by {(a - b).abs().max().item():.3g}"


def test_laid_over_samples_the_schedule_reaches_further_at_a_larger_batch_and_steps_is_the_default():
    _, in_steps = with_nbtrain(32, "steps", True, 0)
    _, over_samples = with_nbtrain(32, "samples", True, 0)
    assert in_steps[:4] == pytest.approx([LR * (s + 1) / 4 for s in range(4)])  # 4 steps of warm-up, as written
    assert over_samples[1] == pytest.approx(LR)  # batch 32 = 4 steps of batch 8: the warm-up is over after one step
    assert nbtrain.TrainConfig().schedule_counts == "steps"


def test_samples_without_base_batch_size_is_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"schedule_counts.*samples.*needs base_batch_size"):
        nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), schedule_counts="samples", max_steps=1)
    with pytest.raises(ValueError, match=r"schedule_counts='epochs': one of steps, samples"):
        nbtrain.fit(nn.Linear(FEATURES, 1), data(), loss_fn=nn.MSELoss(), schedule_counts="epochs", max_steps=1)
