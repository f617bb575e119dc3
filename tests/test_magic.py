"""%%nbtrain and friends, through a real IPython InteractiveShell."""
import copy
import warnings

import pytest
import torch
from IPython.utils.capture import capture_output

from nbtrain.config import options
from nbtrain.notebook.magic import build_parser

DIGITS = """
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""





# --- flags -------------------------------------------------------------------------------


def test_every_config_field_is_a_dashed_flag():
    flags = {s for action in build_parser()._actions for s in action.option_strings}
    for name in options():
        assert "--" + name.replace("_", "-") in flags


def test_help_shows_every_flag_and_the_recipe_names(ip, capsys):
    ip.run_cell("%%nbtrain?")
    out = capsys.readouterr().out
    for flag in ("--accumulate-grad-batches", "--precision", "--num-workers", "--name", "--config"):
        assert flag in out
    assert "training_step" in out and "val_data" in out and "`model` and `train_data` are needed" in out
    ip.run_cell("%%nbtrain --help\nran = True")
    assert "--accumulate-grad-batches" in capsys.readouterr().out and "ran" not in ip.user_ns


def test_cell_trains_the_namespace_recipe_and_keeps_the_named_result(ip, capsys):
    result = ip.run_cell("%%nbtrain --max-steps 6 --batch-size 16 --name run_a --no-progress" + DIGITS)
    out = capsys.readouterr().out
    assert result.error_in_exec is None, out
    ns = ip.user_ns
    run_a = ns["run_a"]
    assert run_a is ns["_nbtrain"]
    assert (run_a.status, run_a.summary.steps, run_a.config.batch_size) == ("completed", 6, 16)
    assert "samples/s" in out and "step time by phase" in out
    assert "recorded as run #1 in" in out and "result in run_a and _nbtrain" in out
    assert ns["model"].training and isinstance(ns["model"], torch.nn.Module)


def test_flags_become_the_config(ip):
    ip.run_cell("%%nbtrain --max-steps 3 --accumulate-grad-batches 2 --precision bf16 --pin-memory false "
                "--lr 0.01 --no-plot --no-progress" + DIGITS)
    config = ip.user_ns["_nbtrain"].config
    assert (config.accumulate_grad_batches, config.precision, config.pin_memory, config.lr) == (2, "bf16-mixed",
                                                                                               False, 0.01)
    assert ip.user_ns["_nbtrain"].summary.lr == 0.01


def test_config_variable_supplies_flags_and_the_line_wins(ip):
    ip.user_ns["cfg"] = {"batch-size": 8, "max_steps": 3, "seed": 5}
    ip.run_cell("%%nbtrain --config cfg --batch-size 4 --no-plot --no-progress" + DIGITS)
    config = ip.user_ns["_nbtrain"].config
    assert (config.batch_size, config.max_steps, config.seed) == (4, 3, 5)


def test_lr_in_the_namespace_is_the_base_rate_unless_flagged(ip):
    ip.run_cell("%%nbtrain --max-steps 2 --no-plot --no-progress" + DIGITS + "lr = 0.02\n")
    assert ip.user_ns["_nbtrain"].config.lr == 0.02
    ip.run_cell("%%nbtrain --max-steps 2 --lr 0.5 --no-plot --no-progress\nlr = 0.02")
    assert ip.user_ns["_nbtrain"].config.lr == 0.5


def test_line_magic_sets_defaults_for_later_cells(ip, capsys, fails_with):
    ip.run_cell("%nbtrain --max-steps 2 --batch-size 8 --no-plot --no-progress")
    assert "defaults for later cells: --max-steps 2, --batch-size 8" in capsys.readouterr().out
    ip.run_cell("%%nbtrain" + DIGITS)
    assert ip.user_ns["_nbtrain"].config.batch_size == 8 and ip.user_ns["_nbtrain"].summary.steps == 2
    ip.run_cell("%%nbtrain --batch-size 4" + DIGITS)
    assert ip.user_ns["_nbtrain"].config.batch_size == 4
    text = fails_with("%nbtrain --num-workers -1")
    assert "%nbtrain: invalid training configuration: --num-workers=-1: a whole number from 0 to 256" in text


def test_next_cell_continues_the_same_model_unless_it_builds_one(ip):
    ip.run_cell("%%nbtrain --max-steps 4 --no-plot --no-progress" + DIGITS)
    model = ip.user_ns["model"]
    trained = copy.deepcopy(model.state_dict())
    ip.run_cell("%%nbtrain --max-steps 3 --batch-size 64 --no-plot --no-progress\nnote = 'same model'")
    second = ip.user_ns["_nbtrain"]
    assert ip.user_ns["model"] is model
    assert second.log.last("start")["info"]["step_start"] == 4
    assert second.history["step"] == [5, 6, 7]
    assert any(not torch.equal(trained[k], v) for k, v in model.state_dict().items())
    ip.run_cell("%%nbtrain --max-steps 2 --no-plot --no-progress" + DIGITS)
    assert ip.user_ns["_nbtrain"].log.last("start")["info"]["step_start"] == 0


# --- bad input: one line, nothing runs ----------------------------------------------------


def test_unknown_flag_names_it_and_suggests_nothing_runs(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --max-steps 2 --bath-size 32\nran = True")
    assert ("%%nbtrain: unknown flag --bath-size 32 (did you mean --batch-size?); allowed: the flags that "
            "%%nbtrain? lists") in text
    assert "ran" not in ip.user_ns


def test_every_unknown_flag_is_named_with_its_neighbour_and_the_help_not_all_flags_is_pointed_to(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --bath-size 32 --max-step=3 --no-plott --zzzz 1 7\nran = True")
    line = next(row for row in text.splitlines() if "unknown flags" in row)
    assert line.endswith("%%nbtrain: unknown flags --bath-size 32 (did you mean --batch-size?), --max-step 3 "
                         "(did you mean --max-steps?), --no-plott (did you mean --no-plot?), --zzzz 1, "
                         "unexpected value '7'; allowed: the flags that %%nbtrain? lists"), line
    assert len(line) < 300 and "--precision" not in text  # not a list of every flag
    assert "ran" not in ip.user_ns
    text = fails_with("%nbtrain --bath-size 32")  # the line magic names itself
    assert "%nbtrain: unknown flag --bath-size 32 (did you mean --batch-size?)" in text


def test_bad_values_are_all_named_with_what_is_allowed(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --batch-size 0 --precision fp8\nran = True")
    assert "--batch-size=0: a whole number from 1 to 16777216" in text
    assert "--precision=fp8: one of 32-true, 16-mixed, bf16-mixed" in text
    assert "ran" not in ip.user_ns


def test_bad_combination_is_named(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --persistent-workers\nran = True")
    assert "--persistent-workers=True: needs num_workers >= 1" in text
    assert "ran" not in ip.user_ns


def test_missing_flag_value_says_what_is_allowed(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --max-steps\nran = True")
    assert "argument --max-steps: expected one argument; allowed: a whole number >= 1, or None" in text


def test_stray_value_and_bad_name_and_bad_config_variable(ip, capsys, fails_with):
    assert "unexpected value '64'" in fails_with("%%nbtrain --batch-size 32 64\nx = 1")
    assert "--name 'run a': allowed: a Python variable name" in fails_with("%%nbtrain --name 'run a'\nx = 1")
    assert "--config cfg: no variable named 'cfg'" in fails_with("%%nbtrain --config cfg\nx = 1")
    ip.user_ns["cfg"] = [1, 2]
    assert "--config cfg: got a list; allowed: a dict" in fails_with("%%nbtrain --config cfg\nx = 1")
    ip.user_ns["cfg"] = {"bach_size": 3}
    text = fails_with("%%nbtrain --config cfg\nx = 1")
    assert "--bach-size=3: unknown option; did you mean 'batch_size'?" in text


def test_missing_model_or_data_is_named(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --max-steps 2\nimport torch\nloss_fn = torch.nn.MSELoss()")
    assert "the namespace defines no model and no train_data" in text
    text = fails_with("%%nbtrain --max-steps 2" + DIGITS + "train_data = 5\n")
    assert "train_data: got int; allowed: a map-style Dataset" in text


def test_exception_in_the_cell_shows_the_users_traceback_with_cell_lines(ip, capsys):
    result = ip.run_cell("%%nbtrain --max-steps 2\n\nx = 1\ny = x / 0\n")
    text = capsys.readouterr().out
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert "----> 4 y = x / 0" in text
    assert "magic.py" not in text and "nbtrain" not in text.replace("%%nbtrain", "")


def test_exception_in_user_code_during_training_shows_only_user_frames(ip, capsys):
    cell = ("%%nbtrain --max-steps 3 --no-plot --no-progress" + DIGITS
            + "def training_step(model, batch):\n    x, y = batch\n    return undefined_loss(model(x), y)\n")
    result = ip.run_cell(cell)
    text = capsys.readouterr().out
    assert isinstance(result.error_in_exec, NameError)
    assert "in training_step" in text and "----> 9     return undefined_loss(model(x), y)" in text
    for internal in ("engine.py", "api.py", "magic.py", "recipe.py"):
        assert internal not in text


REGRESSION = """
model = torch.nn.Sequential(torch.nn.Linear(64, 10))
train_data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randn(256, 1))
"""


def test_a_loss_fn_from_an_earlier_cell_is_said_in_the_header_and_beside_the_error_in_it(ip, capsys):
    assert ip.run_cell("%%nbtrain --max-steps 2 --no-plot --no-progress" + DIGITS).error_in_exec is None
    assert "from an earlier cell" not in capsys.readouterr().out  # the cell defined every part itself
    result = ip.run_cell("%%nbtrain --max-steps 2 --no-plot --no-progress --batch-size 64" + REGRESSION)
    text = capsys.readouterr().out
    assert isinstance(result.error_in_exec, RuntimeError) and "0D or 1D target tensor expected" in text
    assert text.startswith("loss_fn: CrossEntropyLoss() from an earlier cell\n"), text  # the run's header
    assert "\nnbtrain: loss_fn: CrossEntropyLoss() from an earlier cell" in text  # repeated beside the error
    # No frame of the cell is involved: the call that raised is shown (torch's cross_entropy), the rest folded.
    assert text.count("\nFile ") == 1 and "functional.py" in text and "frames of nbtrain, torch and libraries " \
           "folded]" in text, text
    # The closing hint compares what the loss got: the model's output against the targets.
    assert "loss_fn got the model's output float32 tensor of shape (64, 10) against targets float32 tensor of " \
           "shape (64, 1)" in text


@pytest.mark.slow
def test_a_rank_that_fails_in_a_part_from_an_earlier_cell_says_so_beside_the_workers_error(ip, capsys):
    # The worker marks the part that raised in the run directory (error-rank{N}.part): the kernel's note
    # is the same as for a run in the kernel.
    assert ip.run_cell(DIGITS).error_in_exec is None
    result = ip.run_cell("%%nbtrain --devices 2 --accelerator cpu --max-steps 2 --batch-size 16 --no-plot "
                         "--no-progress" + REGRESSION)
    text = capsys.readouterr().out
    assert type(result.error_in_exec).__name__ == "WorkerError" and "0D or 1D target tensor expected" in text, text
    assert text.startswith("loss_fn: CrossEntropyLoss() from an earlier cell\n"), text
    assert "\nnbtrain: loss_fn: CrossEntropyLoss() from an earlier cell" in text, text


def test_an_error_in_the_users_model_shows_the_cells_line_and_the_last_torch_call_the_rest_folded(ip, capsys):
    cell = ("%%nbtrain --max-steps 2 --no-plot --no-progress" + DIGITS + """
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(64, 32)
    def forward(self, x):
        return torch.nn.functional.linear(self.hidden(x), torch.ones(10, 16))
