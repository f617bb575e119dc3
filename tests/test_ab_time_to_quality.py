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
    assert "x sooner (" in text and "over the rounds, each time known to within its evaluations); in samples/s" in text


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
