"""One damaged row never makes the run store unreadable (runs/store.py): a row whose summary or config is cut
short or of the wrong JSON type, or whose events blob is not zlib, is skipped with one warning naming the
store and the row, and every other run lists, loads and compares (RunStore, nbtrain.compare, the magics)."""
import sqlite3
import warnings
import zlib

import pytest

import nbtrain
from nbtrain import TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.runs.store import RunStore, StoreError

# (column, what is written there): each a way a row is found damaged (a crash mid-write, another tool's edit)
DAMAGES = {
    "summary cut short": ("summary", lambda good: good[: len(good) // 2]),
    "summary a JSON list": ("summary", lambda good: "[1, 2, 3]"),
    "summary a JSON string": ("summary", lambda good: '"completed"'),
    "summary a JSON null": ("summary", lambda good: "null"),
    "config cut short": ("config", lambda good: good[:-5]),
    "config a JSON number": ("config", lambda good: "3"),
    "events not zlib": ("events", lambda good: b"\x00 not a zlib stream"),
    "events cut short": ("events", lambda good: good[: len(good) // 2]),
    "events zlib of a JSON object": ("events", lambda good: zlib.compress(b'{"type": "start"}')),
}


@pytest.fixture(scope="module")
def run():
    return nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=4, batch_size=32, accelerator="cpu"))


def _damaged_store(path, run, damage: str) -> RunStore:
    """A store of runs a, bad, c, the row of `bad` damaged as `damage` says."""
    store = RunStore(path)
    for name in ("a", "bad", "c"):
        store.record(run, name=name)
    column, write = DAMAGES[damage]
    db = sqlite3.connect(path)
    with db:
        good = db.execute(f"SELECT {column} FROM runs WHERE name = 'bad'").fetchone()[0]
        db.execute(f"UPDATE runs SET {column} = ? WHERE name = 'bad'", (write(good),))
    db.close()
    return store


def _row_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "unreadable row" in str(w.message)]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_row_is_skipped_with_one_warning_and_the_other_runs_list_load_and_compare(tmp_path, run, damage):
    path = tmp_path / "runs.sqlite"
    store = _damaged_store(path, run, damage)
    listed_whole = DAMAGES[damage][0] == "events"  # the listing reads no events: only loading the run finds them
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        labels = [r.label for r in store.runs()]
        comparison = nbtrain.compare("a", "c", store=store)  # reads the store's runs for repeats too
        assert [r.name for r in (store.load("a"), store.load(3))] == ["a", "c"]
        nbtrain.compare("c", "a", store=RunStore(path))
    assert labels == (["a", "bad", "c"] if listed_whole else ["a", "c"])
    assert comparison.labels == ["a", "c"] and len(comparison.rows) == 2
    said = _row_warnings(caught)
    if listed_whole:
        assert said == []
    else:
        assert len(said) == 1, said  # one warning, however often the store is read
        assert f"run store {path}" in said[0] and "row #2 'bad'" in said[0], said
    if listed_whole or DAMAGES[damage][0] == "config":
        with pytest.raises(StoreError) as refused:  # asked for by name: one error naming store and row
            nbtrain.compare("a", "bad", store=store)
        assert str(path) in str(refused.value) and "row #2 'bad'" in str(refused.value), refused.value


def test_a_damaged_newest_row_of_a_name_gives_way_to_an_older_readable_one(tmp_path, run):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    store.record(run, name="twice")
    store.record(run, name="twice")
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE runs SET events = ? WHERE id = 2", (b"garbage",))
    db.close()
    with pytest.warns(RuntimeWarning, match=r"skipped 1 unreadable row of the run store .*row #2 'twice'"):
        assert store.load("twice").extras["run_id"] == 1


def test_the_magics_list_and_compare_beside_a_damaged_row(ip, capsys, run):
    import os
    store = _damaged_store(os.environ["NBTRAIN_STORE"], run, "summary cut short")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ip.run_cell("%nbtrain_runs")
        listing = capsys.readouterr().out
        ip.run_cell("%nbtrain_compare a c")
        capsys.readouterr()
    assert "a" in listing and "c" in listing and "Traceback" not in listing
    assert ip.user_ns["_nbtrain_compare"].labels == ["a", "c"]
    assert len(_row_warnings(caught)) == 1 and str(store.path) in _row_warnings(caught)[0]
