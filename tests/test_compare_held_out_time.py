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
    slow, fast = _run(0.002, "lr 0.002"), _run(0.05, "lr 0.05")  # a process's first steps are slow: not fast's
    times, losses = held_out_against_time(slow)
    assert len(times) == len(losses) >= 6 and times == sorted(times) and times[-1] > 0
    target = max(losses[-1], held_out_against_time(fast)[1][-1])
    assert time_to_held_out(fast, target) < time_to_held_out(slow, target)  # the data: lr 0.002 learns slower
    comparison = nbtrain.compare(fast, slow)
    cell = comparison.rows[1]["held-out in time"]
    assert cell.startswith(f"held-out {target:,.4g} in ") and ": learns slower in wall time (one run each" in cell, cell
    # one run each: no interval over runs, only the validations around each crossing, and the range they allow
    assert "so no interval over runs: each time known only to within the validations around it (" in cell, cell
    assert cell.endswith("x later)") or cell.endswith("x or more later)"), cell
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


@pytest.mark.slow
def test_compare_gives_held_out_in_time_an_interval_over_the_repeats_of_each_settings_and_no_verdict_to_a_repeat():
    _run(0.01, "warm-up")  # a process's first steps are slow: none of the repeats pays for them
    fast, again = _run(0.05, "fast"), _run(0.05, "fast again")
    slow, slow_again = _run(0.002, "slow"), _run(0.002, "slow again")
    comparison = nbtrain.compare(fast, again, slow, slow_again)
    cells = [row["held-out in time"] for row in comparison.rows]
    # runs 3 and 4 against runs 1 and 2: the range spans every repeat of each side
    for cell in cells[2:]:
        assert ": learns slower in wall time (" in cell and "over 2 and 2 runs of each settings" in cell, cell
        assert "(medians)" in cell, cell
    # run 2 repeats run 1's settings: an A/A, whatever the machine did to their times, never faster or slower
    assert cells[1].startswith("held-out ") and "same settings as fast, so no verdict (one run each" in cells[1]
    assert "faster" not in cells[1] and "slower" not in cells[1], cells[1]
