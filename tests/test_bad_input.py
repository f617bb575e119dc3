"""A corpus of bad inputs at every place a user types: the magic's flags and cell, TrainConfig,
the panel's fields and the launcher's arguments.

Every case must end with one clear message naming what was wrong and what is allowed (asserted
on its text), show no nbtrain source frames, leave the kernel (shell) usable, and leave no child
process and no nbtrain temporary file behind. The last test prints how many cases were tried
and passed.
"""
import os
import re
import sys
import tempfile
import threading
import time
import warnings

import cloudpickle
import psutil
import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import nbtrain
from nbtrain import TrainConfig
from nbtrain.config import check_runnable
from nbtrain.options import ConfigError
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launch import fit_distributed, launch
from nbtrain.distributed.launchers.base import WorkerError
from nbtrain.recipe import Recipe

from helpers import kernel_helpers

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NBTRAIN_SOURCE = re.compile(r"nbtrain/[\w/]+\.py")  # a frame of nbtrain's own code in shown text
TALLY = {"tried": 0, "passed": 0}
CORES = os.cpu_count() or 1


# --- the checks every case shares ---------------------------------------------------------

def _temp_entries() -> set:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(("nbtrain", ".nbtrain"))}


def _children() -> set:
    idle = kernel_helpers()  # the warm worker starter and the drawing process live as long as the kernel
    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in idle and child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def private_tmp(tmp_path_factory):
    """A temp folder only this module uses, so other test runs on the machine cannot blur the listing."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    old_env, old_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    yield folder
    tempfile.tempdir = old_tempdir
    if old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old_env


class Case:
    done = False


@pytest.fixture
def case(private_tmp, tmp_path, monkeypatch):
    """Counts the case; after it, no new child process and no new nbtrain temp entry."""
    monkeypatch.chdir(tmp_path)  # a shell string run by mistake would act here (see the markers)
    TALLY["tried"] += 1
    temp, kids = _temp_entries(), _children()
    state = Case()
    yield state
    deadline = time.monotonic() + 15
    while _children() - kids and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children() - kids == set(), "a process was left behind"
    assert _temp_entries() - temp == set(), "a temporary file was left behind"
    assert not (tmp_path / "pwned").exists(), "a shell string was executed"
    if state.done:
        TALLY["passed"] += 1


def no_nbtrain_frames(text: str) -> None:
    assert not NBTRAIN_SOURCE.search(text), text


# --- the magic, through a real IPython shell -----------------------------------------------

def body(model="nn.Linear(10, 4)", data="TensorDataset(torch.randn(32, 10), torch.randint(0, 4, (32,)))",
         loss="nn.CrossEntropyLoss()", extra=""):
    return (f"\nimport torch\nfrom torch import nn\nfrom torch.utils.data import Dataset, TensorDataset\n{extra}"
            + (f"model = {model}\n" if model else "") + (f"train_data = {data}\n" if data else "")
            + (f"loss_fn = {loss}\n" if loss else ""))


BAD_ITEMS = """
class MissingSamples(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        raise KeyError(f"sample {i} is missing")
"""
OK = body()
QUIET = "--max-steps 2 --no-plot --no-progress "

# (id, flags, cell body, variables set first, what shows: "usage" one line | "user" the user's error |
#  "note" a completed cell with a message, expected texts)
MAGIC_CASES = [
    ("batch-zero", "--batch-size 0", OK, {}, "usage", ["--batch-size=0", "a whole number from 1 to 16777216"]),
    ("batch-negative", "--batch-size -5", OK, {}, "usage", ["--batch-size=-5", "a whole number from 1"]),
    ("batch-huge", "--batch-size 1000000000000", OK, {}, "usage", ["--batch-size=1000000000000", "to 16777216"]),
    ("batch-word", "--batch-size lots", OK, {}, "usage", ["--batch-size=lots", "a whole number"]),
    ("batch-empty", "--batch-size ''", OK, {}, "usage", ["--batch-size=", "a whole number from 1"]),
    ("batch-missing-value", "--batch-size", OK, {}, "usage", ["--batch-size", "expected one argument", "allowed"]),
    ("precision-unknown", "--precision fp8", OK, {}, "usage", ["--precision=fp8", "one of 32-true, 16-mixed"]),
    ("fp16-on-cpu", "--precision 16-mixed --accelerator cpu", OK, {}, "usage",
     ["--precision=16-mixed", "needs a CUDA GPU", "use 32-true or bf16-mixed"]),
    ("accelerator-unknown", "--accelerator tpu", OK, {}, "usage", ["--accelerator=tpu", "one of auto, cpu, cuda"]),
    ("accelerator-unicode", "--accelerator ünïcødé", OK, {}, "usage", ["--accelerator=ünïcødé", "one of auto"]),
    ("devices-zero", "--devices 0", OK, {}, "usage", ["--devices=0", "a whole number >= 1"]),
    ("devices-over-cores", "--devices 64 --accelerator cpu", OK, {}, "usage",
     ["--devices=64", f"at most {CORES} CPU processes"]),
    ("accumulate-with-zero-steps", "--max-steps 0 --accumulate-grad-batches 4", OK, {}, "usage",
     ["--max-steps=0", "a whole number >= 1, or None"]),
    ("accumulate-zero", "--accumulate-grad-batches 0", OK, {}, "usage", ["--accumulate-grad-batches=0", ">= 1"]),
    ("epochs-negative", "--max-epochs -1", OK, {}, "usage", ["--max-epochs=-1", "a whole number >= 1"]),
    ("lr-negative", "--lr -0.1", OK, {}, "usage", ["--lr=-0.1", "a number > 0"]),
    ("lr-nan", "--lr nan", OK, {}, "usage", ["--lr=nan", "a number > 0"]),
    ("lr-inf", "--lr inf", OK, {}, "usage", ["--lr=inf", "a number > 0"]),
    ("workers-negative", "--num-workers -1", OK, {}, "usage", ["--num-workers=-1", "from 0 to 256"]),
    ("workers-huge", "--num-workers 100000", OK, {}, "usage", ["--num-workers=100000", "from 0 to 256"]),
    ("seed-negative", "--seed -1", OK, {}, "usage", ["--seed=-1", "a whole number >= 0"]),
    ("scale-lr-without-base", "--scale-lr linear", OK, {}, "usage", ["--scale-lr=linear", "needs base_batch_size"]),
    ("persistent-without-workers", "--persistent-workers true", OK, {}, "usage",
     ["--persistent-workers=True", "needs num_workers >= 1"]),
    ("prefetch-without-workers", "--prefetch-factor 2", OK, {}, "usage", ["--prefetch-factor=2", "needs num_workers"]),
    ("dataparallel-without-gpus", "--strategy dp --accelerator cpu", OK, {}, "usage",
     ["--strategy=dp", "DataParallel needs at least 2 CUDA devices"]),
    ("compile-unknown", "--compile turbo", OK, {}, "usage", ["--compile=turbo", "one of none, default"]),
    ("checkpoint-every-zero", "--checkpoint-every 0", OK, {}, "usage", ["--checkpoint-every=0", "N optimizer steps"]),
    ("checkpoint-every-negative", "--checkpoint-every=-5m", OK, {}, "usage", ["--checkpoint-every=-5m", "90s / 10m"]),
    ("checkpoint-every-dash-value", "--checkpoint-every -5m", OK, {}, "usage",
     ["argument --checkpoint-every: expected one argument", "allowed: N optimizer steps, a duration such as 90s"]),
    ("checkpoint-every-word", "--checkpoint-every soon", OK, {}, "usage", ["--checkpoint-every=soon", "a duration"]),
    ("log-every-zero", "--log-every-n-steps 0", OK, {}, "usage", ["--log-every-n-steps=0", "a whole number >= 1"]),
    ("clip-zero", "--gradient-clip-val 0", OK, {}, "usage", ["--gradient-clip-val=0", "a number > 0"]),
    ("name-shell-metacharacters", "--name 'a;rm -rf x'", OK, {}, "usage",
     ["--name 'a;rm -rf x'", "allowed: a Python variable name"]),
    ("name-command-substitution", "--name '$(touch pwned)'", OK, {}, "usage", ["allowed: a Python variable name"]),
    ("name-unicode-space", "--name 'ünï code'", OK, {}, "usage", ["--name 'ünï code'", "a Python variable name"]),
    ("name-keyword", "--name class", OK, {}, "usage", ["--name 'class'", "a Python variable name"]),
    ("resume-command-substitution", "--resume '$(touch pwned)'", OK, {}, "usage",
     ["resume='$(touch pwned)': no such checkpoint file", "allowed: a file written by checkpoint_every"]),
    ("resume-missing-file", "--resume '/no such/dir/ck.pt'", OK, {}, "usage", ["no such checkpoint file"]),
    ("precision-command-substitution", "--precision '$(touch pwned)'", OK, {}, "usage",
     ["--precision=$(touch pwned)", "one of 32-true"]),
    ("flag-unknown", "--bogus-flag 3", OK, {}, "usage", ["unknown flag --bogus-flag 3; allowed: the flags that %%nbtrain? lists"]),
    ("flag-abbreviated", "--batch 64", OK, {}, "usage", ["unknown flag --batch 64 (did you mean --batch-size?)"]),
    ("stray-value", "64", OK, {}, "usage", ["unexpected value '64'", "allowed: flags written --flag VALUE"]),
    ("unbalanced-quote", "--name 'abc", OK, {}, "usage", ["cannot read the flags", "No closing quotation"]),
    ("config-variable-missing", "--config nothing_here", OK, {}, "usage", ["no variable named 'nothing_here'"]),
    ("config-variable-list", "--config cfg", OK, {"cfg": [1, 2]}, "usage", ["--config cfg: got a list",
                                                                          "allowed: a dict of options"]),
    ("config-unknown-key", "--config cfg", OK, {"cfg": {"batchsize": 3}}, "usage",
     ["--batchsize=3: unknown option", "did you mean 'batch_size'?"]),
    ("config-wrong-type", "--config cfg", OK, {"cfg": {"batch_size": [1, 2]}}, "usage",
     ["--batch-size=[1, 2]", "a whole number"]),
    ("lr-in-namespace-negative", QUIET, OK + "lr = -1\n", {}, "usage", ["lr (in the namespace)=-1", "a number > 0"]),
    # --- the recipe the cell defines
    ("no-model", QUIET, body(model=""), {}, "usage", ["defines no model", "define `model`"]),
    ("model-not-a-module", QUIET, body(model="3"), {}, "usage", ["model: got int; allowed: a torch.nn.Module"]),
    ("data-empty", QUIET, body(data="[]"), {}, "usage", ["train_data: the dataset is empty"]),
    ("data-not-a-dataset", QUIET, body(data="5"), {}, "usage", ["train_data: got int; allowed: a map-style Dataset"]),
    ("loss-not-callable", QUIET, body(loss="3"), {}, "usage", ["loss_fn: got int; allowed: a function"]),
    ("optimizer-a-word", QUIET, OK + "optimizer = 'adam'\n", {}, "usage",
     ["optimizer: got str; allowed: a function params -> torch.optim.Optimizer"]),
    ("optimizer-wrong-arity", QUIET, OK + "optimizer = lambda: 3\n", {}, "usage",
     ["optimizer: calling it with the parameters failed", "allowed: a function params -> torch.optim.Optimizer"]),
    ("optimizer-returns-a-number", QUIET, OK + "optimizer = lambda p: 3\n", {}, "usage",
     ["optimizer: the factory returned a int", "allowed: a function params -> torch.optim.Optimizer"]),
    ("items-not-pairs", QUIET, body(data="TensorDataset(torch.randn(32, 10))"), {}, "usage",
     ["train_data items must be (input, target) pairs", "define training_step(model, batch)"]),
    ("loss-not-scalar", QUIET, body(loss="nn.CrossEntropyLoss(reduction='none')"), {}, "usage",
     ["loss_fn(model(x), y) returned a tensor of shape (32,)", "allowed: one scalar (0-dim) tensor"]),
    ("loss-a-python-float", QUIET, body(loss="lambda out, y: 1.5"), {}, "usage",
     ["loss_fn(model(x), y) returned a float", "allowed: one scalar (0-dim) tensor"]),
    ("training-step-not-scalar", QUIET, OK + "def training_step(model, batch):\n    return model(batch[0])\n", {},
     "usage", ["training_step(model, batch) returned a tensor of shape (32, 4)", "allowed: one scalar"]),
    ("cell-syntax-error", QUIET, "\nx = (\n", {}, "usage", ["the cell body is not valid Python: incomplete input on cell line 3: x = ("]),
    ("shape-mismatch", QUIET, body(model="nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))"), {},
     "user", ["mat1 and mat2 shapes cannot be multiplied (32x10 and 64x32)",
              "the failing batch held inputs: float32 tensor of shape (32, 10); targets: int64 tensor of shape (32,)"]),
    ("float-targets-for-cross-entropy", QUIET, body(data="TensorDataset(torch.randn(32, 10), torch.rand(32))"), {},
     "user", ["expected target dtype to be Long", "targets: float32 tensor of shape (32,)"]),
    ("dataset-raises", QUIET, body(data="MissingSamples()", extra=BAD_ITEMS), {}, "user",
     ["KeyError: 'sample", "is missing'", "Cell In[", "in MissingSamples.__getitem__"]),
    ("dataset-raises-in-a-loader-worker", QUIET + "--num-workers 1", body(data="MissingSamples()", extra=BAD_ITEMS),
     {}, "user", ["Caught KeyError in DataLoader worker process 0", "in __getitem__", "is missing'"]),
    ("cell-raises", QUIET, OK + "oops = undefined_name + 1\n", {}, "user",
     ["NameError", "name 'undefined_name' is not defined", "Cell In["]),
    ("loss-nan", QUIET + "--max-steps 4 --log-every-n-steps 1", body(loss="lambda out, y: out.sum() * float('nan')"),
     {}, "note", ["failed — the loss became nan at step 1 (32-true)", "lower the learning rate"]),
    ("store-is-a-folder", QUIET + "--store .", OK, {}, "note",
     ["the run store . is unusable", "training goes on", "not recorded: the run store is unusable"]),
]


@pytest.mark.parametrize("flags, cell, variables, shows, expected",
                         [c[1:] for c in MAGIC_CASES], ids=[c[0] for c in MAGIC_CASES])
def test_bad_input_to_the_magic_gets_one_clear_message(ip, case, tmp_path, flags, cell, variables, shows,
                                                       expected):
    (tmp_path / "x").write_text("still here")  # `rm -rf x` run by mistake would remove it
    ip.user_ns.update(variables)
    with capture_output() as shown, warnings.catch_warnings():
        # Shown as a kernel shows warnings (pytest would otherwise only record them).
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        result = ip.run_cell(f"%%nbtrain {flags}\n{cell}")
    text = shown.stdout + shown.stderr + "".join(o.data.get("text/plain", "") for o in shown.outputs)
    for piece in expected:
        assert piece in text, text
    no_nbtrain_frames(text)
    if shows == "usage":
        assert isinstance(result.error_in_exec, UsageError), text
        assert "Traceback" not in text and text.count("UsageError") == 1, text
    elif shows == "user":
        assert result.error_in_exec is not None and not isinstance(result.error_in_exec, UsageError), text
        assert "Traceback" in text  # the user's own frames (or torch's, where no user frame is involved)
    else:
        assert result.success, text
    assert (tmp_path / "x").read_text() == "still here"
    after = ip.run_cell("1 + 1")  # the kernel still works
    assert after.success and after.result == 2
    case.done = True


# --- TrainConfig, the Python API -------------------------------------------------------------

CONFIG_CASES = [
    ("batch-huge", dict(batch_size=10**12), ["batch_size=1000000000000: a whole number from 1 to 16777216"]),
    ("batch-fraction", dict(batch_size=3.5), ["batch_size=3.5: a whole number"]),
    ("batch-bool", dict(batch_size=True), ["batch_size=True: a whole number"]),
    ("batch-none", dict(batch_size=None), ["batch_size=None: a whole number"]),
    ("batch-list", dict(batch_size=[32]), ["batch_size=[32]: a whole number"]),
    ("batch-empty-text", dict(batch_size=""), ["batch_size='': a whole number"]),
    ("precision-unknown", dict(precision="fp8"), ["precision='fp8': one of 32-true, 16-mixed, bf16-mixed"]),
    ("fp16-on-cpu", dict(precision=16, accelerator="cpu"), ["precision='16-mixed': 16-mixed needs a CUDA GPU"]),
    ("devices-over-cores", dict(accelerator="cpu", devices=99), [f"devices=99: at most {CORES} CPU processes"]),
    ("accumulate-with-zero-steps", dict(max_steps=0, accumulate_grad_batches=4), ["max_steps=0: a whole number"]),
    ("lr-nan", dict(lr=float("nan")), ["lr=nan: a number > 0"]),
    ("lr-word", dict(lr="fast"), ["lr='fast': a number > 0"]),
    ("seed-negative", dict(seed=-1), ["seed=-1: a whole number >= 0"]),
    ("option-unknown", dict(batchsize=3), ["batchsize=3: unknown option; did you mean 'batch_size'?"]),
    ("folder-with-nul", dict(checkpoint_dir="a\0b"), ["checkpoint_dir='a\\x00b': a folder path"]),
    ("folder-a-number", dict(checkpoint_dir=123), ["checkpoint_dir=123: a folder path"]),
    ("submodules-with-shell", dict(activation_checkpointing="a; rm -rf x"), ["activation_checkpointing='a; rm -rf x'",
                                                                            "submodule names separated by commas"]),
    ("checkpoint-every-word", dict(checkpoint_every="soon"), ["checkpoint_every='soon': N optimizer steps"]),
    ("persistent-without-workers", dict(persistent_workers=True), ["persistent_workers=True: needs num_workers >= 1"]),
    ("nonfinite-policy-unknown", dict(on_nonfinite_loss="ignore"), ["on_nonfinite_loss='ignore': one of stop"]),
    ("several-at-once", dict(batch_size=0, lr=-1, precision="x"),
     ["precision='x'", "batch_size=0", "lr=-1", "invalid training configuration\n"]),
]


@pytest.mark.parametrize("values, expected", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_values_raise_one_config_error_naming_each(case, values, expected):
    with pytest.raises(ConfigError) as caught:  # values when the config is made; hardware when a run checks here
        check_runnable(TrainConfig.from_dict(values))
    for piece in expected:
        assert piece in str(caught.value)
    assert caught.value.problems  # one error carrying every problem
    assert TrainConfig(accelerator="cpu", batch_size=8).batch_size == 8  # nothing is left half-set
    case.done = True


def test_replace_checks_the_new_value_the_same_way(case):
    with pytest.raises(ConfigError, match=r"batch_size=0: a whole number from 1 to 16777216"):
        TrainConfig(accelerator="cpu").replace(batch_size=0)
    case.done = True


# --- the panel's fields ----------------------------------------------------------------------

def _set(**fields):
    def apply(panel):
        for name, value in fields.items():
            if name == "precision":
                panel.controls.precision.select(value)
            else:
                getattr(panel.controls, name).value = value
    return apply


PANEL_CASES = [
    ("batch-empty", _set(batch_size=""), "batch_size='': a whole number from 1 to 16777216"),
    ("batch-negative", _set(batch_size="-1"), "batch_size='-1': a whole number from 1 to 16777216"),
    ("batch-zero", _set(batch_size="0"), "batch_size='0': a whole number from 1"),
    ("batch-huge", _set(batch_size="1000000000000"), "batch_size='1000000000000': a whole number from 1 to 16777216"),
    ("batch-word", _set(batch_size="lots"), "batch_size='lots': a whole number"),
    ("batch-fraction", _set(batch_size="3.5"), "batch_size='3.5': a whole number"),
    ("batch-unicode", _set(batch_size="ünï"), "batch_size='ünï': a whole number"),
    ("lr-negative", _set(lr="-1"), "lr='-1': a number > 0"),
    ("lr-nan", _set(lr="nan"), "lr='nan': a number > 0"),
    ("lr-shell", _set(lr="1; rm -rf x"), "lr='1; rm -rf x': a number > 0"),
    ("epochs-zero", _set(max_epochs="0"), "max_epochs='0': a whole number >= 1"),
    ("steps-negative", _set(max_steps="-5"), "max_steps='-5': a whole number >= 1"),
    ("accumulate-with-zero-steps", _set(accumulate=4, max_steps="0"), "max_steps='0': a whole number >= 1"),
    ("scale-lr-without-base", _set(base_batch="", scale_lr="linear"), "scale_lr='linear': needs base_batch_size"),
    ("base-batch-word", _set(base_batch="many"), "base_batch_size='many': a whole number >= 1"),
    ("fp16-on-cpu", _set(precision="16-mixed"), "precision='16-mixed': 16-mixed needs a CUDA GPU"),
]


@pytest.fixture
def panel_for():
    made = []

    def make(recipe=None):
        panel = nbtrain.panel(recipe or digits_recipe(), TrainConfig(accelerator="cpu"), display=False)
        made.append(panel)
        return panel

    yield make
    for panel in made:
        panel.close()


@pytest.mark.parametrize("change, expected", [c[1:] for c in PANEL_CASES], ids=[c[0] for c in PANEL_CASES])
def test_bad_panel_fields_show_the_reason_and_run_starts_nothing(case, panel_for, change, expected):
    panel = panel_for()
    change(panel)
    assert expected in panel.status_text, panel.status_text
    panel.run_button.click()
    assert panel.runs == [] and not panel.running
    assert expected in panel.status_text and "#b00020" in panel.status.value  # shown as an error
    no_nbtrain_frames(panel.status_text)
    case.done = True


class MissingSamples(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        raise KeyError(f"sample {i} is missing")


def _recipe(**parts):
    torch.manual_seed(0)
    pieces = dict(model=nn.Linear(10, 4), train_data=TensorDataset(torch.randn(32, 10), torch.randint(0, 4, (32,))),
                  loss_fn=nn.CrossEntropyLoss())
    pieces.update(parts)
    return Recipe(**pieces)


PANEL_RUN_CASES = [
    ("dataset-raises", dict(train_data=MissingSamples()), "run #1 failed: KeyError: 'sample"),
    ("loss-not-scalar", dict(loss_fn=nn.CrossEntropyLoss(reduction="none")),
     "run #1 failed: RecipeError: loss_fn(model(x), y) returned a tensor of shape (32,); allowed: one scalar"),
    ("shape-mismatch", dict(model=nn.Linear(64, 4)),
     "run #1 failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x10 and 64x4)"),
]


@pytest.mark.parametrize("parts, expected", [c[1:] for c in PANEL_RUN_CASES], ids=[c[0] for c in PANEL_RUN_CASES])
def test_a_run_failing_on_bad_data_says_why_in_the_status_line(case, panel_for, parts, expected):
    panel = panel_for(_recipe(**parts))
    panel.controls.max_steps.value = "2"
    panel.run_button.click()
    assert panel.wait(60)
    assert panel.status_text.startswith(expected), panel.status_text
    no_nbtrain_frames(panel.status_text)
    panel.controls.max_steps.value = "3"  # the panel still reacts
    assert panel.status_text.startswith("ready")
    case.done = True


# --- the launcher's arguments ------------------------------------------------------------------

def _world_size():
    import torch.distributed as dist
    return dist.get_world_size()


def _two_nodes(**kw):
    return lambda: fit_distributed(digits_recipe(), TrainConfig(num_nodes=2, accelerator="cpu", max_steps=1), **kw)


LAUNCH_CASES = [
    ("nprocs-zero", lambda: launch(_world_size, nprocs=0), ValueError, "nprocs=0: allowed: a whole number >= 1"),
    ("nprocs-negative", lambda: launch(_world_size, nprocs=-1), ValueError, "nprocs=-1: allowed: a whole number"),
    ("nprocs-text", lambda: launch(_world_size, nprocs="2"), ValueError, "nprocs='2': allowed: a whole number"),
    ("nprocs-bool", lambda: launch(_world_size, nprocs=True), ValueError, "nprocs=True: allowed: a whole number"),
    ("fn-not-callable", lambda: launch("rm -rf x"), TypeError, "launch: fn must be a function, got str"),
    ("backend-unknown", lambda: launch(_world_size, backend="mpi"), ValueError,
     "backend='mpi': allowed: gloo, nccl or None"),
    ("timeout-zero", lambda: launch(_world_size, timeout=0), ValueError, "timeout=0: allowed: a number of seconds > 0"),
    ("timeout-negative", lambda: launch(_world_size, timeout=-5), ValueError, "timeout=-5: allowed: a number"),
    ("timeout-infinite", lambda: launch(_world_size, timeout=float("inf")), ValueError, "timeout=inf: allowed"),
    ("timeout-text", lambda: launch(_world_size, timeout="10"), ValueError, "timeout='10': allowed: a number"),
    ("args-unpicklable", lambda: launch(_world_size, args=(threading.Lock(),)), TypeError,
     "fn and args cannot be sent to the worker processes: cloudpickle failed"),
    ("endpoint-shell", _two_nodes(rdzv_endpoint="a;rm -rf x", node_rank=0), ValueError,
     "rdzv_endpoint='a;rm -rf x': allowed: 'host:port' of the c10d rendezvous"),
    ("endpoint-command-substitution", _two_nodes(rdzv_endpoint="$(touch pwned):29400", node_rank=0), ValueError,
     "rdzv_endpoint='$(touch pwned):29400': allowed: 'host:port'"),
    ("node-rank-too-big", _two_nodes(rdzv_endpoint="127.0.0.1:29999", node_rank=7), ValueError,
     "node_rank=7: allowed: a whole number from 0 to 1"),
    ("host-unknown", lambda: launch(_world_size, host="no such host"), ValueError,
     "host='no such host': allowed: an address of this machine"),
]


@pytest.mark.parametrize("call, error, expected", [c[1:] for c in LAUNCH_CASES], ids=[c[0] for c in LAUNCH_CASES])
def test_bad_launcher_arguments_are_refused_before_any_process_starts(case, call, error, expected):
    with pytest.raises(error) as caught:
        call()
    assert expected in str(caught.value), str(caught.value)
    no_nbtrain_frames(str(caught.value))
    case.done = True


@pytest.mark.slow
def test_a_dataset_raising_in_ddp_ranks_names_the_rank_and_the_users_error(case):
    with pytest.raises(WorkerError) as caught:
        nbtrain.fit(recipe=_recipe(train_data=MissingSamples()), devices=2, accelerator="cpu", max_steps=2,
                    batch_size=4)
    message = str(caught.value)
    assert re.match(r"rank \d raised KeyError: 'sample \d+ is missing'", message), message
    assert "in __getitem__" in message and 'raise KeyError(f"sample {i} is missing")' in message
    no_nbtrain_frames(message)
    assert launch(_world_size, nprocs=2) == 2  # the launcher works again
    case.done = True


# --- the count -----------------------------------------------------------------------------------

CORPUS_SIZE = (len(MAGIC_CASES) + len(CONFIG_CASES) + 1 + len(PANEL_CASES) + len(PANEL_RUN_CASES)
               + len(LAUNCH_CASES) + 1)


def test_zz_bad_input_corpus_count(capsys):
    line = f"bad-input corpus: {TALLY['tried']} tried, {TALLY['passed']} passed"
    with capsys.disabled():
        print("\n" + line)
    if TALLY["tried"] < CORPUS_SIZE:
        pytest.skip(f"only part of the corpus ran ({line})")
    assert CORPUS_SIZE >= 60
    assert TALLY["passed"] == TALLY["tried"], line


def _tiny_fit(config, tool=False):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = TensorDataset(torch.randn(32, 4, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 2)
    if tool:  # a tool takes config= as fit does
        return nbtrain.profile(model, data, loss_fn=nn.CrossEntropyLoss(), steps=2, config=config)
    nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), config=config, accelerator="cpu", shuffle=False)
    return model.weight.detach().clone()


def test_config_may_be_a_dict_of_options_and_anything_else_is_one_error_naming_config():
    # nbtrain.ab(..., config={"max_steps": 5}) ended in AttributeError: 'dict' object has no attribute 'given'.
    assert torch.equal(_tiny_fit({"max_steps": 3, "batch_size": 8}), _tiny_fit(TrainConfig(max_steps=3, batch_size=8)))
    for call in (lambda: _tiny_fit(["max_steps", 3]), lambda: _tiny_fit(["max_steps", 3], tool=True)):
        with pytest.raises(ConfigError, match=r"config.*a TrainConfig, a dict of options"):
            call()
    with pytest.raises(ConfigError, match="max_stpes.*did you mean 'max_steps'"):
        _tiny_fit({"max_stpes": 3})
