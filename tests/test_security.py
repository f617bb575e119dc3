"""No shell ever sees a user's value; servers listen on 127.0.0.1; run directories are private,
removed after the run, and the only place workers read code from."""
import ast
import os
import re
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from nbtrain import MetricsLog, TrainConfig
from nbtrain.api import engine_for
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launch import fit_distributed, launch
from nbtrain.distributed.rundir import RunDir
from nbtrain.runs.store import RunStore

from helpers import kernel_helpers

ROOT = Path(__file__).resolve().parent.parent
SCANNED = [ROOT / "nbtrain", ROOT / "scripts", ROOT / "benchmarks"]
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
# Names a shell would act on: each would create `pwned` (or remove `x`) in the working folder.
HOSTILE = ["a;touch pwned", "$(touch pwned)", "`touch pwned`", "it's \"quoted\"", "with spaces && touch pwned",
           "x; rm -rf x", "ünïcødé | touch pwned"]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- no shell strings --------------------------------------------------------------------------

def _python_files():
    for folder in SCANNED:
        yield from sorted(folder.rglob("*.py"))


def _shell_uses(path: Path) -> list[str]:
    """Every call in `path` that hands a shell a string: shell=True, os.system / os.popen, or a
    subprocess call whose command is a string rather than a list of arguments."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        if any(k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
               for k in node.keywords):
            found.append(f"{where} shell=")
        if owner == "os" and name in {"system", "popen"} or name in {"getoutput", "getstatusoutput"}:
            found.append(f"{where} {owner}.{name}")
        if owner == "subprocess" and name in SUBPROCESS_CALLS and node.args and \
                isinstance(node.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp)):
            found.append(f"{where} subprocess.{name} with a string command")
    return found


def test_the_scan_finds_each_kind_of_shell_use(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent("""
        import os, subprocess
        subprocess.run("ls " + name)
        subprocess.Popen(["ls"], shell=True)
        subprocess.check_output(f"ls {name}")
        os.system("ls")
        os.popen("ls")
        subprocess.run(["ls", name])
    """))
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        uses = _shell_uses(sample)
    finally:
        ROOT = saved
    assert [u.split(" ", 1)[1] for u in uses] == ["subprocess.run with a string command", "shell=",
                                                 "subprocess.check_output with a string command", "os.system",
                                                 "os.popen"]


def test_no_shell_strings_in_the_package_scripts_or_benchmarks():
    files = list(_python_files())
    assert len(files) > 30  # the scan really read the package
    uses = [use for path in files for use in _shell_uses(path)]
    assert uses == []
    texts = "\n".join(p.read_text() for p in files)
    assert not re.search(r"shell\s*=\s*True|os\.system\(|os\.popen\(", texts)


# --- hostile names through the store, checkpoints and the magic ----------------------------------

@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").write_text("still here")
    yield tmp_path
    assert not list(tmp_path.rglob("pwned")), "a shell string was executed"
    assert (tmp_path / "x").read_text() == "still here"


@pytest.fixture(scope="module")
def trained():
    recipe = digits_recipe()
    return recipe, engine_for(recipe, TrainConfig(accelerator="cpu", max_steps=2, batch_size=16)).run()


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_names_and_store_paths_are_stored_as_plain_text(workdir, trained, hostile):
    _, result = trained
    store = RunStore(workdir / hostile / "runs.sqlite")
    run_id = store.record(result, name=hostile, model=hostile)
    assert run_id is not None
    assert store.load(hostile).name == hostile
    assert [r.name for r in store.runs()] == [hostile]
    assert (workdir / hostile / "runs.sqlite").exists()  # the literal folder, nothing interpreted


@pytest.mark.parametrize("hostile", HOSTILE[:4])
def test_hostile_checkpoint_folders_are_literal_folders_and_resume_from_them(workdir, hostile):
    folder = workdir / hostile
    config = TrainConfig(accelerator="cpu", max_steps=2, batch_size=16, checkpoint_every=1,
                         checkpoint_dir=str(folder))
    recipe = digits_recipe()
    engine_for(recipe, config).run()
    written = sorted(p.name for p in folder.rglob("*.pt"))
    assert written, list(workdir.rglob("*"))
    resumed = digits_recipe()
    result = engine_for(resumed, config.replace(resume="last", max_steps=1)).run()
    assert result.status == "completed"


@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_magic_refuses_hostile_names_and_uses_hostile_store_paths_literally(ip, workdir, hostile):
    cell = ("\nfrom nbtrain.demo import DigitsDataset, DigitsMLP\nimport torch\nmodel = DigitsMLP()\n"
            "train_data = DigitsDataset()\nloss_fn = torch.nn.CrossEntropyLoss()\n")
    quoted = hostile.replace("'", "'\"'\"'")  # one shell word, as a user would quote it
    with capture_output():
        refused = ip.run_cell(f"%%nbtrain --max-steps 1 --name '{quoted}'" + cell)
    assert isinstance(refused.error_in_exec, UsageError)
    with capture_output():
        stored = ip.run_cell(f"%%nbtrain --max-steps 1 --no-plot --no-progress --store '{quoted}/runs.sqlite' "
                             f"--checkpoint-every 1 --checkpoint-dir '{quoted}/checkpoints'" + cell)
    assert stored.success
    assert RunStore(workdir / hostile / "runs.sqlite").runs()[0].status == "completed"
    assert list((workdir / hostile / "checkpoints").rglob("*.pt"))  # the literal folder holds the checkpoint


# --- what listens, and where run directories live ------------------------------------------------

def _ours():
    idle = kernel_helpers()
    return [psutil.Process()] + [p for p in psutil.Process().children(recursive=True) if p.pid not in idle]


def _listening(processes):
    found = []
    for process in processes:
        try:
            found += [(process.pid, c.laddr.ip) for c in process.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:  # a short-lived helper ended meanwhile
            pass
    return found


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def _slow_step(model, batch):
    # Steps slow enough that the ranks are still running when the kernel sees the first metrics.
    time.sleep(0.05)
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.mark.slow
def test_a_ddp_run_listens_only_on_127_0_0_1_and_keeps_its_files_private_then_removes_them(private_tmp):
    seen = {}

    def look(event, _log):
        if event["type"] == "steps" and not seen:
            seen["listening"] = _listening(_ours())
            seen["ranks"] = len(_ours()) - 1
            runs = list(private_tmp.glob("nbtrain-run-*"))
            seen["runs"] = runs
            seen["modes"] = {p.name: stat.S_IMODE(os.lstat(p).st_mode) for r in runs for p in [r, *r.iterdir()]}

    log = MetricsLog()
    log.subscribe(look)
    recipe = digits_recipe()
    recipe.training_step = _slow_step
    fit_distributed(recipe, TrainConfig(devices=2, accelerator="cpu", max_steps=20, batch_size=16,
                                        log_every_n_steps=1), log=log, echo=False)
    assert seen["ranks"] >= 2
    assert seen["listening"], "the launcher's rendezvous store was not seen listening"
    assert {ip for _, ip in seen["listening"]} == {"127.0.0.1"}, seen["listening"]
    assert len(seen["runs"]) == 1
    run = seen["runs"][0]
    assert seen["modes"][run.name] == 0o700
    # The inputs the workers run are the owner's alone; the workers' outputs sit inside the 0700 folder.
    assert {seen["modes"][name] for name in ("recipe.pkl", "config.json", "launch.json")} == {0o600}
    assert not run.exists()  # removed after the run


def _bound_host():
    import os
    return os.environ["MASTER_ADDR"]


def test_the_rendezvous_binds_the_host_the_user_names_and_127_0_0_1_otherwise():
    assert launch(_bound_host, nprocs=2) == "127.0.0.1"
    assert launch(_bound_host, nprocs=2, host="localhost") == "localhost"


KERNEL = textwrap.dedent("""
    from nbtrain import MetricsLog, TrainConfig
    from nbtrain.demo import digits_recipe
    from nbtrain.distributed.launch import fit_distributed
    log = MetricsLog()
    def report(event, _log):
        if event["type"] == "steps" and not getattr(report, "done", False):
            report.done = True
            print("training", flush=True)
    log.subscribe(report)
    fit_distributed(digits_recipe(), TrainConfig(devices=2, accelerator="cpu", max_epochs=500, batch_size=16),
                    log=log, echo=False)
