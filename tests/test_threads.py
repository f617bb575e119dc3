"""torch's intra-op threads as a setting (config.num_threads, engine/threads.py): validated once, applied for a
run and put back after, and recorded by every reading (a run's start and summary, each `ab` block, the
ceilings' model-alone and loader-alone readings)."""
import dataclasses

import pytest
import torch

import nbtrain
from nbtrain import ConfigError, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.engine.engine import Engine
from nbtrain.records import start_info


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


@pytest.mark.parametrize("value", [0, -1, 2.5, "many", 10**6, True])
def test_a_bad_thread_count_is_one_error_naming_it_and_what_is_allowed(value):
    with pytest.raises(ConfigError) as info:
        TrainConfig(num_threads=value)
    assert len(info.value.problems) == 1
    text = str(info.value)
    assert f"num_threads={value!r}" in text and "a whole number from 1 to 1024, or None" in text


def test_the_thread_count_reads_from_a_flag_and_states_itself_as_code():
    config = TrainConfig(num_threads="3")
    assert config.num_threads == 3 and TrainConfig(num_threads="none").num_threads is None
    assert "--num-threads 3" in config.as_flags() and "num_threads=3" in config.as_code()


def test_the_magic_and_the_panel_take_the_thread_count_and_the_config_judges_it():
    from nbtrain.flags import config_from_flags
    from nbtrain.notebook.magic import build_parser
    from nbtrain.notebook.panel_controls import Controls
    namespace, _ = build_parser().parse_known_args(["--num-threads", "2"])
    assert config_from_flags(namespace).num_threads == 2
    controls = Controls(TrainConfig(accelerator="cpu"), lambda: None)
    assert controls.config_over(TrainConfig(accelerator="cpu")).num_threads is None  # empty: torch's own
    controls.threads.value = "1"
    assert controls.config_over(TrainConfig(accelerator="cpu")).num_threads == 1
    controls.threads.value = "0"
    with pytest.raises(ConfigError, match="num_threads='0'"):
        controls.config_over(TrainConfig(accelerator="cpu"))


@pytest.mark.slow
def test_a_run_trains_at_its_thread_count_records_it_and_puts_torchs_back(two_threads):
    result = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=4, batch_size=32, accelerator="cpu",
                                                                     num_threads=1))
    assert torch.get_num_threads() == two_threads  # put back after the run
    assert result.summary.threads == 1 and start_info(result.log).threads == 1 and result.summary.load.threads == 1
    default = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=4, batch_size=32, accelerator="cpu"))
    assert default.summary.threads == two_threads and default.summary.load.threads == two_threads
    again = type(result.summary).from_json(result.summary.to_json())
    assert again.threads == 1 and again.load.threads == 1  # the JSON round trip keeps it


@pytest.mark.slow
def test_every_ab_block_and_ceilings_reading_records_its_thread_count(two_threads):
    recipe = digits_recipe()
    result = nbtrain.ab(recipe=recipe, config=TrainConfig(batch_size=32, accelerator="cpu"), a={},
                        b={"num_threads": 1}, block_steps=3, min_pairs=2, max_pairs=2)
    assert [load.threads for load in result.loads_a] == [two_threads] * len(result.loads_a)
    assert [load.threads for load in result.loads_b] == [1] * len(result.loads_b)
    ceilings = nbtrain.ceilings(recipe=recipe, config=TrainConfig(batch_size=32, accelerator="cpu", num_threads=1),
                                steps=10, seconds=0.2)
    assert ceilings.model_load.threads == 1 and ceilings.loader_load.threads == 1
    assert torch.get_num_threads() == two_threads


def test_a_live_change_of_the_thread_count_applies_at_the_next_step(two_threads):
    seen = []

    class Watching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(64, 10)

        def forward(self, x):
            seen.append(torch.get_num_threads())
            if len(seen) == 3:  # as the panel's Apply does, from outside the loop, mid-run
                engine.request(num_threads=2)
            return self.net(x.flatten(1))

    recipe = digits_recipe()
    recipe.model = Watching()
    engine = Engine(recipe, TrainConfig(max_steps=6, batch_size=32, accelerator="cpu", num_threads=1))
    result = engine.run()
    assert seen[:3] == [1, 1, 1] and seen[-1] == 2 and result.summary.threads == 2
    assert torch.get_num_threads() == two_threads


