"""The measurement module on synthetic step series (seeded, no wall clock) and on the live model."""
import math

import numpy as np
import pytest
import torch
from torch import nn

import nbtrain
from nbtrain.measure import paired, steady_rate, unpaired
from nbtrain.measure.steady import warmup_length

from helpers import regression_data, same_weights, weights


def series(n=300, step_s=0.01, noise=0.03, warmup=0, seed=0, slow_from=None, slow_factor=1.0):
    rng = np.random.default_rng(seed)
    d = step_s * (1 + noise * rng.standard_normal(n)).clip(0.5)
    if warmup:
        d[:warmup] *= np.linspace(20, 2, warmup)  # lazy init, loader start-up
    if slow_from is not None:
        d[slow_from:] *= slow_factor
    return d, np.full(n, 64.0)


def test_the_warm_up_is_found_and_excluded_from_the_rate():
    d, s = series(warmup=14)
    assert 12 <= warmup_length(d) <= 16
    rate = steady_rate(d, s)
    assert rate.warmup_steps == warmup_length(d) and rate.warmup_s > 14 * 0.01
    assert rate.rate == pytest.approx(6400, rel=0.02)  # 64 samples / 10 ms
    overall = s.sum() / d.sum()
    assert overall < 0.8 * rate.rate  # averaging the warm-up in would understate the speed


def test_a_settled_series_has_no_warm_up():
    d, s = series(warmup=0, seed=3)
    assert warmup_length(d) <= 2


def test_the_interval_covers_the_true_rate_about_95_times_in_100():
    covered = 0
    for seed in range(100):
        d, s = series(seed=seed, noise=0.2)
        rate = steady_rate(d, s, seed=seed)
        true = 64.0 / (0.01 * np.mean((1 + 0.2 * np.random.default_rng(seed).standard_normal(10**5)).clip(0.5)))
        covered += rate.low <= true <= rate.high
    assert covered >= 85


def test_a_noisy_series_says_it_is_too_noisy_to_trust():
    quiet = steady_rate(*series(noise=0.02))
    noisy = steady_rate(*series(noise=0.9, seed=1))
    assert not quiet.wide and "too noisy" not in quiet.text()
    assert noisy.wide and "too noisy to trust" in noisy.text()


def test_a_a_comparisons_find_no_measurable_difference_at_least_19_times_in_20():
    # 95% intervals: about 1 false alarm in 20 is the design; over 400 comparisons at most 6%.
    rng = np.random.default_rng(0)
    calm = 0
    for _ in range(400):
        a = 1000 * (1 + 0.08 * rng.standard_normal(8))
        b = 1000 * (1 + 0.08 * rng.standard_normal(8))
        v = paired(a, b)
        calm += not v.measurable and "no measurable difference" in v.text()
    assert calm >= 376


def test_an_injected_30_percent_slowdown_is_found_with_its_direction_19_times_in_20():
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(400):
        load = 1 + 0.3 * rng.random(8)  # a drifting load falls on both sides of each pair
        a = 1000 / load * (1 + 0.05 * rng.standard_normal(8))
        b = 1000 / 1.3 / load * (1 + 0.05 * rng.standard_normal(8))
        v = paired(a, b)
        found += v.measurable and v.ratio < 1 and "slower" in v.text(name="injected")
    assert found >= 380


def test_an_unpaired_verdict_of_two_identical_runs_is_no_measurable_difference():
    a = steady_rate(*series(seed=4, noise=0.1))
    from nbtrain.measure.steady import block_rates
    v = unpaired(block_rates(*series(seed=4, noise=0.1)), block_rates(*series(seed=5, noise=0.1)))
    assert not v.measurable and math.isfinite(a.rate)


def test_ab_on_the_live_model_leaves_it_exactly_as_it_was_and_gives_a_verdict():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    data = regression_data()
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=2, batch_size=32)
    before = weights(model)
    ticks = iter(range(10**6))
    result = nbtrain.ab(model, data, loss_fn=nn.MSELoss(), a={"batch_size": 32}, b={"batch_size": 32},
                        block_steps=4, min_pairs=2, max_pairs=3, budget_s=5, clock=lambda: float(next(ticks)))
    assert same_weights(before, weights(model))
    assert len(result.rates_a) == len(result.rates_b) >= 2
    assert result.label == "the same config"
    assert "pairs of blocks" in result.text()


