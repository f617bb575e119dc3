"""%nbtrain_compare says which run reaches a held-out loss sooner in wall time (issue 48, rule 11)."""
import pytest
import torch
from torch import nn

import nbtrain
from nbtrain.runs.held_out_time import held_out_against_time, time_to_held_out

from nbtrain.demo import DigitsDataset


def _run(lr, name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return nbtrain.fit(model, DigitsDataset(), val_data=DigitsDataset(train=False), loss_fn=nn.CrossEntropyLoss(),
                       lr=lr, val_every_n_steps=5, max_steps=30, batch_size=32, name=name)


@pytest.mark.slow
def test_compare_says_a_run_that_learns_slower_per_second_learns_slower_and_why_samples_per_s_does_not_say_it():
    fast, slow = _run(0.05, "lr 0.05"), _run(0.002, "lr 0.002")
    times, losses = held_out_against_time(slow)
    assert len(times) == len(losses) >= 6 and times == sorted(times) and times[-1] > 0
    target = max(losses[-1], held_out_against_time(fast)[1][-1])
    assert time_to_held_out(fast, target) < time_to_held_out(slow, target)  # the data: lr 0.002 learns slower
    comparison = nbtrain.compare(fast, slow)
    cell = comparison.rows[1]["held-out in time"]
    assert cell.startswith(f"held-out {target:,.4g} in ") and ": learns slower in wall time (one run each" in cell, cell
    assert comparison.rows[0]["held-out in time"] == "-"
    assert any(n.startswith("lr 0.002 changes what is learned (lr)") for n in comparison.notes), comparison.notes
    assert "held-out in time" in comparison.table()


def test_runs_without_held_out_data_have_no_such_column_and_are_told_to_give_val_data():
    from helpers import regression_data
    a = nbtrain.fit(nn.Linear(8, 1), regression_data(), loss_fn=nn.MSELoss(), max_steps=3, lr=0.01)
    b = nbtrain.fit(nn.Linear(8, 1), regression_data(), loss_fn=nn.MSELoss(), max_steps=3, lr=0.001)
    comparison = nbtrain.compare(a, b)
    assert "held-out in time" not in comparison.rows[0]
    assert any("give val_data to both runs" in n for n in comparison.notes), comparison.notes
