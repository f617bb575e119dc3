"""The SQLite run store: round trips, where it lives, and what happens when the file is bad or busy."""
import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

import nbtrain
from nbtrain import TrainConfig, hardware
from nbtrain.demo import digits_recipe
from nbtrain.runs.result import RunResult
from nbtrain.runs.store import RunStore, StoreError, default_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def run():
    config = TrainConfig(max_steps=6, batch_size=32, log_every_n_steps=2, accelerator="cpu")
    return nbtrain.fit(recipe=digits_recipe(), config=config, name="small")


def test_record_and_load_round_trip_keeps_config_history_and_summary(tmp_path, run):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.record(run, model="DigitsMLP")
    loaded = store.load("small")
    assert loaded.extras["run_id"] == run_id
    assert loaded.config == run.config
    assert loaded.history == run.history
    assert loaded.summary.samples_per_s == run.summary.samples_per_s
    assert loaded.status == "completed" and loaded.name == "small"
    assert [e["type"] for e in loaded.log.events] == [e["type"] for e in run.log.events]
    listed = store.runs()
    assert [(r.id, r.name, r.model, r.status) for r in listed] == [(run_id, "small", "DigitsMLP", "completed")]
    assert listed[0].config["batch_size"] == 32
    assert set(listed[0].config) == set(TrainConfig.__dataclass_fields__)  # the listing's columns: options only


def test_a_stored_config_keeps_the_options_given_at_their_defaults(tmp_path, run):
    store = RunStore(tmp_path / "runs.sqlite")
    store.record(run)
    assert run.config.given >= {"batch_size", "max_steps"}  # batch_size=32: the default, given
    assert store.load("small").config.given == run.config.given
    assert store.load("small").config.as_flags() == run.config.as_flags()
    # A row written before the store kept them: the options that differ from the defaults count as given.
    with sqlite3.connect(tmp_path / "runs.sqlite") as db:
        stored = json.loads(db.execute("SELECT config FROM runs").fetchone()[0])
        db.execute("UPDATE runs SET config = ?", (json.dumps({k: v for k, v in stored.items()
                                                              if k in TrainConfig.__dataclass_fields__}),))
    older = store.load("small").config
    assert older == run.config and older.given == set(older.changed_from(TrainConfig()))


def test_held_out_numbers_survive_the_round_trip_into_the_runs_table_compare_and_the_plot(tmp_path):
    from nbtrain import plotting
    from nbtrain.format import number
    from nbtrain.runs.table import HEADS, Row, RunsTable
    config = TrainConfig(max_steps=8, batch_size=32, val_every_n_steps=4, accelerator="cpu")
    recipe = digits_recipe()
    recipe.metrics = {"half": lambda out, y: 0.5}
    validated = nbtrain.fit(recipe=recipe, config=config, name="held")
    store = RunStore(tmp_path / "runs.sqlite")
    store.record(validated)
    loaded = store.load("held")
    for key in ("val_loss", "val_acc", "val_metrics"):
        assert getattr(loaded.summary, key) == getattr(validated.summary, key)
    assert loaded.summary.val_metrics == {"val_half": 0.5}
    assert plotting.held_out_series(loaded.log) == plotting.held_out_series(validated.log)
    assert [e for e in loaded.log.of_type("epoch")] == [e for e in validated.log.of_type("epoch")]
    table = RunsTable([Row.stored(run) for run in store.runs()], store.path)
    row = dict(zip(HEADS, table.rows[0]))
    s = validated.summary
    assert row["held-out"] == f"{100 * s.val_acc:.1f}% (loss {number(s.val_loss)})"
    assert row["run"] == "#1 held" and row["differs from the first run"] == "(first run)"
    assert row["held-out"] in repr(table) and "held-out" in table._repr_html_()
    # The folded details say the rest: the model, the global batch and the warm-up-inclusive rate.
    assert "global batch 32 = batch 32 × accumulate 1 × 1 device" in repr(table)
    assert nbtrain.compare("held", store=store).rows[0]["held-out"].endswith(", half 0.5")


def test_load_by_name_gives_the_newest_and_by_id_any(tmp_path, run):
    store = RunStore(tmp_path / "runs.sqlite")
    first = store.record(run, name="again")
    second = store.record(run, name="again")
    assert store.load("again").extras["run_id"] == second
    assert store.load(first).extras["run_id"] == first
    assert store.load(f"#{first}").extras["run_id"] == first
    assert [r.id for r in store.runs(last=1)] == [second]


def test_unknown_run_is_an_error_listing_stored_runs(tmp_path, run):
    store = RunStore(tmp_path / "runs.sqlite")
    store.record(run, name="kept")
    with pytest.raises(StoreError, match=r"no run named 'gone' in .*runs.sqlite; stored runs: kept"):
        store.load("gone")


