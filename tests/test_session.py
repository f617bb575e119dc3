"""One session layer under every front-end: the magic and the panel train, record, number and name
runs the same way; views follow one protocol; a run's caller can stop it with its own event."""
import threading
import warnings

import pytest
import torch

import nbtrain
from nbtrain import Engine, MetricsLog, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.metrics import View
from nbtrain.notebook.panel import panel as make_panel
from nbtrain.runs.store import RunStore
from nbtrain.runs.table import HEADS

DIGITS = """%%nbtrain --max-steps {steps} --accelerator cpu --no-plot --no-progress
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
torch.manual_seed(0)
model = DigitsMLP(hidden=16)
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
lr = {lr}
"""
CPU = TrainConfig(accelerator="cpu", batch_size=32, max_steps=6, log_every_n_steps=1, seed=0)


def test_a_stop_event_set_before_the_run_ends_it_before_its_first_step():
    stop = threading.Event()
    stop.set()
    engine = Engine(digits_recipe(), CPU)
    result = engine.run(stop=stop)
    assert result.status == "stopped" and engine.step == 0
    # The event only ever stops the run it was given to: the next run without it trains.
    assert engine.run().status == "completed" and engine.step == 6


def test_the_engine_never_sets_its_callers_stop_event_even_when_it_stops_itself():
    stop = threading.Event()
    engine = Engine(digits_recipe(), CPU.replace(max_steps=50))
    log = MetricsLog()
    log.subscribe(lambda event, _log: event["type"] == "steps" and event["rows"]["step"][-1] >= 3 and engine.stop())
    result = engine.run(log=log, stop=stop)
    assert result.status == "stopped" and 3 <= engine.step < 50
    assert not stop.is_set()


def test_a_stop_event_set_from_another_thread_ends_fit_at_a_step_boundary():
    stop = threading.Event()
    log = MetricsLog()
    log.subscribe(lambda event, _log: event["type"] == "steps" and event["rows"]["step"][-1] >= 2 and stop.set())
    recipe = digits_recipe()
    result = nbtrain.fit(recipe=recipe, config=CPU.replace(max_steps=10_000), log=log, stop=stop)
    assert result.status == "stopped" and result.summary.run_steps < 10_000
    assert nbtrain.api.live_engine(recipe.model).step == result.summary.run_steps


class Counting:
    """A view by the protocol: update at every event, close once."""

    def __init__(self):
        self.kinds, self.closed = [], 0

    def update(self, event, log):
        self.kinds.append(event["type"])

    def close(self):
        self.closed += 1


def test_views_follow_one_protocol_and_plain_functions_are_views_too():
    log = MetricsLog()
    counting, seen = log.subscribe(Counting()), []
    assert isinstance(counting, View)
    log.subscribe(lambda event, _log: seen.append(event["type"]))
    nbtrain.fit(recipe=digits_recipe(), config=CPU, log=log)
    assert counting.kinds[0] == "start" and counting.kinds[-1] == "end" and seen == counting.kinds


def test_a_failing_view_is_detached_with_a_warning_and_training_goes_on():
    log = MetricsLog()

    def broken(event, _log):
        raise RuntimeError("drawing failed")

    log.subscribe(broken)
    with pytest.warns(UserWarning, match="a view failed and was detached"):
        result = nbtrain.fit(recipe=digits_recipe(), config=CPU, log=log)
    assert result.status == "completed" and not log._views


def test_unsubscribe_takes_the_function_that_was_subscribed():
    log, seen = MetricsLog(), []

    def view(event, _log):
        seen.append(event["type"])

    log.subscribe(view)
    log.unsubscribe(view)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log.emit({"type": "change", "step": 0, "changes": {}})
    assert seen == []


@pytest.fixture
def notebook(ip, tmp_path):
    yield ip, tmp_path / "runs.sqlite"  # the store ip set (NBTRAIN_STORE)


def test_the_magic_and_the_panel_record_number_and_name_runs_the_same_way(notebook):
    shell, store = notebook
    ran = shell.run_cell(DIGITS.format(steps=4, lr=0.0123))
    assert ran.success, ran.error_in_exec
    magic_result = shell.user_ns["_nbtrain"]
    panel = make_panel(shell.user_ns, TrainConfig(accelerator="cpu", max_steps=4), display=False, store=store)
    try:
        panel.run_button.click()
        assert panel.wait(60)
        panel_result = panel.runs[0].result
    finally:
        panel.close()
    runs = RunStore(store).runs()
    assert [r.label for r in runs] == ["#1", "#2"] and [magic_result.name, panel_result.name] == ["#1", "#2"]
    # One description of the model, from one place.
    assert runs[0].model == runs[1].model == "DigitsMLP (1,482 parameters)"
    assert magic_result.extras["run_id"] == 1 and panel_result.extras["run_id"] == 2
    # Both read the notebook's `lr` the same way (the panel was given a config without an lr of its own).
    assert magic_result.config.lr == 0.0123
    panel_over_namespace = make_panel(shell.user_ns, display=False, store=store)
    try:
        assert panel_over_namespace.base.lr == 0.0123
    finally:
        panel_over_namespace.close()


def test_the_panel_and_nbtrain_runs_show_one_runs_table(notebook, capsys):
    shell, store = notebook
    recipe = digits_recipe()
    panel = make_panel(recipe, TrainConfig(accelerator="cpu", max_steps=3), display=False, store=store)
    try:
        panel.run_button.click()
        assert panel.wait(60)
        shown_in_panel = panel.table.html.value
    finally:
        panel.close()
    shell.run_cell("%nbtrain_runs")
    listed = capsys.readouterr().out
    for head in HEADS:
        assert head in shown_in_panel and head in listed, head
    assert "DigitsMLP" in listed and "global batch" in listed


def test_a_bad_lr_in_the_namespace_names_where_it_came_from(notebook):
    shell, _ = notebook
    ran = shell.run_cell(DIGITS.format(steps=2, lr=-1.0))
    assert "lr (in the namespace)=-1.0" in str(ran.error_in_exec)
    assert torch.is_tensor(next(shell.user_ns["model"].parameters()))
