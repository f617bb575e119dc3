"""The checklist tools as %%nbtrain flags and %nbtrain_checklist, through a real IPython InteractiveShell."""
import json
import os

import pytest
import torch

import nbtrain
from nbtrain import TrainConfig
from nbtrain.walk.items import ITEMS as CHECKLIST_ITEMS
from nbtrain.walk.result import ChecklistResult
from nbtrain.tools.diagnose import Diagnosis
from nbtrain.notebook.tools import ToolView
from nbtrain.tools.lr_finder import LRFind
from nbtrain.tools.tune import BatchSearch
from nbtrain.tools.tune_workers import WorkerSearch

DIGITS = """
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
torch.manual_seed(0)
model = DigitsMLP(hidden=32)
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""

LEAKY = DIGITS + """
losses = []
def training_step(model, batch):
    x, y = batch
    loss = loss_fn(model(x), y)
    losses.append(loss)          # keeps every step's graph alive
    return loss
"""




def runs_ok(ip, capsys, cell):
    result = ip.run_cell(cell)
    out = capsys.readouterr()
    assert result.error_in_exec is None, out.out + out.err
    return out.out



def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def unchanged(before, model):
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_help_lists_every_tool_and_its_options(ip, capsys):
    ip.run_cell("%%nbtrain?")
    out = capsys.readouterr().out
    for flag in ("--profile", "--trace", "--find-batch-size", "--memory-budget", "--find-workers", "--find-lr",
                 "--find-leaks", "--find-sync", "--checklist", "--budget", "--keep-best", "--panel"):
        assert flag in out


@pytest.mark.slow
def test_profile_shows_the_breakdown_its_verdict_and_a_trace_and_restores_the_model(ip, capsys, tmp_path):
    runs_ok(ip, capsys, DIGITS)
    before = weights(ip.user_ns["model"])
    out = runs_ok(ip, capsys, "%nbtrain --profile --steps 5 --batch-size 64 --trace step.json --name prof")
    ns = ip.user_ns
    d = ns["prof"]
    assert isinstance(d, Diagnosis) and ns["_nbtrain"] is d
    assert "nbtrain bottleneck breakdown (5 steps measured on cpu, batch 64" in out and "verdict: " + d.kind in out
    assert "forward" in out and "backward" in out and "result in prof and _nbtrain" in out
    assert "the four ceilings, each measured alone, binding first:" in out and "model FLOPs utilisation" in out
    assert d.ceilings is not None and d.ceilings.evidence() in out  # the verdict names the ceilings
    assert json.loads((tmp_path / "step.json").read_text())["traceEvents"]
    assert unchanged(before, ns["model"])
    view = ToolView(d, "profile")
    assert view.png.startswith(b"\x89PNG") and "data:image/png;base64," in view._repr_html_()


def test_ceilings_flag_prints_the_four_ceilings_binding_first_and_the_remedies(ip, capsys):
    runs_ok(ip, capsys, DIGITS)
    out = runs_ok(ip, capsys, "%%nbtrain --ceilings --batch-size 16\nmodel = DigitsMLP(hidden=32)\n")
    # The parts this cell did not set are named first, in the words of a training run's header.
    assert out.startswith("train_data: DigitsDataset of 1,437 samples; loss_fn: CrossEntropyLoss() from earlier "
                          "cells\n"), out
    c = ip.user_ns["_nbtrain"]
    b = c.bottleneck()
    assert f"verdict: {c.verdict}" in out and f"idea, not raced: {b.remedies[0].text}" in out
    assert out.index(f"  {b.order[0]} ") < out.index(f"  {b.order[-1]} ") and out.count("95% interval") >= 4


@pytest.mark.slow
def test_find_batch_size_under_a_memory_budget_gives_the_batch_and_the_scaled_lr(ip, capsys):
    out = runs_ok(ip, capsys, "%%nbtrain --find-batch-size --max-batch 128 --memory-budget 2GB --batch-size 32"
                  + DIGITS)
    b = ip.user_ns["_nbtrain"]
    assert isinstance(b, BatchSearch) and b.batch_size == 128 and b.limit_bytes == 2 * 10**9
    assert "largest batch 128" in out and "by the linear rule (global batch 128 vs base 32)" in out
    assert b.config.batch_size == 128 and b.lr_scaled == pytest.approx(4 * b.lr_base)
    assert "speed, batch 128 against batch 32 head to head: " in out and b.speed.verdict.interval_text() in out


def test_find_workers_measures_each_worker_count(ip, capsys):
    out = runs_ok(ip, capsys, "%%nbtrain --find-workers --workers 0,1 --seconds 0.3" + DIGITS)
    w = ip.user_ns["_nbtrain"]
    assert isinstance(w, WorkerSearch)
    assert [m.config.num_workers for m in w.measurements][:2] == [0, 1]
    assert "num_workers=0" in out and "num_workers=1" in out and "<- best" in out
    assert out.count("95% interval") >= 2 and w.verdict() in out  # each rate's interval, the verdict vs the start


def test_find_lr_as_a_line_magic_sweeps_the_recipe_already_in_the_namespace(ip, capsys):
    runs_ok(ip, capsys, DIGITS)
    before = weights(ip.user_ns["model"])
    out = runs_ok(ip, capsys, "%nbtrain --find-lr --steps 15 --start-lr 1e-4 --end-lr 1")
    lr = ip.user_ns["_nbtrain"]
    assert isinstance(lr, LRFind) and 1e-4 <= lr.suggestion <= 1
    assert "suggestion (steepest descent): lr =" in out
    assert unchanged(before, ip.user_ns["model"])
    # a tool as a line magic leaves the defaults alone
    assert "defaults" not in out and ip.magics_manager.registry["NbtrainMagics"].defaults == {}


def test_find_leaks_names_the_line_that_keeps_graphs_and_stays_quiet_on_a_clean_step(ip, capsys):
    out = runs_ok(ip, capsys, "%%nbtrain --find-leaks --steps 5" + LEAKY)
    report = ip.user_ns["_nbtrain"]
    assert report.leaking and "graph retention" in out
    assert "losses.append(loss)" in report.fix and ".item()" in report.fix
    # The place is named as the notebook shows it, never by the kernel's temporary file for the cell.
    line = next(i for i, text in enumerate(("%%nbtrain" + LEAKY).splitlines(), 1) if "losses.append(loss)" in text)
    assert report.fix.startswith(f"cell In[{ip.execution_count}], line {line}") and "ipykernel" not in out, out
    out = runs_ok(ip, capsys, "%%nbtrain --find-leaks --steps 5" + DIGITS + "training_step = None\n")
    assert not ip.user_ns["_nbtrain"].leaking and "clean:" in out


def test_find_sync_says_it_needs_cuda_on_the_cpu(ip, capsys):
    out = runs_ok(ip, capsys, "%%nbtrain --find-sync --accelerator cpu" + DIGITS)
    report = ip.user_ns["_nbtrain"]
    assert not report.available and "needs CUDA: this model trains on cpu" in out
    assert ToolView(report, "find_sync").png is None


@pytest.mark.cuda
def test_find_sync_counts_the_synchronisations_a_step_forces_on_cuda(ip, capsys):
    cell = ("%%nbtrain --find-sync --steps 3 --accelerator cuda" + DIGITS +
            "def training_step(model, batch):\n    x, y = batch\n    loss = loss_fn(model(x), y)\n"
            "    print_me = loss.item()  # a sync\n    return loss\n")
    out = runs_ok(ip, capsys, cell)
    report = ip.user_ns["_nbtrain"]
    assert report.available and any("print_me = loss.item()" in text for _, text, _ in report.sites), out


@pytest.mark.slow
def test_checklist_walk_restores_the_model_unless_keep_best_which_also_sets_later_cells(ip, capsys):
    runs_ok(ip, capsys, DIGITS)
    before = weights(ip.user_ns["model"])
    out = runs_ok(ip, capsys, "%nbtrain_checklist --budget 4 --items batch_size --batch-size 16 --name walk")
    assert "earlier cell" not in out, out  # a line magic asks for the namespace's recipe: no line says so
    walk = ip.user_ns["walk"]
    assert isinstance(walk, ChecklistResult) and walk.budget_s == 4
    assert "nbtrain checklist walk on cpu" in out and "model and config restored" in out
    assert "head to head vs current (95% interval)" in out
    assert all(item.verdict_text() in out for item in walk.items)
    assert unchanged(before, ip.user_ns["model"])
    assert ToolView(walk, "checklist").png.startswith(b"\x89PNG")

    # keep-best: the best config found becomes the magic's default for later cells (a budget with room
    # for the head-to-head comparison that decides whether a larger batch is kept)
    out = runs_ok(ip, capsys, "%%nbtrain_checklist --budget 8 --items batch_size --batch-size 16 --keep-best\n"
                  "model = DigitsMLP(hidden=32)\n")
    walk = ip.user_ns["_nbtrain"]
    assert out.startswith("train_data: DigitsDataset of 1,437 samples; loss_fn: CrossEntropyLoss() from earlier "
                          "cells\n"), out
    assert "the live engine now uses the best config" in out
    best = walk.best_config.batch_size
    if best != 16:  # a batch size was kept: later cells train with it
        assert f"later %%nbtrain cells start from it: --batch-size {best}" in out
    runs_ok(ip, capsys, "%%nbtrain --max-steps 2 --no-progress --no-plot\npass\n")
    # what was kept carries over; with nothing kept, later cells keep their own defaults (--batch-size was this cell's)
    assert ip.user_ns["_nbtrain"].config.batch_size == walk.changes().get("batch_size", TrainConfig().batch_size)


def test_panel_flag_shows_the_panel_for_the_cell_recipe_instead_of_training(ip, capsys):
    from nbtrain.notebook.panel import Panel
    out = runs_ok(ip, capsys, "%%nbtrain --panel --batch-size 64 --precision bf16-mixed --name p" + DIGITS)
    panel = ip.user_ns["p"]
    try:
        assert isinstance(panel, Panel) and ip.user_ns["_nbtrain_panel"] is panel
        assert panel.recipe.model is ip.user_ns["model"] and panel.engine.step == 0  # nothing trained
        assert panel.controls.batch_size.value == "64" and panel.config.precision == "bf16-mixed"
        assert "VBox" in out  # a terminal shell shows the widget's repr
        assert "from an earlier cell" not in out  # the cell set every part
    finally:
        panel.close()
    out = runs_ok(ip, capsys, "%%nbtrain --panel --name p\nmodel = DigitsMLP(hidden=32)\n")
    ip.user_ns["p"].close()
    assert out.startswith("train_data: DigitsDataset of 1,437 samples; loss_fn: CrossEntropyLoss() from earlier "
                          "cells\n"), out


def test_an_interrupt_inside_a_tool_restores_the_model_and_says_so(ip, capsys):
    cell = ("%%nbtrain --profile --steps 20" + DIGITS + "calls = [0]\n"
            "def training_step(model, batch):\n    calls[0] += 1\n    if calls[0] == 4:\n"
            "        raise KeyboardInterrupt\n    x, y = batch\n    return loss_fn(model(x), y)\n")
    ip.run_cell(DIGITS)
    before = weights(ip.user_ns["model"])
    result = ip.run_cell(cell.replace(DIGITS, "\n"))
    out = capsys.readouterr().out
    assert result.error_in_exec is None
    assert "--profile interrupted; the model and its optimizer are restored" in out
    assert unchanged(before, ip.user_ns["model"])


REGRESSION = """
model = torch.nn.Sequential(torch.nn.Linear(64, 10))
train_data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 1))
"""
# Each tool with the smallest options it takes; the regression data meets the earlier cell's CrossEntropyLoss
# at the first step. (--ceilings measures its loader for 5 s first: its test above names the parts on success.)
TINY = {"profile": "--steps 2", "find_batch_size": "--max-batch 32", "find_workers": "--workers 0 --seconds 0.1",
        "find_lr": "--steps 5", "find_leaks": "--steps 4", "find_sync": "",
        "checklist": "--budget 2 --items batch_size", "forecast": "--forecast-devices 1,2 --forecast-nodes 1 --seconds 0.5"}


def test_every_tool_but_ceilings_is_tried_with_a_part_from_an_earlier_cell():
    from nbtrain.notebook.tools import magic_tools
    assert set(TINY) | {"ceilings"} == set(magic_tools())


@pytest.mark.parametrize("tool", TINY)
def test_a_tool_names_the_parts_from_an_earlier_cell_first_and_beside_an_error_in_one(ip, capsys, tool):
    runs_ok(ip, capsys, DIGITS)
    flag = "--" + tool.replace("_", "-")
    result = ip.run_cell(f"%%nbtrain {flag} {TINY[tool]} --batch-size 16" + REGRESSION)
    text = capsys.readouterr().out
    assert text.startswith("loss_fn: CrossEntropyLoss() from an earlier cell\n"), text  # as a run's header
    if tool == "find_sync":  # off CUDA it measures nothing: no step, no error
        assert result.error_in_exec is None and "needs CUDA" in text
        return
    assert isinstance(result.error_in_exec, RuntimeError) and "0D or 1D target tensor expected" in text
    assert "\nnbtrain: loss_fn: CrossEntropyLoss() from an earlier cell" in text  # repeated beside the error
    assert text.count("from an earlier cell") == 2


def test_an_error_in_the_users_step_shows_the_users_line(ip, capsys):
    cell = ("%%nbtrain --find-leaks" + DIGITS +
            "def training_step(model, batch):\n    return 1 / 0  # the user's bug\n")
    result = ip.run_cell(cell)
    out = capsys.readouterr()
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    text = out.out + out.err
    assert "return 1 / 0  # the user's bug" in text
    # nbtrain's own frames (the leak finder's among them) are folded: no path into the package is shown
    assert "frames of nbtrain" in text and os.path.dirname(nbtrain.__file__) not in text, text


# Only what needs the recipe is judged after the cell body ran; every other value is read by the tool's
# declaration (the registry) before the body runs.
JUDGED_BY_THE_TOOL = {"%%nbtrain --find-batch-size --max-batch 99999", "%%nbtrain --profile --devices 2"}


@pytest.mark.parametrize("line, expected", [
    ("%%nbtrain --profile --find-lr", "%%nbtrain: --profile and --find-lr: one tool per cell; allowed: one of "
                                      "--profile, --ceilings, --forecast, --find-batch-size"),
    ("%%nbtrain --trace t.json", "%%nbtrain: --trace t.json applies to --profile; allowed: add one of those flags"),
    ("%%nbtrain --find-workers --keep-best", "--keep-best applies to --checklist"),
    ("%%nbtrain --find-leaks --steps 2", "%%nbtrain: --steps 2: allowed: a whole number >= 4 (steps to watch)"),
    ("%%nbtrain --profile --steps many", "%%nbtrain: --steps many: allowed: a whole number >= 1 (optimizer steps to "
                                         "measure)"),
    ("%%nbtrain --find-batch-size --memory-budget 3", "%%nbtrain: --memory-budget 3: allowed: a fraction in (0, 1] of "
                                                      "the free memory (e.g. 0.3), a size such as 512MB or 2GB"),
    ("%%nbtrain --find-batch-size --max-batch 99999", "%%nbtrain: --max-batch 99999: allowed: at most 1437 "
                                                      "(samples per process in train_data)"),
    ("%%nbtrain --find-batch-size --lr-rule cubic", "%%nbtrain: --lr-rule cubic: allowed: one of linear, sqrt, none"),
    ("%%nbtrain --find-workers --workers 0,x", "%%nbtrain: --workers 0,x: allowed: a list of whole numbers >= 0 "
                                               "(worker counts to try, e.g. 0,1,2)"),
    ("%%nbtrain --find-workers --workers 0,-1", "%%nbtrain: --workers 0,-1: allowed: a list of whole numbers >= 0"),
    ("%%nbtrain --find-lr --start-lr 1 --end-lr 0.1", "%%nbtrain: --start-lr 1.0, --end-lr 0.1: allowed: numbers "
                                                      "with 0 < start_lr < end_lr"),
    ("%%nbtrain --profile --devices 2", "%%nbtrain: --profile with --devices 2 --num-nodes 1: the tools measure in "
                                        "this kernel, one process; allowed: --devices 1"),
    ("%%nbtrain --forecast --forecast-devices 0,2", "%%nbtrain: --forecast-devices 0,2: allowed: a list of whole "
                                                    "numbers >= 1 (devices per node), or None (1,2,4,8)"),
    ("%%nbtrain --forecast --link-gbps 25", "%%nbtrain: --link-gbps 25.0, --link-latency-us None: allowed: both "
                                            "link_gbps and link_latency_us"),
    ("%%nbtrain --profile --batch-size -3", "%%nbtrain: invalid training configuration: --batch-size=-3: a whole "
                                            "number from 1"),
    ("%nbtrain_checklist --budget 0", "%nbtrain_checklist: --budget 0: allowed: a number of seconds > 0"),
    ("%nbtrain_checklist --items workers,fast", "%nbtrain_checklist: --items workers,fast: allowed: each one "
                                                "of " + ", ".join(CHECKLIST_ITEMS)),
    ("%nbtrain_checklist --budget 0.01", "%nbtrain_checklist: --checklist: --budget 0.01 left no time to measure the "
                                         "starting config against one candidate for 3 rounds; allow more (e.g. --budget 30)"),
    ("%nbtrain_checklist --bugdet 5", "%nbtrain_checklist: unknown flag --bugdet 5 (did you mean --budget?)"),
])
def test_bad_tool_input_is_one_line_naming_the_flag_the_value_and_what_is_allowed(ip, line, expected, fails_with):
    ip.run_cell(DIGITS)
    before = weights(ip.user_ns["model"])
    cell = line if line.startswith("%nbtrain_") else line + "\nran = True\n"
    text = fails_with(cell)
    assert expected in text, text
    if line in JUDGED_BY_THE_TOOL:  # the value is judged on the recipe, after the cell body ran
        assert ip.user_ns.get("ran") is True
    else:  # the flags are checked before the cell body runs
        assert "ran" not in ip.user_ns
    assert unchanged(before, ip.user_ns["model"])