model = Net()
""")
    result = ip.run_cell(cell)
    text = capsys.readouterr().out
    assert isinstance(result.error_in_exec, RuntimeError), text
    assert "in Net.forward" in text and "---> 13     return torch.nn.functional.linear(self.hidden(x)" in text
    assert "Cell In[" in text  # named as IPython names a cell
    # (Engine.run hands the run to a Run: its frame is one of these)
    assert "[... 9 frames of nbtrain, torch and libraries folded]" in text, text
    for internal in ("module.py", "recipe.py", "engine.py", "loop.py", "magic.py"):
        assert internal not in text, text
    # A loss from an earlier cell that did not fail is not blamed: only the header says where it came from.
    assert "nbtrain: loss_fn" not in text


@pytest.mark.parametrize("tool", ["", " --profile"], ids=["run", "tool"])
def test_an_error_in_a_library_loss_shows_the_cells_lines_that_set_the_model_and_the_loss_first(ip, capsys, tool):
    # SmallCNN(num_classes=5) on labels 0-9, as a newcomer's own: no frame of the cell runs (the model and the
    # loss are libraries'), so the cell's lines that set them come first, as a script's line would.
    cell = ("%%nbtrain --max-steps 2 --no-plot --no-progress" + tool + DIGITS
            + "model = torch.nn.Sequential(torch.nn.Linear(64, 5))  # five classes, not ten\n"
            + "loss_fn = torch.nn.CrossEntropyLoss()\n")
    result = ip.run_cell(cell)
    text = capsys.readouterr().out
    assert isinstance(result.error_in_exec, IndexError), text
    model_line, loss_line = text.find("----> 7 model = torch.nn.Sequential"), text.find("----> 8 loss_fn = torch.nn")
    torch_frame = text.find("functional.py")
    assert 0 < model_line < loss_line < torch_frame, text
    assert text.count("Cell In[") == 2 and "Cell In[" in text[:model_line] and ", line 7" in text[:model_line], text
    assert "IndexError: Target" in text and "loss_fn got the model's output" in text


def test_a_part_the_cell_sets_to_an_earlier_cells_object_is_the_cells_not_an_earlier_ones(ip, capsys):
    # decided by what the cell assigned (its syntax tree), not by identity: `train_data = data` sets it
    assert ip.run_cell(DIGITS + "data = train_data\n").error_in_exec is None
    result = ip.run_cell("%%nbtrain --max-steps 1 --no-plot --no-progress\ntrain_data = data\nmodel = DigitsMLP()\n"
                         "if True:\n    (loss_fn := torch.nn.CrossEntropyLoss())\n")
    out = capsys.readouterr().out
    assert result.error_in_exec is None and "earlier cell" not in out, out
    # a part the cell does not name still comes from the earlier cell, and says so
    ip.run_cell("%%nbtrain --max-steps 1 --no-plot --no-progress\nmodel = DigitsMLP()\n"
                "from torch.nn import CrossEntropyLoss as loss_fn_class\n")
    out = capsys.readouterr().out
    assert out.startswith("train_data: DigitsDataset of 1,437 samples; loss_fn: CrossEntropyLoss() from earlier "
                          "cells"), out


SETS_LOSS_FN = ["loss_fn = f", "loss_fn: object = f", "loss_fn += f", "for loss_fn in []: pass", "import loss_fn",
                "with f as loss_fn: pass", "from m import f as loss_fn", "def loss_fn(): pass", "class loss_fn: pass",
                "if x:\n    (a, [loss_fn]) = f", "try:\n    pass\nexcept E as loss_fn:\n    pass"]
LEAVES_IT = ["f(loss_fn)", "def g():\n    loss_fn = f", "[loss_fn for loss_fn in x]", "lambda loss_fn: 0",
             "class C:\n    loss_fn = f", "x.loss_fn = f", "x['loss_fn'] = f"]


@pytest.mark.parametrize("source", SETS_LOSS_FN + LEAVES_IT)
def test_what_a_cell_assigned_is_read_from_its_statements(source):
    from nbtrain.notebook.earlier import assigned_names
    assigned = assigned_names("\n" + source)
    assert ("loss_fn" in assigned) == (source in SETS_LOSS_FN), assigned
    assert source not in SETS_LOSS_FN or assigned["loss_fn"] == 2 + source.count("\n", 0, source.find("loss_fn"))


def test_interrupt_stops_at_a_step_boundary_and_keeps_the_partial_run(ip, capsys):
    cell = ("%%nbtrain --max-steps 50 --log-every-n-steps 1 --name cut --no-progress" + DIGITS + """