def test_ab_stops_when_its_own_clock_says_the_budget_is_spent():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    ticks = iter(range(0, 10**6, 100))  # each reading 100 s later: the budget ends after the first pairs
    result = nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), b={"batch_size": 16}, block_steps=3,
                        min_pairs=10, max_pairs=30, budget_s=50, clock=lambda: float(next(ticks)), learn_s=0)
    assert result.stopped_by == "budget" and len(result.rates_a) == 2
    assert result.label == "batch_size=16"


def test_an_interval_too_wide_to_rule_anything_out_says_too_noisy_not_no_difference():
    from nbtrain.measure.verdict import Verdict
    wide, narrow = Verdict(1.9, 0.62, 11.2, 5), Verdict(1.01, 0.97, 1.04, 8)
    assert wide.too_noisy and not wide.measurable and not wide.above(0.03)
    assert wide.short() == "too noisy to tell (0.62-11.20)"
    assert wide.text("batch 64") == "batch 64: too noisy to tell (95% interval 0.62-11.20)"
    assert not narrow.too_noisy and narrow.short() == "no measurable difference (0.97-1.04)"
    assert not Verdict(1.6, 1.2, 2.1, 5).too_noisy  # wide, but it excludes 1: a measured difference


def test_ab_blocks_last_a_time_not_a_count_of_steps_unless_asked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    # learn_s=0: the blocks' length is the point here, not what each batch learns (test_ab_time_to_quality.py)
    fixed = nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), b={"batch_size": 16}, block_steps=7,
                       min_pairs=2, max_pairs=2, learn_s=0)
    assert fixed.block_steps == (7, 7)
    # A step of this model takes well under a millisecond: a 0.1 s block holds a hundred steps or more,
    # where a fixed 20-step block would last a few milliseconds (all or nothing of a passing load).
    timed = nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), b={"batch_size": 16}, block_s=0.1,
                       min_pairs=2, max_pairs=2, learn_s=0)
    assert min(timed.block_steps) >= 40, timed.block_steps
    with pytest.raises(ValueError, match=r"nbtrain.ab: block_s=0: allowed: a number of seconds > 0"):
        nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), block_s=0)


def test_quantiles_match_numpys_linear_percentiles():
    from nbtrain.measure.steady import _quantiles
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 10, 399, 400):
        values = rng.lognormal(size=n)
        ours = _quantiles(values, (0.025, 0.25, 0.5, 0.75, 0.975))
        assert np.allclose(ours, np.percentile(values, [2.5, 25, 50, 75, 97.5]), rtol=0, atol=1e-12)


def test_the_bootstrap_is_the_moving_block_resampling_written_out_and_its_shared_draws_stay_as_drawn():
    # The draws are made once per (seed, length) and shared by every summary of that length: the rates are still
    # each resample's blocks summed step by step, and one summary cannot change the next one's draws.
    from nbtrain.measure.steady import _RESAMPLES, resampled_rates
    rng = np.random.default_rng(3)
    for n in (6, 7, 30, 31, 97):
        for seed in (0, 1):
            d, s = 1e-3 * rng.lognormal(size=n), rng.integers(1, 9, size=n).astype(float)
            length = max(2, round(math.sqrt(n)))
            picks = np.random.default_rng(seed).integers(0, n - length + 1, size=(_RESAMPLES, math.ceil(n / length)))
            written_out = [sum(s[i:i + length].sum() for i in row) / sum(d[i:i + length].sum() for i in row)
                           for row in picks]
            first = resampled_rates(d, s, seed)
            assert np.allclose(first, written_out, rtol=1e-12, atol=0)
            first[:] = 0.0  # a caller's own array: the shared draws behind it are not touched
            assert np.allclose(resampled_rates(d, s, seed), written_out, rtol=1e-12, atol=0)
            assert repr(steady_rate(d, s, seed=seed)) == repr(steady_rate(list(d), list(s), seed=seed))  # NaN-safe
    assert resampled_rates(np.ones(5), np.ones(5), 0) is None


def test_the_peak_memory_of_a_cpu_run_is_the_kernels_vmhwm_line():
    from nbtrain.engine.memory import _read_hwm
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    before = int(line.split()[1]) * 1024
    assert before <= _read_hwm() <= before + 64 * 2**20  # it only grows, and this test allocates little


