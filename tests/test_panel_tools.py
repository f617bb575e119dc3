"""The panel's checklist-tool buttons and its run-store records: real widgets (display off), real engine."""
import dataclasses
import os
import threading
import time

import pytest
import torch

import nbtrain
from nbtrain.walk.result import ChecklistResult
from nbtrain.demo import digits_recipe
from nbtrain.tools.diagnose import Diagnosis
from nbtrain.notebook.panel import panel as make_panel_with_store
from nbtrain.runs.store import RunStore
from nbtrain.tools.tune import BatchSearch
from nbtrain.tools.tune_workers import WorkerSearch

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def store_path(tmp_path, monkeypatch):
    path = tmp_path / "runs.sqlite"
    monkeypatch.setenv("NBTRAIN_STORE", str(path))
    return path


@pytest.fixture
def make_panel(store_path):
    made = []

    def make(recipe=None, config=None):
        p = nbtrain.panel(recipe or digits_recipe(hidden=32), config or nbtrain.TrainConfig(accelerator="cpu"),
                          display=False)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def unchanged(before, model):
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def click_and_wait(panel, tool, timeout=60):
    panel.tools.buttons[tool].click()
    assert panel.thread is not None, panel.status_text  # (a refused value may already have ended it)
    assert panel.wait(timeout), "the tool did not finish"
    assert not panel.run_button.disabled and not panel.tools.buttons[tool].disabled


@pytest.mark.slow
def test_bottleneck_button_shows_the_breakdown_and_its_bar_for_the_controls_settings(make_panel):
    panel = make_panel()
    before = weights(panel.recipe.model)
    panel.controls.batch_size.value = "64"
    click_and_wait(panel, "profile")
    d = panel.tools.results["profile"]
    assert isinstance(d, Diagnosis) and d.config.batch_size == 64
    assert panel.status_text == f"Bottleneck breakdown done: {d.verdict}", panel.errors
    assert "nbtrain bottleneck breakdown" in panel.tools.text.value and "forward" in panel.tools.text.value
    assert bytes(panel.tools.image.value).startswith(b"\x89PNG")
    assert unchanged(before, panel.recipe.model) and panel.engine.step == 0


@pytest.mark.slow
def test_ceilings_button_shows_the_four_ceilings_binding_first_with_their_bars(make_panel):
    panel = make_panel()
    before = weights(panel.recipe.model)
    panel.controls.batch_size.value = "16"
    click_and_wait(panel, "ceilings")
    c = panel.tools.results["ceilings"]
    assert c.config.batch_size == 16 and panel.status_text == f"Ceilings done: {c.verdict}", panel.errors
    text = panel.tools.text.value
    assert "binding first" in text and all(f"  {name} " in text for name in ("data", "host", "compute", "memory"))
    assert text.index(f"  {c.bottleneck().binding} ") < min(text.index(f"  {n} ") for n in c.bottleneck().order[1:])
    assert bytes(panel.tools.image.value).startswith(b"\x89PNG")
    assert unchanged(before, panel.recipe.model) and panel.engine.step == 0


@pytest.mark.slow
def test_find_batch_size_button_searches_under_the_memory_fraction(make_panel):
    panel = make_panel(config=nbtrain.TrainConfig(accelerator="cpu", batch_size=256))
    before = weights(panel.recipe.model)
    panel.tools.fields["memory_budget"].value = 0.3
    click_and_wait(panel, "find_batch_size")
    b = panel.tools.results["find_batch_size"]
    assert isinstance(b, BatchSearch) and b.batch_size >= 256 and b.memory_kind == "process RSS"
    assert panel.status_text.startswith("Find batch size done: largest batch"), panel.errors
    assert b.speed_text() in panel.status_text  # its speed against the start, with the interval
    assert "nbtrain batch-size search" in panel.tools.text.value and bytes(panel.tools.image.value).startswith(b"\x89PNG")
    assert unchanged(before, panel.recipe.model)


def test_find_workers_button_measures_worker_counts_on_the_live_model(make_panel):
    panel = make_panel()
    panel.tools.fields["seconds"].value = 0.3
    click_and_wait(panel, "find_workers")
    w = panel.tools.results["find_workers"]
    assert isinstance(w, WorkerSearch) and {0, 1} <= {m.config.num_workers for m in w.measurements}
    assert panel.status_text.startswith("Find workers done: fastest: num_workers="), panel.errors
    assert "&lt;- best" in panel.tools.text.value  # the table, HTML-escaped
    assert "95% interval" in panel.tools.text.value and w.verdict() in panel.status_text


@pytest.mark.slow
def test_checklist_walk_button_passes_its_budget_and_draws_the_waterfall(make_panel):
    panel = make_panel()
    before = weights(panel.recipe.model)
    panel.tools.fields["budget_s"].value = 4
    panel.controls.devices.value = 2  # the tools measure in this kernel; the walk tries DDP itself
    click_and_wait(panel, "checklist")
    walk = panel.tools.results["checklist"]
    # The walk stopping by its budget is tested on a fake clock (test_checklist.py); here, that it gets it.
    assert isinstance(walk, ChecklistResult) and walk.budget_s == 4
    assert walk.start_config.world_size == 1
    assert panel.status_text.startswith("Checklist walk done: "), panel.errors
    assert ("95% interval" in panel.status_text) == any(item.kept for item in walk.items), panel.status_text
    assert "nbtrain checklist walk on cpu" in panel.tools.text.value
    assert "head to head vs current (95% interval)" in panel.tools.text.value
    assert bytes(panel.tools.image.value).startswith(b"\x89PNG")
    assert unchanged(before, panel.recipe.model)


