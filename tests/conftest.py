import os
from pathlib import Path

import pytest
import torch
from slurm_fixture import slurm_cluster  # noqa: F401  (one private SLURM cluster for the whole session)

# Two cores are shared by the whole suite: one intra-op thread keeps runs predictable.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The libraries every run imports, moved out of the garbage collector's walk before any test module is imported.
# A full collection (IPython's reset before each `ip` test, a trial's release_memory, Python's own) walked their
# ~0.7 million objects, ~0.14 s each time: a quarter of the fast subset's time. gc.freeze keeps alive only what is
# alive now (modules and their objects, alive for the whole run anyway); every object a test or nbtrain makes later is
# collected as before. Not later than this: nbtrain's leak finder names a test module's global list by
# gc.get_referrers, which does not see frozen objects.
_FROZEN_IMPORTS = ("torch._dynamo", "IPython.core.interactiveshell", "sklearn.datasets", "matplotlib", "nbtrain")
_FROZEN_WITH_THEIR_TESTS = ("lightning", "ray")  # imported by their test modules: only where a folder is collected


def pytest_configure(config):
    import gc
    import importlib
    import importlib.util
    if gc.get_freeze_count():
        return  # frozen once per process (pytester's in-process runs load this file again)
    folders = not config.args or any(Path(a.split("::")[0]).is_dir() for a in config.args)
    for name in _FROZEN_IMPORTS + (_FROZEN_WITH_THEIR_TESTS if folders else ()):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    gc.collect()  # nothing that is garbage already is kept
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    _SLOW.update(item.nodeid for item in items if item.get_closest_marker("slow"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shell():
    """A real IPython shell with the extension loaded (one per test session: IPython keeps a singleton)."""
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbtrain")
    ip.run_line_magic("colors", "nocolor")
    return ip


@pytest.fixture
def ip(shell, tmp_path, monkeypatch):
    """The session's shell as a fresh notebook for one test: an empty namespace, no %nbtrain defaults, a
    run store of the test's own (NBTRAIN_STORE = tmp_path/runs.sqlite) and tmp_path as the working folder
    (.nbtrain/ and relative paths land there). Afterwards its %nbtrain defaults are cleared again (its names
    stay until the next test that asks for `ip`: emptying the namespace costs a garbage collection)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBTRAIN_STORE", str(tmp_path / "runs.sqlite"))
    shell.reset(new_session=False)
    shell.run_line_magic("nbtrain", "--reset")
    yield shell
    shell.run_line_magic("nbtrain", "--reset")


@pytest.fixture
def cpu_load():
    """A CPU-bound process beside the test for as long as it runs (its pids are yielded, so leak checks can
    leave it out). Races between processes — a rank ending while a peer is still connecting — show up here
    rather than first on a busy CI machine. NBTRAIN_CPU_LOAD sets how many (default 1)."""
    import subprocess
    import sys
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(int(os.environ.get("NBTRAIN_CPU_LOAD", "1")))]
    try:
        yield [b.pid for b in burners]
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


@pytest.fixture(autouse=True)
def sigint_handler_kept():
    """Every test leaves Ctrl-C as it found it: a handler left behind by a run (the engine's
    stop-at-the-next-step handler) would swallow the kernel's next interrupt."""
    import signal
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)  # the next tests run with the usual Ctrl-C
        pytest.fail(f"the test left SIGINT handled by {after!r} (was {before!r})", pytrace=False)


# --- the suite's time: the fast subset's (`-m "not slow"`) and all of it, printed at the end (CI shows both) ---

_SLOW: set = set()  # node ids of the tests marked slow
_SECONDS = {"fast": 0.0, "slow": 0.0}
_COUNTS = {"fast": 0, "slow": 0}


_DESELECTED = {"count": 0}


def pytest_deselected(items):
    _DESELECTED["count"] += len(items)


def what_ran(config) -> str:
    """'whole suite', or the subset this run chose: its paths, -m and -k, and how many tests they left out."""
    chosen = []
    root = config.rootpath
    testpaths = {(root / p).resolve() for p in config.getini("testpaths")} | {root.resolve()}
    paths = [a.split("::")[0] for a in config.args]
    if any(Path(p if Path(p).is_absolute() else config.invocation_params.dir / p).resolve() not in testpaths
           for p in paths) or any("::" in a for a in config.args):
        chosen.append(" ".join(str(a) for a in config.args))
    chosen += [f'-m "{config.option.markexpr}"'] if config.option.markexpr else []
    chosen += [f'-k "{config.option.keyword}"'] if config.option.keyword else []
    if _DESELECTED["count"]:
        chosen.append(f"{_DESELECTED['count']} deselected")
    return f"this run ({', '.join(chosen)})" if chosen else "whole suite"


def pytest_runtest_logreport(report):
    kind = "slow" if report.nodeid in _SLOW else "fast"
    _SECONDS[kind] += report.duration  # setup, call and teardown, each reported once
    _COUNTS[kind] += report.when == "setup"


@pytest.hookimpl(trylast=True)  # after the slowest tests (pyproject's --durations): the suite's time ends the output
def pytest_terminal_summary(terminalreporter):
    if not _COUNTS["fast"] + _COUNTS["slow"]:
        return  # nothing ran (--collect-only, or nothing selected)
    def spent(kind):
        return f"{_SECONDS[kind]:.0f} s ({_SECONDS[kind] / 60:.1f} min) in {_COUNTS[kind]} tests"
    terminalreporter.write_sep("-", "test time (setup, call and teardown of each test)")
    terminalreporter.write_line(f"fast subset, not marked slow (pytest -m \"not slow\"): {spent('fast')}")
    terminalreporter.write_line(f"marked slow: {spent('slow')}")
    _SECONDS["all"], _COUNTS["all"] = _SECONDS["fast"] + _SECONDS["slow"], _COUNTS["fast"] + _COUNTS["slow"]
    terminalreporter.write_line(f"{what_ran(terminalreporter.config)}: {spent('all')}")


@pytest.fixture
def fails_with(ip, capsys):
    """Runs a cell that must fail with one UsageError and no traceback; gives its text (stdout + stderr)."""
    from IPython.core.error import UsageError

    def run(cell: str) -> str:
        result = ip.run_cell(cell)
        out = capsys.readouterr()
        assert isinstance(result.error_in_exec, UsageError), (out.out, out.err)
        text = out.out + out.err
        assert "Traceback" not in text
        return text
    return run