import os, signal
calls = []
def training_step(model, batch):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGINT)
    x, y = batch
    return loss_fn(model(x), y)
""")
    result = ip.run_cell(cell)
    out = capsys.readouterr().out
    assert result.error_in_exec is None, out
    cut = ip.user_ns["cut"]
    assert cut.status == "interrupted"
    assert cut.history["step"] == [1, 2, 3]
    assert "interrupted after 3 of 50 planned steps: stopped at step 3" in out
    assert "the model keeps its training so far" in out
    assert ip.user_ns["calls"] == [1, 1, 1]


# --- views, store, compare ----------------------------------------------------------------


@pytest.mark.slow
def test_live_plot_is_one_image_updated_in_place_and_drawn_while_the_run_goes_on(ip):
    # Steps of at least 10 ms: 300 of them last 3 s or more, and the plot redraws about once a second.
    slow = "\nimport time\ndef training_step(model, batch):\n    time.sleep(0.01)\n" \
           "    return loss_fn(model(batch[0]), batch[1])\n"
    with capture_output() as captured:
        ip.run_cell("%%nbtrain --max-steps 300 --log-every-n-steps 2 --no-progress" + DIGITS + slow)
    images = [o for o in captured.outputs if "image/png" in o.data]
    assert len(images) >= 2  # frames while it trained, and the final one
    ids = {o.transient.get("display_id") for o in images}
    assert len(ids) == 1 and None not in ids
    assert not images[0].update and all(o.update for o in images[1:])
    first_step = int(images[0].data["text/plain"].rsplit("step ", 1)[1])
    assert 0 < first_step < 300, "the first frame came only at the end"
    assert images[-1].data["text/plain"].endswith("step 300")
    assert any("text/html" in o.data and "samples/s" in o.data["text/html"] for o in captured.outputs)


def test_corrupt_store_warns_once_and_training_goes_on(ip, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(b"not sqlite at all " * 100)
    monkeypatch.setenv("NBTRAIN_STORE", str(bad))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ip.run_cell("%%nbtrain --max-steps 2 --no-plot --no-progress --name one" + DIGITS)
        ip.run_cell("%%nbtrain --max-steps 2 --no-plot --no-progress --name two\nx = 1")
    assert ip.user_ns["one"].status == ip.user_ns["two"].status == "completed"
    messages = [str(w.message) for w in caught if "run store" in str(w.message)]
    assert len(messages) == 1 and "is unusable (file is not a database)" in messages[0]
    assert "not recorded: the run store is unusable" in capsys.readouterr().out


def test_runs_are_listed_and_compared_from_the_store(ip, capsys, fails_with):
    ip.run_cell("%%nbtrain --max-steps 4 --batch-size 16 --name small --no-plot --no-progress" + DIGITS)
    ip.run_cell("%%nbtrain --max-steps 4 --batch-size 64 --name big --no-plot --no-progress" + DIGITS)
    capsys.readouterr()
    ip.run_cell("%nbtrain_runs")
    listing = capsys.readouterr().out
    assert "small" in listing and "big" in listing and "DigitsMLP (26,122 parameters)" in listing
    del ip.user_ns["small"]  # read from the store, as after a restart
    ip.run_cell("%nbtrain_compare small big")
    table = capsys.readouterr().out
    comparison = ip.user_ns["_nbtrain_compare"]
    assert comparison.labels == ["small", "big"] and comparison.runs[0].config.batch_size == 16
    assert "batch_size=64" in table
    text = fails_with("%nbtrain_compare small nope")
    assert "%nbtrain_compare: no run named 'nope'" in text and "stored runs: big, small" in text


@pytest.mark.slow
def test_devices_above_one_go_through_the_launcher(ip):
    ip.run_cell("%%nbtrain --devices 2 --accelerator cpu --max-steps 3 --no-plot --no-progress" + DIGITS)
    result = ip.user_ns["_nbtrain"]
    assert result.status == "completed" and result.summary.world_size == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cell_on_the_gpu_reports_cuda_memory_and_is_stored(ip, capsys):
    ip.run_cell("%%nbtrain --accelerator cuda --precision bf16-mixed --max-steps 5 --name gpu_run" + DIGITS)
    out = capsys.readouterr().out
    run = ip.user_ns["gpu_run"]
    assert run.status == "completed", out
    assert run.summary.device.startswith("cuda") and run.summary.mem_kind == "CUDA allocated"
    assert next(ip.user_ns["model"].parameters()).is_cuda  # the live model stays where it trained
    ip.run_cell("%nbtrain_compare gpu_run")
    assert ip.user_ns["_nbtrain_compare"].runs[0].config.precision == "bf16-mixed"


def test_a_checkpoint_that_is_not_there_is_one_line(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --max-steps 2 --resume /nonexistent/run.pt" + DIGITS)
    assert "%%nbtrain: resume='/nonexistent/run.pt': no such checkpoint file; allowed:" in text


def test_a_misspelt_monitor_is_one_line_before_anything_trains(ip, capsys, fails_with):
    ip.run_cell(DIGITS + "import copy\nval_data = DigitsDataset(train=False)\nbefore = copy.deepcopy(model.state_dict())")
    text = fails_with("%%nbtrain --max-steps 8 --val-every-n-steps 4 --monitor val_acuracy --no-progress"
                                  "\nran = True")
    assert "%%nbtrain: invalid training configuration: --monitor=val_acuracy: not among the held-out numbers; " \
           "did you mean 'val_acc'? allowed: val_loss, val_acc\n" in text
    ns = ip.user_ns
    assert all(torch.equal(v, ns["before"][k]) for k, v in ns["model"].state_dict().items())  # no step trained


def test_a_metric_that_returns_a_vector_is_one_line_naming_it(ip, capsys, fails_with):
    text = fails_with("%%nbtrain --max-steps 2 --val-every-n-steps 2 --no-progress --no-plot" + DIGITS
                      + "val_data = DigitsDataset(train=False)\nmetrics = {'hits': lambda o, t: o.argmax(1) == t}")
    assert "%%nbtrain: the metric 'hits' returned a tensor of shape (32,) on a held-out batch; it must return a " \
           "number" in text and "evaluation.py" not in text


def test_an_unwritable_logger_dir_is_one_line_naming_the_flag(ip, capsys, tmp_path, fails_with):
    (tmp_path / "a-file").write_text("not a folder")
    text = fails_with(f"%%nbtrain --max-steps 2 --logger csv --logger-dir {tmp_path}/a-file/logs" + DIGITS)
    assert f"%%nbtrain: invalid training configuration: --logger-dir={tmp_path}/a-file/logs: a folder nbtrain can " \
           f"write to (creating {tmp_path}/a-file/logs: Not a directory)\n" in text and "pathlib" not in text


def test_nbtrain_error_types_show_their_message_without_nbtrain_frames(ip, tmp_path):
    from nbtrain.runs.compare import smoothed
    from nbtrain.notebook.errors import training_failure
    from nbtrain.runs.store import RunStore, StoreError
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage " * 100)
    with pytest.raises(StoreError) as caught:
        RunStore(bad).runs()
    shown = training_failure(ip, caught.value)
    text = "\n".join(shown._render_traceback_())
    assert "StoreError: cannot read the run store" in text and "store.py" not in text
    with pytest.raises(TypeError) as bug:  # a plain error inside nbtrain's code is a bug: shown whole
        smoothed(None, 2)
    assert training_failure(ip, bug.value) is bug.value and not hasattr(bug.value, "_render_traceback_")
