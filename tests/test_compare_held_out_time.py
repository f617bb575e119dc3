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
    # one run each: no interval over runs, only the validations around each crossing, and the range they allow (or,
    # where lr 0.05 was there by its first validation, what is known of its time and the bound the other's gives)
    assert ("so no interval over runs: each time known only to within the validations around it (" in cell
            or "so no interval over runs: this one took " in cell and "was there by its first validation" in cell), cell
    assert cell.endswith("x later)") and "or more" not in cell, cell
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


def _validated(name, held_out, seconds_per_step=0.1, workload=None, batch=64):
    """A run of `seconds_per_step` steps whose validations gave `held_out` ({step: held-out loss}); its summary made
    the way a real run's is. Runs with one `workload` digest and batch are repeats of one settings."""
    from nbtrain.config import TrainConfig
    from nbtrain.metrics import MetricsLog
    from nbtrain.runs.result import RunResult, summarize
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 1}, "info": {"samples_start": 0}})
    steps = list(range(1, max(held_out) + 1))
    log.emit({"type": "steps", "rows": {"step": steps, "samples": [batch * s for s in steps],
                                        "time": [seconds_per_step * s for s in steps], "loss": [1.0] * len(steps),
                                        "lr": [0.1] * len(steps)}})
    for step, loss in sorted(held_out.items()):
        log.emit({"type": "epoch", "epoch": 0, "step": step, "partial": True, "val_loss": loss})
    summary = summarize(log, {}).replace(workload=workload)
    return RunResult(TrainConfig(batch_size=batch), log, summary, name=name)


# 0.1 s a step. Reaching 0.9 (slow's final, the worse): slow between its validations at 3 and 4 s, mid at 2-3 s;
# quick and late were at or below it by their first validation, at 0.5 s and at 2.5 s: each time only known to lie
# between 0 and that validation's, so any ratio with it is open (0 below, or no bound above).
SLOW = {10: 2.0, 20: 1.5, 30: 1.0, 40: 0.9}
QUICK = {5: 0.85, 10: 0.8, 20: 0.7}
LATE = {25: 0.85, 30: 0.8}
MID = {10: 2.0, 20: 1.0, 30: 0.9}


def _cell(base, run):
    return nbtrain.compare(base, run).rows[1]["held-out in time"]


def _no_open_ratio(cell):
    """No ratio reads as a bound it is not: '0x or more', '0-3.8x', 'Nx or more later'."""
    assert "or more" not in cell and "0x" not in cell and " 0-" not in cell and "(0-" not in cell, cell


def test_a_run_there_by_its_first_validation_is_said_so_and_sooner_only_by_the_bound_its_brackets_give():
    slow, quick = _validated("slow", SLOW), _validated("quick", QUICK)
    cell = _cell(slow, quick)  # quick: 0-0.5 s, slow 3-4 s: at least 3 / 0.5 = 6x sooner, no bound above
    assert cell == ("held-out 0.9 in 0.5 s vs 4 s for slow: learns faster in wall time (one run each, so no interval "
                    "over runs: this one was there by its first validation (at 0.5 s), slow took 3-4 s: at least 6x "
                    "sooner)"), cell
    cell = _cell(quick, slow)  # the other way round: 3 / 0.5, at least 6x later
    assert cell == ("held-out 0.9 in 4 s vs 0.5 s for quick: learns slower in wall time (one run each, so no interval "
                    "over runs: this one took 3-4 s, quick was there by its first validation (at 0.5 s): at least 6x "
                    "later)"), cell
    for cell in (_cell(slow, _validated("late", LATE)), _cell(_validated("late", LATE), slow)):
        assert "at least 1.2x " in cell and "was there by its first validation (at 2.5 s)" in cell, cell
        _no_open_ratio(cell)