def test_the_interval_holds_the_rate_when_a_slow_step_ends_the_series():
    # The last step is drawn by one moving block only: the resampled rates sit above the rate itself.
    for slow in (0.02, 0.05, 0.2):
        r = steady_rate([1e-3] * 30 + [slow], [1] * 31)
        assert r.low <= r.rate <= r.high, r


def test_ab_stops_and_says_so_when_a_timed_block_diverges_instead_of_timing_nan_arithmetic():
    from nbtrain.tools.tool_options import ToolRefusal
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    before = weights(model)
    sgd = lambda p: torch.optim.SGD(p, lr=0.01)  # noqa: E731
    with pytest.raises(ToolRefusal, match=r"^nbtrain.ab: config B \(lr=1000000000000.0\): the loss became (inf|nan) "
                                          r"at step \d+ in a timed block, so no speed is compared; lower the learning rate"):
        nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), optimizer=sgd, b={"lr": 1e12}, block_steps=7,
                   min_pairs=2, max_pairs=2)
    assert same_weights(before, weights(model))
    # Told to continue past a NaN, a run goes on; a comparison of its speed still does not.
    with pytest.raises(ToolRefusal, match=r"config A: the loss became"):
        nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), optimizer=sgd,
                   a={"lr": 1e12, "on_nonfinite_loss": "continue"}, b={}, block_steps=7, min_pairs=2, max_pairs=2)
    assert same_weights(before, weights(model))


def test_two_pairs_of_blocks_print_no_interval_and_say_the_budget_allowed_no_more():
    # A busy laptop's notebook 00 printed "too noisy to tell (95% interval 0.00-46666641476640.16)" from 2 pairs:
    # t's 97.5% point at one degree of freedom is 12.7, and no reader can use such an interval.
    from nbtrain.config import TrainConfig
    from nbtrain.measure.ab import ABResult
    two = paired([1000.0, 10.0], [10.0, 1000.0])
    assert two.pairs == 2 and two.high > 1e6  # the interval the t statistic gives
    assert two.text("batch_size=256") == "batch_size=256: too few pairs to tell (2 pairs of blocks; an interval needs 4)"
    assert two.short() == "too few pairs to tell (2 of 4)" and two.interval_text() == "2 pairs, too few for an interval"
    result = ABResult(TrainConfig(), TrainConfig(batch_size=256), two, [1000.0, 10.0], [10.0, 1000.0], seconds=29,
                      stopped_by="budget")
    assert result.table().endswith("too few pairs to tell (2 pairs of blocks; an interval needs 4) "
                                   "[2 pairs of blocks, 29 s: all the budget allowed]"), result.table()
    # Two pairs that agree still show the difference they measured; four pairs show their interval.
    assert paired([100.0, 101.0], [200.0, 201.0]).text() == "2.00x faster (95% interval 1.93-2.06)"
    assert paired([100.0, 120.0, 90.0, 110.0], [110.0, 100.0, 100.0, 105.0]).text() == "too noisy to tell (95% interval 0.80-1.23)"


def test_every_ratio_reads_one_way_the_number_then_x():
    # Tables said 'x3.37' where the verdicts said '3.71x faster': one form, from nbtrain.format.ratio.
    import pathlib
    import re

    from nbtrain.format import ratio
    from nbtrain.measure.verdict import Verdict
    measured, unsure = Verdict(1.31, 1.24, 1.38, 8), Verdict(0.8, float("nan"), float("nan"), 1)
    assert ratio(3.37) == "3.37x" and ratio(2.04, 1) == "2.0x"
    assert measured.short() == "1.31x (1.24-1.38)" and measured.text() == "1.31x faster (95% interval 1.24-1.38)"
    assert Verdict(0.5, 0.4, 0.6, 8).text() == "2.00x slower (95% interval 1.67-2.50)"
    assert unsure.short() == "0.80x, too few steps to tell" and unsure.text() == "0.80x, too few measurements to tell"
    package = pathlib.Path(nbtrain.__file__).parent
    written = [f"{p.relative_to(package)}: {m.group()}" for p in package.rglob("*.py")
               for m in re.finditer(r"\bx\{[^}]*:[,]?\.\d+f\}", p.read_text())]
    assert written == [], "a ratio written 'x1.31'; use nbtrain.format.ratio"
