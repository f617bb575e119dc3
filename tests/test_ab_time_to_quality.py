"""nbtrain.ab gives, beside its equal-time held-out reading, the time each side took to reach the worse side's final
held-out loss, over its rounds, each time known to within the evaluations around it (issue 48)."""
import math

import pytest
import torch
from torch import nn
from torch.utils.data import Subset

import nbtrain
from nbtrain.measure.learned import reached, reaching

from helpers import regression_data, same_weights, weights


def _ab(b, a=None, learn_s=0.8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    before = weights(model)
    data = regression_data(n=384)
    sgd = torch.optim.SGD(model.parameters(), lr=0.002)
    result = nbtrain.ab(model, Subset(data, range(256)), loss_fn=nn.MSELoss(), optimizer=sgd,
                        val_data=Subset(data, range(256, 384)), a=a or {}, b=b, block_steps=5, min_pairs=2,
                        max_pairs=2, learn_s=learn_s)
    assert same_weights(before, weights(model))  # the user's model is given back as it was
    return result


@pytest.mark.slow
def test_ab_says_b_reaches_the_worse_final_loss_sooner_where_its_rate_learns_faster_in_wall_time():
    # SGD at 0.05 against 0.0005, stepping as fast: B is at A's final loss (still falling) in a fraction of A's time
    result = _ab({"lr": 0.05}, a={"lr": 0.0005})
    reach = result.learned.reaching()
    assert reach is not None and len(reach.targets) == 3, result.text()
    assert reach.measurable and reach.verdict.low > 1.5, result.text()  # even each round's slowest bracket
    for (a_low, a_high, a_at), (b_low, b_high, b_at) in zip(reach.current, reach.candidate):
        assert a_low <= a_at <= a_high and b_low <= b_at <= b_high and b_high < a_low
    text = result.text()
    assert "; to the worse side's final held-out " in text and "(medians of 3 rounds); B " in text, text
    # each time between two evaluations, or B there by its first evaluation (its time anywhere under it): the bound
    assert ("; B at least " in text and "x sooner (in 3 rounds: A took " in text and "first evaluation" in text
            or "x sooner (" in text and "over the rounds, each time known to within its evaluations); in samples/s"
            in text) and "or more" not in text, text


@pytest.mark.slow
def test_ab_of_a_change_that_learns_the_same_says_no_measurable_difference_in_the_time_to_the_loss():
    # An A/A of what is learned: B names the rate the user's optimizer already has (a change of config that changes
    # no update, so it is raced); clipping at a norm never reached would not do: it costs a norm a step
    result = _ab({"lr": 0.002})
    reach = result.learned.reaching()
    assert reach is not None and not reach.measurable, result.text()
    assert reach.verdict.low <= 1 <= reach.verdict.high, result.text()  # the interval spans 1
    assert "no measurable difference in that time (A's over B's " in result.text(), result.text()


def test_ab_with_learn_s_0_races_nothing_and_says_what_it_learns_was_not_measured():
    result = _ab({"lr": 0.05}, learn_s=0)
    assert not result.learned.measured and result.learned.reaching() is None
    assert result.text().startswith("lr=0.05: what it learns was not measured: not raced (learn_s=0); in samples/s")


def test_ab_refuses_a_negative_learn_s_naming_it_and_what_is_allowed():
    with pytest.raises(Exception) as refused:
        _ab({"lr": 0.05}, learn_s=-1)
    assert "learn_s=-1" in str(refused.value) and ">= 0" in str(refused.value), str(refused.value)


def test_the_time_to_a_loss_is_bracketed_by_the_evaluations_around_it_and_a_side_diverged_gives_none():
    a = [(0.25 * i, 2.0 - 0.1 * i) for i in range(1, 5)]   # slow: 1.6 at 1 s
    b = [(0.25 * i, 2.0 - 0.3 * i) for i in range(1, 5)]   # fast: below 1.6 by 0.5 s
    assert reached(a, 1.6, start=2.0) == pytest.approx((0.75, 1.0, 1.0))
    assert reached(b, 1.6, start=2.0) == pytest.approx((0.25, 0.5, 1 / 3))  # the crossing, linear in the loss
    assert reached(b, 1.6) == reached(b, 1.6, start=2.0) and reached(a, 0.5) is None
    assert reached(a, 2.5, start=2.0) == (0.0, 0.0, 0.0)  # there before training
    fast = reaching([(a, b)] * 3, start=2.0)
    assert fast.verdict.ratio == pytest.approx(3) and (fast.verdict.low, fast.verdict.high) == pytest.approx((1.5, 4))
    assert fast.measurable and reaching([(b, a)] * 3, start=2.0).verdict.high == pytest.approx(1 / 1.5)
    same = reaching([(a, a)] * 3, start=2.0)
    assert not same.measurable and same.verdict.low < 1 < same.verdict.high
    assert reaching([(a, [(1.0, math.nan)])], start=2.0) is None


def test_times_both_known_only_to_lie_under_a_first_evaluation_are_said_not_to_be_told_apart():
    # Both sides below the target at their first evaluation (0.25 s): each time lies anywhere in 0-0.25 s, so the
    # ratio's range is 0 to unbounded; the verdict says so in words, not as "0.00 or more".
    quick = [(0.25 * i, 0.5) for i in range(1, 5)]  # at its final loss from the first evaluation on
    both = reaching([(quick, quick)] * 3, start=2.0)
    assert not both.measurable and both.verdict.low == 0 and math.isinf(both.verdict.high)
    text = both.text()
    assert text.endswith("no measurable difference in that time (each side was there by its first evaluation in a "
                         "round, so their times cannot be told apart)"), text
    assert "or more" not in text and "0.00" not in text, text


# Evaluations at these seconds, from a start of 2.5 at 0 s. Reaching 0.9 (slow's and mid's final, the worse side's):
# slow between its evaluations at 3 and 4 s, mid at 2-3 s, "quick again" at 0.5-1 s; quick and late were at or below
# it by their first evaluation, at 0.5 s and 2.5 s: each time only known to lie between 0 and that evaluation's, so
# any ratio with it is open (0 below, or no bound above).
START = 2.5
SLOW = [(1.0, 2.0), (2.0, 1.5), (3.0, 1.0), (4.0, 0.9)]
MID = [(1.0, 2.0), (2.0, 1.0), (3.0, 0.9)]
QUICK = [(0.5, 0.85), (1.0, 0.8), (2.0, 0.7)]
QUICK_AGAIN = [(0.5, 0.95), (1.0, 0.86), (2.0, 0.8)]
LATE = [(2.5, 0.85), (3.0, 0.8)]


def _tail(pairs):
    """What Reaching.text says after its head (the medians), for these rounds of (A's curve, B's curve)."""
    text = reaching(pairs, start=START).text()
    assert "(medians of " in text and "or more" not in text and "0.00" not in text, text
    return text.split(" rounds); ", 1)[1] if " rounds); " in text else text.split(" round); ", 1)[1]


def test_a_side_there_by_its_first_evaluation_is_said_so_and_sooner_or_later_only_by_the_bound_its_brackets_give():
    # B there by 0.5 s every round, A at 3-4 s: at least 3 / 0.5 = 6x sooner, and no bound above
    assert _tail([(SLOW, QUICK)] * 3) == (
        "B at least 6x sooner (in 3 rounds: A took 3-4 s, B was there by its first evaluation each time (by 0.5 s))")
    assert _tail([(QUICK, SLOW)] * 3) == (  # the other way round: at least 6x later
        "B at least 6x later (in 3 rounds: A was there by its first evaluation each time (by 0.5 s), B took 3-4 s)")
    assert _tail([(SLOW, QUICK)]) == (
        "B at least 6x sooner (in 1 round: A took 3-4 s, B was there by its first evaluation (at 0.5 s))")
    assert reaching([(SLOW, QUICK)] * 3, start=START).measurable


def test_a_side_there_by_its_first_evaluation_beside_a_time_its_bracket_overlaps_cannot_be_told_apart():
    # late: 0-2.5 s, mid: 2-3 s; it read "A's over B's 0.80 or more" and "A's over B's 0.00-1.25"
    assert _tail([(MID, LATE)] * 3) == (
        "no measurable difference in that time (in 3 rounds: A took 2-3 s, B was there by its first evaluation each "
        "time (by 2.5 s), so their times cannot be told apart)")
    assert _tail([(LATE, MID)] * 3) == (
        "no measurable difference in that time (in 3 rounds: A was there by its first evaluation each time (by 2.5 s), "
        "B took 2-3 s, so their times cannot be told apart)")
    # brackets that part by less than MIN_EFFECT: late 0-2.5 s, near 2.525-3.03 s (at least 1.01x)
    near = [(2.525, 1.0), (3.03, 0.9)]
    assert not reaching([(LATE, near)] * 3, start=START).measurable
    assert _tail([(LATE, near)] * 3) == (
        "no measurable difference in that time (in 3 rounds: A was there by its first evaluation each time (by 2.5 s), "
        "B took 2.5-3 s, so their times cannot be told apart by more than 2%)")


def test_rounds_where_a_side_was_there_by_its_first_evaluation_in_some_keep_the_bound_every_round_gives():
    # B by its first evaluation (0.5 s) in two rounds, at 0.5-1 s in the third; A at 3-4 s: at least 3 / 1 = 3x sooner
    assert _tail([(SLOW, QUICK), (SLOW, QUICK_AGAIN), (SLOW, QUICK)]) == (
        "B at least 3x sooner (in 3 rounds: A took 3-4 s, B took up to 1 s, there by its first evaluation in 2 of "
        "them)")
    # B by its first evaluation (2.5 s) in one round, at 0.5-1 s in two; A at 2-3 s: the open round overlaps
    assert _tail([(MID, QUICK_AGAIN), (MID, LATE), (MID, QUICK_AGAIN)]) == (
        "no measurable difference in that time (in 3 rounds: A took 2-3 s, B took up to 2.5 s, there by its first "
        "evaluation in 1 of them, so their times cannot be told apart)")
    # each side by its first evaluation in a round of its own: nothing bounds the ratio either way
    assert _tail([(SLOW, QUICK), (QUICK, SLOW), (SLOW, QUICK)]).endswith(
        "(each side was there by its first evaluation in a round, so their times cannot be told apart)")


def test_times_each_bracketed_by_two_evaluations_read_as_the_ratio_and_its_range_over_the_rounds():
    a = [(0.25 * i, 2.0 - 0.1 * i) for i in range(1, 5)]
    b = [(0.25 * i, 2.0 - 0.3 * i) for i in range(1, 5)]
    head = "to the worse side's final held-out 1.6: A {} s, B {} s (medians of 3 rounds); "
    known = " over the rounds, each time known to within its evaluations)"
    assert reaching([(a, b)] * 3, start=2.0).text() == head.format(1, 0.33) + "B 3x sooner (1.50-4.00" + known
    assert reaching([(b, a)] * 3, start=2.0).text() == head.format(0.33, 1) + "B 3x later (1.50-4.00" + known
    assert reaching([(a, a)] * 3, start=2.0).text() == (
        head.format(1, 1) + "no measurable difference in that time (A's over B's 0.75-1.33" + known)
