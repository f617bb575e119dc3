"""Every headline number is a measurement: one config is never faster than itself (an A/A check),
a bottleneck verdict names only a ceiling that explains the rate, and the walk's headline is its final
head-to-head."""

import dataclasses

import pytest
import torch
from torch import nn

import nbtrain
from nbtrain.measure.verdict import Verdict

from helpers import regression_data, same_weights, weights

SPEED_WORDS = ("faster", "slower")


@pytest.mark.parametrize("ratio,low,high", [(1.29, 1.00, 1.65), (1.3, 1.2, 1.4), (0.7, 0.6, 0.8), (1.0, 0.98, 1.02),
                                            (1.4, float("nan"), float("nan"))])
def test_an_a_a_verdict_never_says_faster_or_slower_whatever_its_blocks_read(ratio, low, high):
    v = Verdict(ratio, low, high, 6, one_config=True)
    words = v.text("x") + " " + v.short()
    assert not v.measurable and not v.faster and not v.above(0.0)
    assert "A/A check" in words and not any(w in words for w in SPEED_WORDS), words


def test_ab_of_one_resolved_config_is_an_a_a_check_naming_what_a_inherits_from_the_live_config():
    # After fit(precision='bf16-mixed'), a={'batch_size': 16} inherits the live bf16: both sides are one config.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    data = regression_data()
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=2, batch_size=32, precision="bf16-mixed")
    before = weights(model)
    result = nbtrain.ab(model, data, loss_fn=nn.MSELoss(), a={"batch_size": 16},
                        b={"batch_size": 16, "precision": "bf16-mixed"}, block_steps=3, min_pairs=2, max_pairs=3)
    assert same_weights(before, weights(model))
    text = result.text()
    assert result.same and result.verdict.one_config and not result.verdict.faster
    assert "A/A check" in text and not any(w in text for w in SPEED_WORDS), text
    assert "a and b are both the live config with batch_size=16" in text, text
    assert "a inherits precision=bf16-mixed from the live config" in text, text


def test_ab_of_two_configs_names_each_side_as_changes_from_the_live_config():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    data = regression_data()
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=2, batch_size=32)
    result = nbtrain.ab(model, data, loss_fn=nn.MSELoss(), a={"batch_size": 16}, b={"batch_size": 64},
                        block_steps=3, min_pairs=2, max_pairs=2, learn_s=0)  # the sides' names, not what they learn
    assert not result.same and not result.verdict.one_config
    assert ("A: the live config with batch_size=16; B: the live config with batch_size=64") in result.text()


# --- the ceilings' verdict: a ceiling is named only where it explains the rate --------------------------------

from nbtrain.measure.bottleneck import CEILINGS, EXPLAINS, memory_undercuts, share_of  # noqa: E402
from nbtrain.measure.device_rates import HostSplit, Rate, StepCount  # noqa: E402
from nbtrain.measure.steady import SteadyRate  # noqa: E402
from simulated_machine import Landscape, SimulatedMachine  # noqa: E402

from landscapes import CPU, GPU, LANDSCAPES, grid  # noqa: E402

# Machines whose step falls short of every ceiling (time none of the four counts), beside the walk's thirteen.
SHORT_OF_EVERY_CEILING = [
    Landscape("cpu-elementwise-overheads", CPU.replace(preload_data=True), cuda=False, cores=2, flops=2e7,
              peak_fp32=5e10, traffic=2e6, bandwidth=1e10, unexplained_s=6e-4),
    Landscape("gpu-allocation-bound", GPU.replace(batch_size=256, preload_data=True), flops=2e8, traffic=3e8,
              bandwidth=3e12, unexplained_s=2e-4),
]