@pytest.mark.slow
def test_ddp_ranks_share_the_cores_and_the_summary_says_how_many_threads_each_ran_at():
    import os
    result = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=4, batch_size=16, accelerator="cpu",
                                                                     devices=2))
    each = max(1, (os.cpu_count() or 1) // 2)
    assert result.summary.threads == each, result.summary.notes
    note = next(n for n in result.summary.notes if n.startswith("each rank trained at"))
    assert f"at {each} torch thread" in note and "/ 2 local ranks" in note and f"num_threads={each}" in note


@pytest.mark.slow
def test_where_the_models_threads_waited_the_host_reading_says_how_long_and_offers_fewer_threads_measured(
        two_threads):
    from nbtrain.measure.ceilings import ThreadRace
    from nbtrain.measure.load import Load
    from nbtrain.measure.verdict import Verdict
    from nbtrain.tools import trial
    from nbtrain.tools.ceilings import THREAD_RACE_PAIRS, race_fewer_threads
    from nbtrain.tools.step_timing import loader_alone

    recipe = digits_recipe()
    with trial.borrow(recipe=recipe, config=TrainConfig(batch_size=32, accelerator="cpu")) as lent:
        _, batch = loader_alone(lent.engine, 2, 0.1)
        race = race_fewer_threads(lent.engine, batch, seconds=0.6)  # the short race, on the real model
    assert race.threads == 2 and race.fewer == 1 and race.verdict.pairs == THREAD_RACE_PAIRS and race.rate > 0
    assert torch.get_num_threads() == two_threads
    quiet = nbtrain.ceilings(recipe=recipe, config=TrainConfig(batch_size=32, accelerator="cpu"), steps=10,
                             seconds=0.3)
    waited = Load(1.0, 2, 1.0, own_cores=2.0, waited_cores=1.4, threads=2)
    faster = ThreadRace(2, 1, Verdict(3.0, 2.4, 3.7, 6), 9000.0)
    busy = dataclasses.replace(quiet, model_load=waited, threads_race=faster)
    table = busy.table()
    assert "; oversubscribed: its 2 torch threads waited 1.4 s a second for a free CPU" in table, table
    assert "at 1 thread the model alone read 9,000 samples/s, num_threads=1 against 2: 3.00x faster" in table, table
    assert busy.remedy_lines()[0].startswith("  try: num_threads=1: the model alone 3.0x faster than at 2 threads")
    assert "or with num_threads=1 (measured faster here" in busy.verdict  # too noisy, and a measured way out
    same = dataclasses.replace(busy, threads_race=ThreadRace(2, 1, Verdict(1.0, 0.97, 1.03, 6), 3000.0))
    assert not same.remedy_lines()[0].startswith("  try: num_threads") and "torch threads waited" in same.table()
    assert "threads waited" not in quiet.table() or quiet.model_load.waited  # said only where they waited


def test_on_a_cpu_the_forecasts_one_process_is_the_live_runs_and_ddps_gain_is_read_at_the_ranks_threads():
    from nbtrain.measure.forecast import Quantity, scaling_point
    from nbtrain.measure.forecast_result import Forecast, _speedup
    from nbtrain.measure.steady import SteadyRate
    # 2 CPU ranks at 1 thread each read 10 ms a step of 32; one process alone at 1 thread 2,000 samples/s; the
    # live run, at torch's 2 threads beside a busy process, 12 ms a step (2,667 samples/s)
    rank = Quantity(0.010, 0.0095, 0.0105, "s", "measured", "2 ranks at once")
    live = Quantity(0.012, 0.011, 0.013, "s", "measured", "one process alone at 2 threads")
    alone = SteadyRate(2000, 1900, 2100, 0.05, 3, 1.0, 50, 1.0)
    points = [scaling_point(1, 1, live, [4096], None, None, batch=32)]
    f = Forecast("cpu", 1024, "float32", (4096,), rank, alone, 32, 1, None, None, points, one_process=live,
                 threads=2, rank_threads=1)
    assert f.point(1).throughput == pytest.approx((32 / 0.013, 32 / 0.011))  # the live run's count, not a rank's
    assert f.forecast_for(1).throughput == f.point(1).throughput
    assert "one process (1 x 1): 12 ms" in f.table() and "at 2 threads, as the live run trains" in f.table()
    two = dataclasses.replace(scaling_point(2, 1, rank, [4096], None, None, batch=32), throughput=(6000.0, 6400.0))
    text = _speedup(two, f)  # DDP's gain against one process at the ranks' threads, the live run's beside it
    assert text.startswith("3.0-3.2x one process at 1 thread, as each rank runs") and "the live run's one process" \
        in text, text


@pytest.mark.slow
def test_the_forecasts_one_process_range_holds_the_live_runs_own_rate_at_its_threads(two_threads):
    from torch import nn
    from torch.utils.data import TensorDataset
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(2048, 32, generator=g), torch.randint(0, 4, (2048,), generator=g))
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
    for _ in range(2):  # one second look where the machine's load moved between the readings
        f = nbtrain.forecast(model, data, loss_fn=nn.CrossEntropyLoss(), config=TrainConfig(batch_size=32),
                             devices=[1, 2], nodes=[1], check=True, seconds=1)
        one = next(c for c in f.checks if c.devices == 1)
        if one.inside:
            break
    assert f.threads == two_threads and f.rank_threads == 1 and f.one_process is not None, f.table()
    assert one.inside and "one process at 2 threads as the live run trains" in one.how, f.table()
    assert "x one process at 1 thread, as each rank runs" in f.verdict, f.verdict
    assert torch.get_num_threads() == two_threads
