"""Run-store faults test_store.py leaves out: a truncated file, a read-only folder, a folder that is a file.

(Concurrent writers in separate processes, a corrupt file and a locked file are in test_store.py.)
Each time recording warns once and returns None, so training goes on; reading names the file.
"""
import contextlib
import os
import shutil
import subprocess
import warnings

import pytest

import nbtrain
from nbtrain import TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.runs.store import RunStore, StoreError


@pytest.fixture(scope="module")
def run():
    return nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(max_steps=4, batch_size=32, accelerator="cpu"))


def test_a_truncated_store_warns_once_refuses_to_read_and_recovers_when_moved_away(tmp_path, run):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    for name in ("a", "b", "c"):
        store.record(run, name=name)
    for extra in ("-wal", "-shm"):  # fold the journal in, then cut the file as a crash or full disk would
        if os.path.exists(str(path) + extra):
            os.remove(str(path) + extra)
    size = path.stat().st_size
    with open(path, "r+b") as stream:
        stream.truncate(size // 3)
    with pytest.warns(RuntimeWarning, match=r"the run store .*runs.sqlite is unusable \(database disk image is "
                                            r"malformed\); training goes on"):
        assert RunStore(path).record(run, name="d") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per file: a second failure stays quiet
        assert RunStore(path).record(run, name="e") is None
    with pytest.raises(StoreError, match=r"cannot read the run store .*runs.sqlite: database disk image is malformed"):
        RunStore(path).runs()
    shutil.move(path, tmp_path / "runs.sqlite.broken")
    assert RunStore(path).record(run, name="fresh") == 1  # a new file where the old one was


@contextlib.contextmanager
def _read_only(folder):
    """`folder` read-only for this process, root included (chattr +i where chmod would not stop root)."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
            pytest.skip("running as root without chattr: a read-only folder cannot be made here")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        os.chmod(folder, 0o555)
        try:
            yield
        finally:
            os.chmod(folder, 0o755)


def test_a_read_only_folder_warns_and_training_goes_on(tmp_path, run):
    folder = tmp_path / "project"
    folder.mkdir()
    with _read_only(folder):
        with pytest.raises(OSError):
            (folder / "probe").write_text("")  # the folder really is read-only
        with pytest.warns(RuntimeWarning, match=r"run store .*project/runs.sqlite is unusable \(unable to open "
                                                r"database file\); training goes on"):
            assert RunStore(folder / "runs.sqlite").record(run) is None
        with pytest.raises(StoreError, match=r"cannot read the run store .*project/runs.sqlite"):
            RunStore(folder / "runs.sqlite").runs()
    assert RunStore(folder / "runs.sqlite").record(run) == 1  # writable again: recording resumes


def test_a_store_whose_folder_is_a_file_warns_and_training_goes_on(tmp_path, run):
    (tmp_path / "notes").write_text("a file, not a folder")
    with pytest.warns(RuntimeWarning, match=r"run store .*notes/runs.sqlite is unusable \(.*\); training goes on"):
        assert RunStore(tmp_path / "notes" / "runs.sqlite").record(run) is None
    with pytest.raises(StoreError, match=r"cannot read the run store .*notes/runs.sqlite"):
        RunStore(tmp_path / "notes" / "runs.sqlite").runs()
