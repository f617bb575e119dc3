"""A run's records (nbtrain/records.py): every key a run writes is declared there, readers read through
it, and a store written by the first version of the run store still opens and reads the same way."""
import math
import shutil
import typing
from pathlib import Path

import pytest

import nbtrain
from nbtrain import TrainConfig, records
from nbtrain.demo import digits_recipe
from nbtrain.runs.store import RunStore
from nbtrain.runs.table import HEADS, Row, RunsTable

OLD_STORE = Path(__file__).parent / "fixtures" / "store_v1.sqlite"  # written by tests/fixtures/make_old_store.py


def declared(record) -> set[str]:
    return set(typing.get_type_hints(record))


@pytest.fixture(scope="module")
def run():
    recipe = digits_recipe()
    recipe.metrics = {"half": lambda out, y: 0.5}
    config = TrainConfig(max_steps=6, batch_size=32, log_every_n_steps=2, val_every_n_steps=3, accelerator="cpu")
    return nbtrain.fit(recipe=recipe, config=config, name="now")


def test_every_key_a_run_writes_is_declared_in_its_record(run):
    events = run.log.events
    kinds = {"start": records.StartEvent, "steps": records.StepsEvent, "epoch": records.EpochEvent,
             "end": records.EndEvent, "change": records.ChangeEvent, "logged": records.LoggedEvent}
    for event in events:
        extra = set(event) - declared(kinds[event["type"]])
        if event["type"] == "epoch":  # a validation carries the user's metrics under their own names
            extra -= {"val_half"}
        assert not extra, (event["type"], extra)
    assert set(records.start_info(run.log)) - declared(records.StartInfo) == set()
    assert set(run.summary) - declared(records.Summary) == set()
    assert set(run.summary) >= declared(records.EngineInfo)  # the engine's info is in every summary


def test_readers_read_the_start_and_the_steps_of_the_run(run):
    assert records.start_info(run.log)["planned_steps"] == 6
    assert records.samples_start(run.log) == 0
    assert records.run_steps(run.summary) == 6
    # a summary rebuilt from the kernel's log (a DDP run stopped before its ranks reported) has no run_steps
    assert records.run_steps({"steps": 4}) == 4
    empty = nbtrain.metrics.MetricsLog()  # a run that never started
    assert records.start_info(empty) == {} and records.samples_start(empty) == 0


def test_a_store_written_by_the_first_run_store_still_opens_and_reads(tmp_path):
    path = tmp_path / "runs.sqlite"
    shutil.copy(OLD_STORE, path)
    store = RunStore(path)
    assert [(r.name, r.status) for r in store.runs()] == [("held", "completed"), ("plain", "completed")]
    held = store.load("held")
    assert "steady" not in held.summary and "strategy" not in held.summary  # written before either existed
    assert records.start_info(held.log)["planned_steps"] == 6 and records.run_steps(held.summary) == 6
    assert records.samples_start(held.log) == 0
    steady = held.steady()  # the old summary's rate, without an interval
    assert steady.rate == held.summary["samples_per_s"] and math.isnan(steady.low)
    assert "status" in dict(held.rows()) and held.summary["val_loss"] is not None
    table = RunsTable([Row.stored(r) for r in store.runs()], store.path)
    rows = [dict(zip(HEADS, row)) for row in table.rows]
    assert [r["run"] for r in rows] == ["#1 held", "#2 plain"]
    comparison = nbtrain.compare("held", "plain", store=store)
    assert [r["run"] for r in comparison.rows] == ["held", "plain"]
    # a run trained now lands next to them and reads the same way
    now = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=2, batch_size=32, accelerator="cpu"),
                      name="later")
    store.record(now)
    assert records.run_steps(store.load("later").summary) == 2