def test_a_run_there_by_its_first_validation_beside_a_time_its_bracket_overlaps_cannot_be_told_apart():
    mid, late = _validated("mid", MID), _validated("late", LATE)  # late: 0-2.5 s, mid: 2-3 s
    assert _cell(mid, late) == (
        "held-out 0.9 in 2.5 s vs 3 s for mid: no measurable difference in wall time (one run each, so no interval "
        "over runs: this one was there by its first validation (at 2.5 s), mid took 2-3 s, so their times cannot be "
        "told apart)")
    assert _cell(late, mid) == (
        "held-out 0.9 in 3 s vs 2.5 s for late: no measurable difference in wall time (one run each, so no interval "
        "over runs: this one took 2-3 s, late was there by its first validation (at 2.5 s), so their times cannot be "
        "told apart)")
    # brackets that part by less than MIN_EFFECT: late 0-2.5 s, this one 2.525-3.03 s (1.01x at least)
    near = _validated("near", {25: 1.0, 30: 0.9}, seconds_per_step=0.101)
    assert _cell(late, near).endswith(
        "(one run each, so no interval over runs: this one took 2.5-3 s, late was there by its first validation (at "
        "2.5 s), so their times cannot be told apart by more than 2%)")


def test_runs_each_there_by_their_first_validation_cannot_be_told_apart():
    a, b = _validated("a", {5: 0.6, 10: 0.55}), _validated("b", {8: 0.62, 16: 0.65})  # at 0.65 by 0.5 s and 0.8 s
    for base, run, mine, theirs in ((a, b, "0.8", "0.5"), (b, a, "0.5", "0.8")):
        cell = _cell(base, run)
        assert cell.endswith(
            f": no measurable difference in wall time (one run each, so no interval over runs: this one was there by "
            f"its first validation (at {mine} s), {base.name} was there by its first validation (at {theirs} s), so "
            f"their times cannot be told apart)"), cell


def test_a_repeat_there_by_its_first_validation_is_the_machines_spread_with_no_open_ratio():
    slow, quick = _validated("slow", SLOW), _validated("quick", QUICK)
    from nbtrain.runs.held_out_time import learned_in_time
    for base, run in ((slow, quick), (quick, slow)):
        cell = learned_in_time(base, run, base.name, repeat=True)
        assert f": same settings as {base.name}, so no verdict (one run each" in cell, cell
        assert "was there by its first validation (at 0.5 s)" in cell and "took 3-4 s" in cell, cell
        assert cell.endswith(": the machine's spread, not a difference of settings)"), cell
        assert not any(word in cell for word in ("faster", "slower", "sooner", "later")), cell
        _no_open_ratio(cell)


def test_repeats_of_each_settings_with_one_there_by_its_first_validation_say_so_and_keep_only_real_bounds():
    # two runs of each settings (one workload and batch each; their steps alike, so their rates are the machine's)
    quick = [_validated("quick", QUICK, workload="q"), _validated("quick again", {5: 0.95, 10: 0.86}, workload="q")]
    slow = [_validated("slow", SLOW, workload="s", batch=32), _validated("slow again", MID, workload="s", batch=32)]
    cells = [row["held-out in time"] for row in nbtrain.compare(*quick, *slow).rows]
    # quick's own repeat, an A/A to quick's worse final 0.86: quick there by its first validation, the other at 0.5-1 s
    assert "same settings as quick, so no verdict (one run each" in cells[1], cells[1]
    assert "this one took 0.5-1 s, quick was there by its first validation (at 0.5 s): the machine's" in cells[1]
    # slow's runs (2-4 s) against quick's (one by its first validation at 0.5 s, one at 0.5-1 s): at least 2x later
    for cell in cells[2:]:
        assert cell.endswith(
            ": learns slower in wall time (over 2 and 2 runs of each settings: the 2 runs of this one's settings took "
            "2-4 s, the 2 runs of quick's settings took up to 1 s, 1 of them there by its first validation: at least "
            "2x later)"), cell
        assert "(medians)" in cell, cell
        _no_open_ratio(cell)
