"""max_time (issue 48 D): a wall-time budget per call, as Lightning's Trainer(max_time=...): two configs trained for
equal time are one line each, and what the run trained is what a plain loop trains in as many steps."""
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nbtrain
from nbtrain import ConfigError, TrainConfig


def regression(seed=0, n=512):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g))


@pytest.mark.parametrize("batch_size, accumulate", [(8, 1), (16, 2)])
def test_a_run_ends_at_its_max_time_on_a_step_boundary_as_a_plain_loop_of_as_many_steps(batch_size, accumulate):
    data = regression()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    twin = nn.Linear(8, 1)
    twin.load_state_dict(model.state_dict())
    t0 = time.perf_counter()
    result = nbtrain.fit(model, data, loss_fn=nn.MSELoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
                         batch_size=batch_size, accumulate_grad_batches=accumulate, shuffle=False, max_epochs=10**6,
                         max_time=0.5, accelerator="cpu")
    wall = time.perf_counter() - t0
    steps = result.summary.steps
    assert result.status == "completed" and 0 < steps < 10**6 and wall < 30, (result.status, steps, wall)
    assert any(note.startswith(f"ended at max_time=0.5 s, after {steps} steps") for note in result.summary.notes)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.01)  # the plain loop, the same order, as many steps
    done, batches = 0, 0
    while done < steps:
        for x, y in DataLoader(data, batch_size=batch_size):
            (nn.functional.mse_loss(twin(x), y) / accumulate).backward()
            batches += 1
            if batches % accumulate == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done += 1
                if done == steps:
                    break
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_a_later_call_without_max_time_trains_its_whole_budget_and_says_nothing_of_it():
    data, model = regression(), nn.Linear(8, 1)
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), batch_size=8, max_epochs=10**6, max_time=0.2, accelerator="cpu")
    again = nbtrain.fit(model, data, loss_fn=nn.MSELoss(), batch_size=8, max_steps=3, accelerator="cpu")
    assert again.summary.steps == 3 and not any("max_time" in n for n in again.summary.notes)


def test_max_time_must_be_a_positive_number_of_seconds():
    with pytest.raises(ConfigError, match=r"max_time=0: a number > 0, or None \(no time limit\)"):
        TrainConfig(max_time=0)
    assert TrainConfig(max_time=2.5).max_time == 2.5 and TrainConfig().max_time is None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ddp_ranks_end_together_at_max_time_as_one_plain_loop():
    # No rank stops on its own clock (the other would wait in an all-reduce): a rank past its max_time votes, and
    # every rank ends at the same step boundary.
    from test_ddp_across_calls import DATA, linear, plain_loop, sgd_momentum, step_lr
    model, twin = linear(), linear()
    result = nbtrain.fit(model, DATA, loss_fn=nn.CrossEntropyLoss(), optimizer=sgd_momentum, scheduler=step_lr,
                         scheduler_interval="step", devices=2, batch_size=4, max_epochs=10**6, max_time=1.0,
                         shuffle=False, log_every_n_steps=1, accelerator="cpu")
    steps = result.summary.steps
    assert result.status == "completed" and steps > 0, (result.status, result.message)
    assert any(note.startswith("ended at max_time=1 s") for note in result.summary.notes), result.summary.notes
    plain_loop(twin, [(2, 4, steps)])
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a, b)
