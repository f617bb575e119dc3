"""A run's records (nbtrain/records.py): every name a run writes is declared there, a record is frozen and
comes back equal from its JSON and from the run store (a plain, a compiled and a DDP run), readers read
fields, and the stores written before records were typed still open and read the same way."""
import dataclasses
import json
import math
import shutil
import sqlite3
import typing
import zlib
from pathlib import Path

import pytest

import nbtrain
from nbtrain import TrainConfig, records
from nbtrain.demo import DigitsDataset, digits_recipe
from nbtrain.runs.result import summarize
from nbtrain.runs.store import RunStore
from nbtrain.runs.table import HEADS, Row, RunsTable

FIXTURES = Path(__file__).parent / "fixtures"
OLD_STORE = FIXTURES / "store_v1.sqlite"  # written by tests/fixtures/make_old_store.py
ROWS_BEFORE_RECORDS = FIXTURES / "store_rows_53fe223.json"  # written by tests/fixtures/make_store_rows.py


def names(record) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}


def validated_recipe():
    recipe = digits_recipe()
    recipe.val_data = DigitsDataset(train=False)
    recipe.metrics = {"half": lambda out, y: 0.5}
    return recipe


KINDS = {"plain": ({}, validated_recipe),
         "compiled": ({"compile": "default"}, digits_recipe),
         "ddp": ({"devices": 2, "batch_size": 16}, digits_recipe)}


@pytest.fixture(scope="module", params=["plain", pytest.param("compiled", marks=pytest.mark.slow),
                                        pytest.param("ddp", marks=pytest.mark.slow)])
def run(request):
    options, recipe = KINDS[request.param]
    config = TrainConfig(**{"max_steps": 6, "batch_size": 32, "log_every_n_steps": 2, "val_every_n_steps": 3,
                            "accelerator": "cpu", **options})
    return request.param, nbtrain.fit(recipe=recipe(), config=config, name=request.param)


def test_every_name_a_run_writes_is_declared_in_its_record(run):
    kind, result = run
    events = {"start": records.StartEvent, "steps": records.StepsEvent, "epoch": records.EpochEvent,
              "end": records.EndEvent, "change": records.ChangeEvent, "logged": records.LoggedEvent}
    for event in result.log.events:
        extra = set(event) - set(typing.get_type_hints(events[event["type"]]))
        if event["type"] == "epoch":  # a validation carries the user's metrics under their own names
            extra -= {"val_half"}
        assert not extra, (event["type"], extra)
    start, = result.log.of_type("start")
    assert set(start["info"]) == names(records.StartInfo)  # the event holds the record's whole dict
    assert records.StartInfo.from_dict(start["info"]) == records.start_info(result.log)
    assert isinstance(result.summary, records.Summary)
    engine_info = {name: getattr(result.summary, name) for name in names(records.EngineInfo)}
    assert None not in engine_info.values(), engine_info  # the engine's info is in every summary
    if kind == "compiled":  # written by engine/report.py, declared in records.Summary
        assert result.summary.compile_s >= 0 and any(n.startswith("compile cost") for n in result.summary.notes)
    else:
        assert result.summary.compile_s is None
    if kind == "ddp":
        assert result.summary.strategy == "ddp" and result.summary.world_size == 2
        assert len(result.summary.peak_mem_mb_per_rank) == 2 and isinstance(result.summary.peak_mem_mb_per_rank, tuple)
    assert result.summary.time_split and result.summary.call_s > 0 and result.summary.load is not None


def test_a_record_comes_back_equal_from_its_json_and_from_the_store(run, tmp_path):
    kind, result = run
    summary, info = result.summary, records.start_info(result.log)
    for record in (summary, info):
        again = type(record).from_json(record.to_json())
        assert again.to_json() == record.to_json() and type(again) is type(record)
    store = RunStore(tmp_path / "runs.sqlite")
    store.record(result, model="DigitsMLP")
    loaded = store.load(kind)
    assert loaded.summary.to_json() == summary.to_json()
    assert loaded.steady().text() == result.steady().text() and loaded.load().text() == result.load().text()
    assert records.start_info(loaded.log) == info
    stored, = store.runs()
    assert stored.summary.to_json() == summary.to_json() and loaded.table() == result.table()


def test_records_are_frozen_and_read_by_their_fields_alone(run):
    _, result = run
    summary, info = result.summary, records.start_info(result.log)
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.samples_per_s = 1.0
    # A name the record does not declare (batch_size became global_batch) is one error naming the record, the
    # name and the fields it has; a dict's read returned None for it, silently.
    for record, name in ((summary, "batch_size"), (info, "samples_per_second")):
        with pytest.raises(AttributeError, match=rf"{type(record).__name__} has no field '{name}'; its fields: "
                                                 r"device, strategy, world_size, global_batch, "):
            getattr(record, name)
    with pytest.raises(AttributeError, match="Summary has no field 'get'"):
        summary.get("batch_size")
    # no dict face: a field is read as a field, and an old notebook's dict read says how
    with pytest.raises(TypeError, match=r"Summary is read by its fields, not as a dict: summary.samples_per_s"):
        summary["samples_per_s"]
    assert summary.device_done_s is None and info.resumed_from is None  # declared, not recorded: None
    with pytest.raises(TypeError, match="declares no speed"):  # a producer's name that no record declares
        summarize(result.log, {"speed": 1.0})