@pytest.mark.slow
def test_stop_ends_a_running_tool_and_the_model_is_restored(make_panel):
    recipe, training = digits_recipe(hidden=32), threading.Event()
    loss_fn = recipe.loss_fn

    def loss_seen(output, target):
        training.set()
        return loss_fn(output, target)
    recipe.loss_fn = loss_seen
    panel = make_panel(recipe)
    before = weights(panel.recipe.model)
    panel.tools.fields["budget_s"].value = 60
    panel.tools.buttons["checklist"].click()
    assert panel.running and panel.tools.buttons["profile"].disabled and panel.run_button.disabled
    # Stopped once the walk trains: its trials train engines of their own, so panel.engine never runs (the test
    # waited for it to, 20 s each time, and stopped the walk only then).
    assert training.wait(20), "the walk never began training"
    panel.stop_button.click()
    assert panel.status_text.startswith("stopping Checklist walk")
    assert panel.wait(20)  # a hang guard only: the 60 s walk ends on the stop, not on its budget
    assert panel.status_text == "Checklist walk stopped; the model and its optimizer are restored as they were"
    assert "checklist" not in panel.tools.results
    assert unchanged(before, panel.recipe.model)


def test_a_tool_that_cannot_stop_in_time_is_reported_and_left_to_end_its_step_not_interrupted(make_panel):
    inside, release, interrupted = threading.Event(), threading.Event(), []

    def step_that_waits(model, batch):  # a step longer than Stop's grace, e.g. a slow data pipeline
        inside.set()
        try:
            while not release.wait(0.01):  # Python code between waits: an exception from outside would land here
                pass
        except BaseException as error:
            interrupted.append(error)
            raise
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    recipe = dataclasses.replace(digits_recipe(hidden=32), training_step=step_that_waits)
    panel = make_panel(recipe)
    before = weights(panel.recipe.model)
    panel.tools.stop_grace_s = 0.2
    panel.tools.buttons["profile"].click()
    assert inside.wait(60), panel.status_text  # the tool is inside a step
    panel.stop_button.click()
    wait_until(lambda: "has not stopped" in panel.status_text)
    assert panel.status_text.startswith("Bottleneck breakdown has not stopped after 0.2 s: it is inside a step")
    assert panel.running and panel.run_button.disabled and interrupted == []  # still going, not shot
    release.set()
    assert panel.wait(60), panel.status_text  # ends at the step's end, without measuring further
    assert panel.status_text == "Bottleneck breakdown stopped; the model and its optimizer are restored as they were"
    assert interrupted == [] and "profile" not in panel.tools.results and not panel.run_button.disabled
    assert unchanged(before, panel.recipe.model) and panel.engine.step == 0


def wait_until(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_tool_waits_for_a_run_and_a_run_for_a_tool(make_panel):
    panel = make_panel()
    panel.controls.max_epochs.value = "1000"
    panel.run_button.click()
    panel.tools.buttons["profile"].click()  # the button is disabled in a browser; a click still arrives here
    assert panel.status_text == "run #1 is still going: Stop it first"
    panel.stop_button.click()
    assert panel.wait(30)
    panel.tools.fields["budget_s"].value = 60
    panel.tools.buttons["checklist"].click()
    panel.run_button.click()
    assert panel.status_text == "Checklist walk is still going: Stop it"
    panel.stop_button.click()
    assert panel.wait(30)


@pytest.mark.parametrize("field, value, tool, expected", [
    ("memory_budget", 3.0, "find_batch_size", "Find batch size: memory fraction 3.0: allowed: a fraction in (0, 1]"),
    ("budget_s", -1.0, "checklist", "Checklist walk: walk budget (s) -1.0: allowed: a number of seconds > 0"),
    ("seconds", 0.0, "find_workers", "Find workers: s per worker setting 0.0: allowed: a number > 0"),
])
def test_a_value_a_tool_refuses_shows_in_the_status_line_with_the_fields_name(make_panel, field, value, tool,
                                                                              expected):
    panel = make_panel()
    panel.tools.fields[field].value = value
    panel.tools.buttons[tool].click()
    assert panel.status_text.startswith(expected), panel.status_text
    # refused before anything runs: no thread, the buttons still enabled
    assert panel.thread is None and not panel.running and not panel.tools.buttons[tool].disabled
    assert tool not in panel.tools.results


def test_an_invalid_setting_in_the_controls_shows_the_config_error_and_no_tool_runs(make_panel):
    panel = make_panel()
    panel.controls.batch_size.value = "lots"
    panel.tools.buttons["profile"].click()
    assert not panel.running and "batch_size" in panel.status_text and "lots" in panel.status_text
    assert "profile" not in panel.tools.results


def test_finished_panel_runs_are_recorded_in_the_run_store(tmp_path):
    path = tmp_path / "panel-runs.sqlite"
    panel = make_panel_with_store(digits_recipe(hidden=32), nbtrain.TrainConfig(accelerator="cpu"), display=False,
                                  store=path)
    try:
        panel.controls.max_steps.value = "3"
        panel.run_button.click()
        assert panel.wait(30)
        result = panel.runs[0].result
        stored = RunStore(path).runs()
        assert [r.id for r in stored] == [result.extras["run_id"]] and result.name == f"#{stored[0].id}"
        assert stored[0].model.startswith("DigitsMLP") and stored[0].summary.steps == 3
        assert f"recorded as run #{stored[0].id} in {path}" in panel.progress.value
        comparison = nbtrain.compare(f"#{stored[0].id}", store=RunStore(path))
        assert comparison is not None
    finally:
        panel.close()