def configs_of(land, count=8):
    """A spread of the landscape's grid: the start and configs across it."""
    configs = grid(land)
    return [land.start] + configs[::max(len(configs) // count, 1)][:count]


@pytest.mark.parametrize("land", LANDSCAPES + SHORT_OF_EVERY_CEILING, ids=lambda land: land.name)
def test_a_verdict_names_a_ceiling_only_where_it_explains_the_rate_on_every_landscape(land):
    machine = SimulatedMachine(land, seed=3)
    for config in configs_of(land):
        c = machine.ceilings(config, 0.5)
        b = c.bottleneck()
        reaches = share_of(c, b.binding)
        if b.binds and b.binding != "data":  # the loader slower than the model: the rate is the loader's
            assert reaches.high >= EXPLAINS, (land.name, config, c.verdict)
        if b.binds and b.binding == "memory":
            assert memory_undercuts(c), (land.name, config, c.verdict)
        if not b.binds:
            assert "-bound" not in c.verdict and "none of the four explains it" in c.verdict, c.verdict
    if land in SHORT_OF_EVERY_CEILING:
        assert not machine.bottleneck(land.start, 0.5).binds


def reading(model=3688.0, compute=25_864.0, memory=15_214.0, spread=0.03, peaks=(), host_share=None,
            model_over_loader=Verdict(0.2, 0.18, 0.22, 0, paired=False)):
    """A CPU reading with these ceilings in samples/s (a simulated one, its numbers replaced): one sample's step
    counts 1 MFLOP and 1 MB, the host's fixed part a tenth of the device's, the loader far faster."""
    c = SimulatedMachine(LANDSCAPES[-2], seed=0).ceilings(CPU.replace(preload_data=True), 0.5)
    rate = lambda v, w=0.03: Rate(v, v * (1 - w), v * (1 + w))  # noqa: E731
    n = c.step_samples
    return dataclasses.replace(
        c, model=SteadyRate(model, model * (1 - spread), model * (1 + spread), spread, 3, 0.1, 30, 1.0),
        ratio=model_over_loader, counts=StepCount(n * 1e6, n * 1e6, 40, 20),
        peak=rate(compute * 1e6, 0.01), bandwidth=rate(memory * 1e6, 0.01), peak_readings=peaks,
        split=HostSplit(n, n // 2, rate(1e-4), rate(1e-3), host_share or rate(0.1)))


def test_a_memory_ceiling_4x_above_the_rate_is_not_named_the_step_says_how_far_it_is_from_the_nearest():
    # The reading: "memory-bound: the memory bandwidth allows 15,214 samples/s, the model trains at 3,688".
    c = reading()
    b = c.bottleneck()
    assert b.state == "none" and b.binding == "memory" and "-bound" not in c.verdict, c.verdict
    assert c.verdict.startswith("the step reaches 24% (95% interval 23-25%) of the memory ceiling, the nearest: "
                                "none of the four explains it; look at a profile of the step"), c.verdict


@pytest.mark.parametrize("compute_over_memory,model,named", [
    (1.04, 8_000.0, "compute"), (1.0, 8_000.0, "compute"), (0.8, 7_000.0, "compute"), (1.6, 8_000.0, "memory"),
    (1.6, 12_000.0, "compute"),  # the model alone beats the memory ceiling: fewer bytes moved than counted
])
def test_a_memory_ceiling_binds_over_compute_only_where_it_measurably_undercuts_it(compute_over_memory, model, named):
    # A 1024-wide MLP at batch 512 read "memory-bound ... the compute ceiling is 1.0x higher: not measurably".
    memory = 10_000.0
    c = reading(model=model, compute=memory * compute_over_memory, memory=memory)
    b = c.bottleneck()
    assert b.binds and b.binding == named and c.verdict.startswith(f"{named}-bound"), c.verdict


@pytest.mark.parametrize("spread,peaks,host_share,why", [
    (0.4, (), None, "the model alone read"),
    (0.03, (Rate(5e10, 4.9e10, 5.1e10), Rate(2e10, 1.9e10, 2.1e10)), None, "the machine's load changed"),
    # the host's part 3x the device's, 95% interval 0.64-unbounded: as ab's too noisy, an open top included
    (0.03, (), Rate(3.0, 0.64, float("inf")), "the ratio that chose the host ceiling reads 0.64-inf"),
])
def test_readings_the_load_moved_say_too_noisy_and_name_no_ceiling(spread, peaks, host_share, why):
    c = reading(model=24_000.0, compute=25_864.0, memory=60_000.0, spread=spread, peaks=peaks, host_share=host_share)
    b = c.bottleneck()
    assert b.state == "noisy" and c.verdict.startswith("too noisy to tell: ") and why in c.verdict, c.verdict
    assert "-bound" not in c.verdict
    quiet = reading(model=24_000.0, compute=25_864.0, memory=60_000.0, peaks=(Rate(5e10, 4.9e10, 5.1e10),) * 2)
    assert quiet.bottleneck().binds and quiet.verdict.startswith("compute-bound"), quiet.verdict
    # a loader slower than the model beyond doubt binds whatever the model's spread: their ratio's interval holds it
    fed = reading(model=24_000.0, spread=spread, peaks=peaks, model_over_loader=Verdict(3.0, 1.6, 5.0, 0, paired=False))
    assert fed.bottleneck().binds and fed.verdict.startswith("data-bound"), fed.verdict


@pytest.mark.parametrize("land", LANDSCAPES + SHORT_OF_EVERY_CEILING, ids=lambda land: land.name)
def test_two_readings_of_one_config_on_a_quiet_simulated_machine_give_one_verdict(land):
    first, second = (SimulatedMachine(land, seed=s).bottleneck(land.start, 0.5) for s in (1, 2))
    assert (first.state, first.binding) == (second.state, second.binding), (land.name, first.kind, second.kind)


# --- the walk's headline: its choice against the start, head to head ---------------------------------------

from nbtrain.walk.walker import run_walk  # noqa: E402

from landscapes import budget_s  # noqa: E402


@pytest.mark.parametrize("land", LANDSCAPES, ids=lambda land: land.name)
def test_the_walks_headline_is_its_final_head_to_head_on_every_landscape(land, tmp_path):
    machine = SimulatedMachine(land, seed=0)
    walk = run_walk(machine, budget_s=budget_s(land), clock=machine.clock)
    assert walk.elapsed_s <= walk.budget_s
    table = walk.table()
    raced = [line.split()[:2] for line in table.splitlines()[2:] if line.startswith("  ") and " skipped " not in line]
    names = [words[1] if words[0] in ("-", *CEILINGS) else words[0] for words in raced]
    assert len(names) == len(set(names)), table  # an item raced twice (precision ...) is one row
    if not walk.moved:
        assert walk.headline().endswith("nothing kept, the starting config is the best found"), table
        return
    h = walk.head_to_head
    assert h is not None and walk.overall() is h.verdict, table
    # the last race the machine ran: the start beside the walk's choice, and nothing else
    assert set(machine.blocks[-2:]) == {walk.start_config, walk.best_config} == {h.config, walk.start.config}
    assert walk.final == pytest.approx(walk.baseline * h.verdict.ratio)
    assert walk.headline() == (f"{walk.baseline:,.0f} -> {walk.final:,.0f} samples/s, the walk's choice against the "
                               f"start head to head: {h.verdict.text()}")  # with its "95% interval", as every figure
    assert table.splitlines()[0].startswith(f"nbtrain checklist walk on {walk.device}: {walk.headline()}; ")
    result_row = next(line for line in table.splitlines() if line.split()[:1] == ["result"])
    assert h.verdict.short() in result_row and "head to head in one race" in result_row, table
    figure = walk.plot(tmp_path / "walk.png")  # the waterfall's last bar: the head-to-head, its interval on it
    last = figure.axes[0].texts[-1].get_text()
    assert last.startswith(f"{walk.final:,.0f}\n") and h.verdict.interval_text() in last, last


def test_an_item_that_overruns_into_the_reserve_still_leaves_the_headline_measured():
    """A ceilings reading that took far longer than its estimate (a loaded machine) ate the time kept back
    for the final head-to-head: the walk still measures its choice against the start, and ends later."""
    land = next(land for land in LANDSCAPES if not land.cuda)
    machine = SimulatedMachine(land, seed=0)
    reading, overran = machine.bottleneck, []

    def slow_reading(config, seconds):
        if config != land.start and not overran:  # the reading after an item was kept ends a second before the budget
            overran.append(True)
            machine.now = max(machine.now, started + budget_s(land) - 1.0)
        return reading(config, seconds)
    started = machine.now
    machine.bottleneck = slow_reading
    walk = run_walk(machine, budget_s=budget_s(land), clock=machine.clock)
    assert overran and walk.moved, walk.table()
    assert walk.head_to_head is not None and walk.overall() is walk.head_to_head.verdict, walk.table()
    assert walk.elapsed_s > walk.budget_s  # the reserve's rounds, after the budget
