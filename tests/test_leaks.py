import pytest
import torch
from torch import nn

from nbtrain import Recipe, TrainConfig
from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.tools.leaks import find_graph_leaks, find_sync_points
from nbtrain.tools.tool_options import ToolOptionError

from checklist_recipes import same_state, state

loss_history = []
criterion = nn.CrossEntropyLoss()


def leaking_step(model, batch):
    x, y = batch
    loss = criterion(model(x), y)
    loss_history.append(loss)
    return loss


def clean_step(model, batch):
    x, y = batch
    loss = criterion(model(x), y)
    loss_history.append(loss.detach())
    return loss


def _recipe(step):
    torch.manual_seed(0)
    return Recipe(model=DigitsMLP(hidden=32), train_data=DigitsDataset(), training_step=step)


@pytest.mark.slow
def test_detector_fires_on_a_step_that_keeps_loss_tensors_and_names_the_line():
    loss_history.clear()
    report = find_graph_leaks(_recipe(leaking_step), config=TrainConfig(batch_size=32), steps=8)
    assert report.leaking, report.table()
    assert report.alive_per_step[-1] - report.alive_per_step[0] >= 6
    assert "grow by 1.0 per step" in report.message
    assert "list `loss_history`" in " ".join(report.holders)
    assert "test_leaks.py" in report.fix and "`loss_history.append(loss)`" in report.fix
    assert any(text == "loss = criterion(model(x), y)" for _, _, text, _ in report.sites)
    loss_history.clear()


def test_detector_stays_quiet_on_a_clean_step():
    loss_history.clear()
    report = find_graph_leaks(_recipe(clean_step), config=TrainConfig(batch_size=32), steps=8)
    assert not report.leaking, report.table()
    assert report.message.startswith("clean:") and not report.fix
    loss_history.clear()


def test_detector_restores_the_model_and_plots(tmp_path):
    recipe = _recipe(clean_step)
    before = state(recipe.model)
    report = find_graph_leaks(recipe, steps=4)
    assert same_state(before, state(recipe.model))
    report.plot(path=tmp_path / "leak.png")
    assert (tmp_path / "leak.png").stat().st_size > 1000


def test_detector_bad_steps_message():
    with pytest.raises(ToolOptionError, match=r"steps=2: allowed: a whole number >= 4"):
        find_graph_leaks(_recipe(clean_step), steps=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_sync_point_detector_says_it_needs_cuda_on_the_cpu():
    report = find_sync_points(_recipe(clean_step))
    assert not report.available
    assert report.message.startswith("needs CUDA: this model trains on cpu")
    assert "needs CUDA" in report.table()


def item_step(model, batch):
    x, y = batch
    loss = criterion(model(x), y)
    if loss.item() > 100:  # a host/device sync every step
        print("large loss")
    return loss


@pytest.mark.cuda
def test_sync_point_detector_points_at_the_line_that_syncs_on_cuda():
    report = find_sync_points(_recipe(item_step), config=TrainConfig(batch_size=32, accelerator="cuda"), steps=4)
    assert report.available
    where = [w for w, text, _ in report.sites if "loss.item()" in text]
    assert where and "test_leaks.py" in where[0]
    clean = find_sync_points(_recipe(clean_step), config=TrainConfig(batch_size=32, accelerator="cuda"), steps=4)
    assert clean.message.startswith("no synchronisation from your code")