""")


@pytest.mark.slow
def test_a_sigkilled_kernels_run_directory_is_removed_by_its_workers(private_tmp):
    env = {**os.environ, "TMPDIR": str(private_tmp), "OMP_NUM_THREADS": "1"}
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=True)
    try:
        assert kernel.stdout.readline().strip() == "training"
        assert len(list(private_tmp.glob("nbtrain-run-*"))) == 1
        kernel.kill()
        kernel.wait(10)
        deadline = time.monotonic() + 15
        while list(private_tmp.glob("nbtrain-run-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(private_tmp.glob("nbtrain-run-*")) == []
    finally:
        kernel.kill()
        kernel.wait(10)


def test_workers_read_code_only_from_a_private_run_directory(private_tmp):
    run = RunDir.create(backend="gloo", function=_bound_host)
    try:
        assert stat.S_IMODE(os.stat(run.path).st_mode) == 0o700
        fn, args = run.function()  # private: read
        assert fn.__name__ == "_bound_host" and args == ()
        os.chmod(run.path, 0o775)  # the group could now replace the pickle
        with pytest.raises(PermissionError, match=r"refusing to load function.pkl from .*: a run directory and its "
                                                  r"files must be owned by uid \d+, writable by no one else.* is 0o775"):
            run.function()
        os.chmod(run.path, 0o700)
        os.chmod(run.path / "function.pkl", 0o666)
        with pytest.raises(PermissionError, match=r"function.pkl is 0o666"):
            run.function()
        os.chmod(run.path / "function.pkl", 0o600)
        (run.path / "elsewhere.pkl").write_bytes((run.path / "function.pkl").read_bytes())
        (run.path / "function.pkl").unlink()
        (run.path / "function.pkl").symlink_to(run.path / "elsewhere.pkl")
        with pytest.raises(PermissionError, match="and not symlinks; function.pkl is 0o777"):
            run.function()
    finally:
        run.remove()
    assert not run.path.exists()