def test_readers_read_the_start_and_the_steps_of_the_run():
    result = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=6, batch_size=32, accelerator="cpu"))
    assert records.start_info(result.log).planned_steps == 6
    assert records.samples_start(result.log) == 0
    assert result.summary.trained_steps == 6
    # a summary rebuilt from the kernel's log (a DDP run stopped before its ranks reported) has no run_steps
    assert records.Summary(steps=4).trained_steps == 4
    empty = nbtrain.metrics.MetricsLog()  # a run that never started
    assert records.start_info(empty) == records.StartInfo() and records.samples_start(empty) == 0


def test_a_store_written_by_the_first_run_store_still_opens_and_reads(tmp_path):
    path = tmp_path / "runs.sqlite"
    shutil.copy(OLD_STORE, path)
    store = RunStore(path)
    assert [(r.name, r.status) for r in store.runs()] == [("held", "completed"), ("plain", "completed")]
    held = store.load("held")
    assert held.summary.steady is None and held.summary.strategy is None  # written before either existed
    assert records.start_info(held.log).planned_steps == 6 and held.summary.trained_steps == 6
    assert records.samples_start(held.log) == 0
    steady = held.steady()  # the old summary's rate, without an interval
    assert steady.rate == held.summary.samples_per_s and math.isnan(steady.low)
    assert "status" in dict(held.rows()) and held.summary.val_loss is not None
    table = RunsTable([Row.stored(r) for r in store.runs()], store.path)
    rows = [dict(zip(HEADS, row)) for row in table.rows]
    assert [r["run"] for r in rows] == ["#1 held", "#2 plain"]
    comparison = nbtrain.compare("held", "plain", store=store)
    assert [r["run"] for r in comparison.rows] == ["held", "plain"]
    # a run trained now lands next to them and reads the same way
    now = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=2, batch_size=32, accelerator="cpu"),
                      name="later")
    store.record(now)
    assert store.load("later").summary.trained_steps == 2


def test_a_store_written_before_records_were_typed_opens_and_reads_every_value(tmp_path):
    """Rows as the run store of 53fe223 wrote them (plain dicts): a validated, a compiled and a DDP run."""
    rows = json.loads(ROWS_BEFORE_RECORDS.read_text())
    store = RunStore(tmp_path / "runs.sqlite")
    assert store.runs() == []  # the file and its table, made as the store makes them
    db = sqlite3.connect(store.path)
    with db:
        for row in rows:
            db.execute("INSERT INTO runs (name, created, status, message, model, config, summary, events) "
                       "VALUES (?, 0, ?, ?, ?, ?, ?, ?)",
                       (row["name"], row["status"], row["message"], row["model"], json.dumps(row["config"]),
                        json.dumps(row["summary"]), zlib.compress(json.dumps(row["events"]).encode())))
    db.close()
    for row in rows:
        result = store.load(row["name"])
        written = row["summary"]
        assert set(written) <= names(records.Summary)  # every name it wrote is declared
        read = result.summary.to_dict()
        # a nested record's names written later (the load's threads) read as their defaults, beside what it held
        held = {k: {n: read[k][n] for n in v} if isinstance(v, dict) and k in records.Summary.NESTED else read[k]
                for k, v in written.items()}
        assert held == json.loads(json.dumps(written)), row["name"]
        assert read["load"]["threads"] is None  # not recorded then: unknown, never a count
        assert result.steady().rate == written["samples_per_s"] and result.load().cores == written["load"]["cores"]
        start, = (e for e in row["events"] if e["type"] == "start")
        assert records.start_info(result.log).to_dict() == {**records.StartInfo().to_dict(), **start["info"]}
        assert result.table().startswith(f"nbtrain run {row['name']}")
    assert store.load("compiled").summary.compile_s == rows[1]["summary"]["compile_s"]
    ddp = store.load("ddp").summary
    assert ddp.peak_mem_mb_per_rank == tuple(rows[2]["summary"]["peak_mem_mb_per_rank"]) and ddp.world_size == 2
    table = RunsTable([Row.stored(r) for r in store.runs()], store.path)
    assert [dict(zip(HEADS, r))["peak memory"].endswith("in 2 processes") for r in table.rows] == [False, False, True]
    comparison = nbtrain.compare("held", "compiled", "ddp", store=store)
    assert [r["steps"] for r in comparison.rows] == [6, 6, 6]