def test_default_path_is_project_local_and_env_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("NBTRAIN_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_path() == tmp_path / ".nbtrain" / "runs.sqlite"
    monkeypatch.setenv("NBTRAIN_STORE", str(tmp_path / "elsewhere.sqlite"))
    assert RunStore().path == tmp_path / "elsewhere.sqlite"
    assert RunStore(tmp_path / "given.sqlite").path == tmp_path / "given.sqlite"


def test_store_folder_is_created_private(tmp_path, run):
    store = RunStore(tmp_path / "project" / ".nbtrain" / "runs.sqlite")
    assert store.record(run) is not None
    assert stat.S_IMODE(os.stat(store.path.parent).st_mode) == 0o700


def test_corrupt_file_warns_once_and_recording_returns_none(tmp_path, run):
    path = tmp_path / "runs.sqlite"
    path.write_bytes(b"this is not a database, just some bytes " * 200)
    store = RunStore(path)
    with pytest.warns(RuntimeWarning, match=r"run store .*runs.sqlite is unusable \(file is not a database\); "
                                            r"training goes on"):
        assert store.record(run) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second failure on the same file stays quiet
        assert RunStore(path).record(run) is None
    with pytest.raises(StoreError, match="cannot read the run store .*runs.sqlite: file is not a database"):
        store.runs()


def test_locked_file_warns_and_gives_up_then_recovers(tmp_path, run):
    path = tmp_path / "runs.sqlite"
    RunStore(path).record(run)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.warns(RuntimeWarning, match="database is locked"):
            assert RunStore(path, timeout=0.2).record(run) is None
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert RunStore(path).record(run) == 2


def test_stored_gpu_run_loads_on_a_machine_without_one(tmp_path, run):
    gpu = hardware.Inventory(cuda_devices=8, cuda_bf16=True, mps=False, cpu_cores=64)
    with hardware.assume(gpu):
        config = TrainConfig(accelerator="cuda", devices=4, precision="16-mixed")
    store = RunStore(tmp_path / "runs.sqlite")
    store.record(RunResult(config, run.log, run.summary), name="on_gpus")
    loaded = store.load("on_gpus")
    assert (loaded.config.accelerator, loaded.config.devices, loaded.config.precision) == ("cuda", 4, "16-mixed")


WRITER = textwrap.dedent("""
    import json, os, sys, time
    from nbtrain import TrainConfig
    from nbtrain.metrics import MetricsLog
    from nbtrain.runs.result import RunResult
    from nbtrain.runs.store import RunStore
    path, events, summary, go, worker = sys.argv[1:]
    result = RunResult(TrainConfig(), MetricsLog.from_events(json.load(open(events))), json.load(open(summary)))
    print("ready", flush=True)  # imported and loaded: the test starts every writer at once
    while not os.path.exists(go):
        time.sleep(0.01)
    store = RunStore(path)
    for i in range(15):
        assert store.record(result, name=f"w{worker}-{i}") is not None
""")


def test_a_first_record_waits_out_another_connections_write_lock_on_a_new_store(tmp_path, run):
    # Two kernels' first runs in one new store: SQLite refuses the switch to WAL at once ("database is locked",
    # no busy wait) while another connection holds the write lock; the first record waits it out instead.
    path = tmp_path / "runs.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, other.execute, ("COMMIT",))
    released.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an unusable store warns: none here
            assert RunStore(path).record(run, name="first") is not None
    finally:
        released.join()
        other.close()
    assert [r.name for r in RunStore(path).runs()] == ["first"]


def test_a_store_locked_past_its_timeout_warns_once_and_training_goes_on(tmp_path, run):
    path = tmp_path / "runs.sqlite"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.warns(RuntimeWarning, match="is unusable \\(database is locked\\)"):
            assert RunStore(path, timeout=0.2).record(run, name="late") is None
    finally:
        other.close()


@pytest.mark.slow
def test_concurrent_writers_in_separate_processes_all_land(tmp_path, run):
    (tmp_path / "events.json").write_text(json.dumps(run.log.events))
    (tmp_path / "summary.json").write_text(run.summary.to_json())
    path, go = tmp_path / "runs.sqlite", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen([sys.executable, "-W", "error::RuntimeWarning", "-c", WRITER, str(path),
                                 str(tmp_path / "events.json"), str(tmp_path / "summary.json"), str(go), str(k)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)]
    for worker in workers:  # every writer imported and waits at the line (a writer that died says why)
        assert worker.stdout.readline() == "ready\n", worker.communicate(timeout=120)[1]
    go.touch()
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    runs = RunStore(path).runs()
    assert len(runs) == 60
    assert {r.name for r in runs} == {f"w{k}-{i}" for k in range(4) for i in range(15)}
    assert len({r.id for r in runs}) == 60
    assert RunStore(path).load("w3-14").history == run.history
