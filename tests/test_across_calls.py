"""What the model learns is the same whether it trains in one call or several, with tools between (issue 27).

A LightningModule keeps its optimizer, schedule, data and batch_idx across calls and cells as one
`lightning.Trainer` fit does; a scheduler given, replaced or removed in a later call takes effect; a
tool starts from the live engine as it is and leaves it exactly so; a kept larger batch rescales
the user's schedule; mode="auto" minimises error-like names; ReduceLROnPlateau steps on the
monitored held-out number or is refused before training.
"""
from __future__ import annotations

import functools
import threading

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nbtrain
from nbtrain.api import live_engine
from nbtrain.options import ConfigError
from nbtrain.engine.monitor import Monitor
from nbtrain.recipe import RecipeError

L = pytest.importorskip("lightning", reason="needs lightning (pip install -e '.[test]')")


def data(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


class Lit(L.LightningModule):
    """SGD with momentum and a per-step StepLR: what a restarted optimizer or schedule would change."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Linear(8, 3)
        self.batch_indices = []

    def training_step(self, batch, batch_idx):
        self.batch_indices.append(batch_idx)
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3, 0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self):
        return DataLoader(data(), batch_size=64, shuffle=False)  # 8 batches an epoch


def trainer_fit(steps: int) -> Lit:
    module = Lit()
    L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(module)
    return module


def assert_same(a: nn.Module, b: nn.Module):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), f"{name} differs by {(x - y).abs().max().item():.3g}"


def test_a_lightningmodule_trained_in_two_calls_is_one_trainer_fit_with_batch_idx_per_epoch():
    reference = trainer_fit(20)
    module = Lit()
    nbtrain.fit(module, max_steps=10, accelerator="cpu")
    nbtrain.fit(module, max_steps=10, accelerator="cpu")
    assert_same(module, reference)
    assert module.batch_indices == reference.batch_indices == list(range(8)) * 2 + list(range(4))


def test_a_stopped_lightningmodule_continues_as_one_trainer_fit():
    reference = trainer_fit(20)
    module, stop = Lit(), threading.Event()
    original = module.training_step

    def stopping_step(batch, batch_idx):
        if len(module.batch_indices) == 6:
            stop.set()  # ends the run at the step boundary: 7 steps trained
        return original(batch, batch_idx)

    module.training_step = stopping_step
    first = nbtrain.fit(module, max_steps=20, accelerator="cpu", stop=stop)
    assert first.status == "stopped" and first.summary.run_steps == 7
    module.training_step = original
    nbtrain.fit(module, max_steps=13, accelerator="cpu")
    assert_same(module, reference)
    assert module.batch_indices == reference.batch_indices


@pytest.mark.parametrize("tool", ["ab", "find_batch_size", "ceilings"])
@pytest.mark.slow
def test_a_tool_between_two_lightning_calls_changes_nothing(tool):
    reference = trainer_fit(20)
    module = Lit()
    nbtrain.fit(module, max_steps=10, accelerator="cpu")
    engine = live_engine(module.__dict__["_nbtrain_training"].value)
    optimizer, schedule, config = engine.optimizer, engine.schedule, engine.config
    run_tool(tool, module)
    assert engine.optimizer is optimizer and engine.schedule is schedule and engine.config == config
    nbtrain.fit(module, max_steps=10, accelerator="cpu")
    assert_same(module, reference)


def run_tool(tool: str, model, train_data=None, **parts):
    if tool == "ab":
        nbtrain.ab(model, train_data, a={}, b={"batch_size": 32}, block_steps=2, min_pairs=2, max_pairs=2, **parts)
    elif tool == "find_batch_size":
        nbtrain.tune.find_batch_size(model, train_data, steps=2, max_batch=128, **parts)
    elif tool == "ceilings":
        nbtrain.ceilings(model, train_data, steps=10, seconds=0.2, **parts)
    elif tool == "checklist":
        nbtrain.checklist(model, train_data, budget_s=5, items=("batch_size",), **parts)


def test_two_lightning_cells_are_one_trainer_fit(shell):
    shell.reset(new_session=False)
    shell.run_line_magic("nbtrain", "--reset")
    reference = trainer_fit(20)
    shell.user_ns.update(Lit=Lit, model=Lit())
    for _ in range(2):
        shell.run_cell("%%nbtrain --max-steps 10 --accelerator cpu --no-plot --no-progress\npass")
    assert_same(shell.user_ns["model"], reference)


# --- schedulers across calls (a plain nn.Module) ----------------------------------------


def plain_parts():
    torch.manual_seed(3)
    model = nn.Linear(8, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def lrs(result) -> list[float]:
    return [round(lr, 6) for lr in result.log.columns["lr"]]


def test_a_scheduler_given_replaced_or_removed_in_a_later_call_takes_effect():
    model, optimizer = plain_parts()
    common = dict(loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, batch_size=64, shuffle=False,
                  accelerator="cpu", log_every_n_steps=1, scheduler_interval="step")
    first = nbtrain.fit(model, data(), max_steps=3, **common)
    added = nbtrain.fit(model, data(), scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5), max_steps=6,
                        **common)
    assert lrs(first) == [0.1] * 3 and lrs(added) == [0.1] * 3 + [0.05] * 3
    replaced = nbtrain.fit(model, data(), scheduler=lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.5),
                           max_steps=2, **common)
    assert lrs(replaced) == [0.1, 0.05]  # a fresh curve from the optimizer's rate
    removed = nbtrain.fit(model, data(), scheduler=None, max_steps=2, **common)
    assert lrs(removed) == [0.1, 0.1]


@pytest.mark.parametrize("spelling", ["lambda", "partial"])
def test_the_same_scheduler_written_again_in_a_later_call_carries_on(spelling):
    model, optimizer = plain_parts()

    def step_lr():  # a new object each call, as an inline argument or a cell run again makes it
        if spelling == "partial":
            return functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
        return lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5)

    common = dict(loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, batch_size=64, accelerator="cpu",
                  log_every_n_steps=1, scheduler_interval="step")
    first = nbtrain.fit(model, data(), scheduler=step_lr(), max_steps=3, **common)
    second = nbtrain.fit(model, data(), scheduler=step_lr(), max_steps=3, **common)
    assert lrs(first) + lrs(second) == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]


def test_a_changed_scheduler_interval_takes_effect():
    model, optimizer = plain_parts()
    step_lr = lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5)  # noqa: E731
    common = dict(loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=step_lr, batch_size=128,
                  shuffle=False, accelerator="cpu", log_every_n_steps=1)
    dataset = data()  # 4 steps an epoch
    per_step = nbtrain.fit(model, dataset, scheduler_interval="step", max_steps=2, **common)
    per_epoch = nbtrain.fit(model, dataset, scheduler_interval="epoch", max_steps=4, **common)
    assert lrs(per_step) == [0.1, 0.05] and lrs(per_epoch) == [0.025] * 2 + [0.0125] * 2
    by_default = nbtrain.fit(model, dataset, max_steps=4, **common)  # left out again: StepLR's default, per epoch
    assert lrs(by_default) == [0.0125] * 2 + [0.00625] * 2
    assert "StepLR every epoch (by default" in by_default.summary.lr_note


def test_a_scheduler_added_in_a_later_cell_is_used(shell):
    shell.reset(new_session=False)
    shell.run_line_magic("nbtrain", "--reset")
    model, optimizer = plain_parts()
    shell.user_ns.update(model=model, optimizer=optimizer, train_data=data(), loss_fn=nn.CrossEntropyLoss(),
                         torch=torch)
    cell = "%%nbtrain --max-steps 3 --batch-size 64 --shuffle false --accelerator cpu --no-plot --no-progress " \
           "--log-every-n-steps 1 --name {}\n{}"
    shell.run_cell(cell.format("before", "pass"))
    shell.run_cell(cell.format("after", "scheduler = lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5)\n"
                                        "scheduler_interval = 'step'"))
    assert lrs(shell.user_ns["before"]) == [0.1] * 3 and lrs(shell.user_ns["after"]) == [0.1, 0.05, 0.025]


# --- tools start from the live engine and leave it as it was ------------------------------


@pytest.mark.parametrize("tool", ["ab", "checklist", "find_batch_size", "ceilings"])
@pytest.mark.slow
def test_a_tool_measures_the_live_optimizer_and_config_and_leaves_them_exactly(tool):
    ce = nn.CrossEntropyLoss()
    step_lr = lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5)  # noqa: E731
    options = dict(loss_fn=ce, scheduler=step_lr, batch_size=64, shuffle=False, accelerator="cpu", seed=5)
    runs = []
    for with_tool in (False, True):
        model, optimizer = plain_parts()
        nbtrain.fit(model, data(), optimizer=optimizer, max_steps=3, **options)
        engine = live_engine(model)
        before = (engine.optimizer, engine.schedule, engine.config, engine.schedule.state_dict())
        if with_tool:
            if tool == "checklist":
                result = nbtrain.checklist(model, data(), loss_fn=ce, budget_s=5, items=("batch_size",))
                assert result.start_config == nbtrain.tools.trial.plain_config(engine.config)
            else:
                run_tool(tool, model, data(), loss_fn=ce)
            assert isinstance(engine.optimizer, torch.optim.SGD)
        assert (engine.optimizer, engine.schedule, engine.config) == before[:3]
        assert engine.schedule.state_dict() == before[3]
        result = nbtrain.fit(model, data(), optimizer=optimizer, max_steps=5, **options)
        runs.append((model, lrs(result), optimizer.state_dict()["state"][0]["momentum_buffer"]))
    (plain, plain_lrs, plain_momentum), (tooled, tooled_lrs, tooled_momentum) = runs
    assert_same(tooled, plain)
    assert tooled_lrs == plain_lrs and torch.equal(tooled_momentum, plain_momentum)


def test_a_tool_given_its_own_optimizer_and_config_puts_the_live_ones_back():
    model, optimizer = plain_parts()
    nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, max_steps=3, batch_size=64,
                accelerator="cpu")
    engine = live_engine(model)
    state = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    config = engine.config
    nbtrain.ab(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.Adam(p),
               config=nbtrain.TrainConfig(batch_size=16, accelerator="cpu"), a={}, b={"batch_size": 32},
               block_steps=2, min_pairs=2, max_pairs=2)
    assert engine.optimizer is optimizer and engine.config == config
    assert torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], state["momentum_buffer"])


def test_a_tool_given_only_the_model_measures_the_live_data_loss_and_optimizer():
    model, optimizer = plain_parts()
    nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, max_steps=2, batch_size=64,
                accelerator="cpu")
    engine = live_engine(model)
    recipe = engine.recipe
    result = nbtrain.ab(model, a={}, b={"batch_size": 32}, block_steps=2, min_pairs=2, max_pairs=2)
    assert result.a == nbtrain.tools.trial.plain_config(engine.config) and result.b.batch_size == 32
    assert engine.recipe is recipe and engine.optimizer is optimizer


# --- a kept larger batch and the user's schedule -----------------------------------------


def test_a_larger_batch_kept_after_a_trial_rescales_the_users_schedule_as_a_direct_change_does():
    def trained():
        model, optimizer = plain_parts()
        nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, batch_size=32,
                    scale_lr="linear", base_batch_size=32, scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5),
                    scheduler_interval="step", max_steps=2, accelerator="cpu")
        return live_engine(model)

    kept, twin = trained(), trained()
    bigger = kept.config.replace(batch_size=256)
    with kept.trial(config=kept.config.replace(batch_size=64)) as walked:  # a trial the walk ran
        walked.engine.run()
    kept.reconfigure(bigger)  # keep_best: the call a user's change goes through
    twin.reconfigure(bigger)
    assert [g["lr"] for g in kept.optimizer.param_groups] == [g["lr"] for g in twin.optimizer.param_groups] == [0.2]
    assert kept.schedule.state_dict() == twin.schedule.state_dict() and kept.schedule.notes == twin.schedule.notes


# --- mode="auto" and ReduceLROnPlateau ----------------------------------------------------


@pytest.mark.parametrize("name, mode", [("val_top1_error", "min"), ("val_loss", "min"), ("val_acc_loss", "min"),
                                        ("val_error_rate", "min"), ("val_top1", "max"), ("val_top5", "max"),
                                        ("val_acc", "max"), ("val_top1_acc", "max"), ("val_f1", "max"),
                                        ("val_auc", "max"), ("val_mAP@0.5", "max"), ("val_r2", "max"),
                                        ("val_dice", "max"), ("val_wer", "min"), ("val_rmse", "min"),
                                        ("val_perplexity", "min")])
def test_auto_mode_minimises_error_like_names_and_maximises_accuracy_like_ones(name, mode):
    assert Monitor(name, "auto", None, False).mode == mode


@pytest.mark.parametrize("name", ["val_score", "val_foo", "val_margin"])
def test_auto_mode_refuses_a_name_it_cannot_classify_before_training_asking_for_mode(name):
    model, optimizer = plain_parts()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = {name[4:]: lambda out, y: 0.5}
    with pytest.raises(ConfigError) as refused:
        nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, val_data=data(64, 1),
                    metrics=metrics, monitor=name, max_steps=2, accelerator="cpu")
    assert str(refused.value).startswith(f"invalid training configuration: mode='auto': nbtrain cannot tell from the "
                                         f"name {name!r} whether it should go up or down; allowed: mode='max' or "
                                         "mode='min' (auto reads a name: max for a score (acc, accuracy, top1, ")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing trained
    result = nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, val_data=data(64, 1),
                         metrics=metrics, monitor=name, mode="max", max_steps=2, accelerator="cpu")
    assert result.status == "completed"


def test_restore_best_on_an_error_keeps_the_lowest():
    model, optimizer = plain_parts()
    errors = iter([0.5, 0.2, 0.4, 0.3])
    result = nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, val_data=data(64, 1),
                         metrics={"top1_error": lambda out, y: next(errors)}, batch_size=64, max_steps=8,
                         val_every_n_steps=2, monitor="val_top1_error", restore_best=True, accelerator="cpu")
    assert any("val_top1_error 0.2 at step 4" in note for note in result.summary.notes), result.summary.notes


def test_reduce_lr_on_plateau_steps_on_the_monitored_held_out_loss_as_a_plain_loop():
    plateau = lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0)  # noqa: E731
    held = data(64, 1)
    model, optimizer = plain_parts()
    nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=plateau,
                val_data=held, monitor="val_loss", batch_size=64, shuffle=False, max_epochs=4, accelerator="cpu")
    reference, ref_optimizer = plain_parts()
    scheduler = plateau(ref_optimizer)
    for _ in range(4):
        for x, y in DataLoader(data(), batch_size=64):
            nn.functional.cross_entropy(reference(x), y).backward()
            ref_optimizer.step()
            ref_optimizer.zero_grad()
        with torch.no_grad():
            scheduler.step(nn.functional.cross_entropy(reference(held.tensors[0]), held.tensors[1]).item())
    assert_same(model, reference)
    assert optimizer.param_groups[0]["lr"] == ref_optimizer.param_groups[0]["lr"] < 0.1


def test_reduce_lr_on_plateau_over_two_calls_steps_as_over_one():
    # the held-out loss rises here: every plateau step after the first cuts the rate, so an extra step shows
    plateau = lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0)  # noqa: E731
    dataset, held = data(), data(64, 1)
    rates = []
    for calls in ((12,), (6, 6)):
        model, optimizer = plain_parts()
        for steps in calls:  # 8 steps an epoch: the two calls part mid-epoch, where a closing report is made
            nbtrain.fit(model, dataset, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=plateau,
                        val_data=held, monitor="val_loss", batch_size=64, max_steps=steps, seed=3, accelerator="cpu")
        rates.append((optimizer.param_groups[0]["lr"], model))
    assert rates[0][0] == rates[1][0] == 0.1  # one plateau step (at the epoch's end), no cut
    assert_same(rates[0][1], rates[1][1])


def test_reduce_lr_on_plateau_without_a_monitored_number_is_refused_before_training():
    model, optimizer = plain_parts()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RecipeError, match="ReduceLROnPlateau steps on a monitored held-out number.*allowed: give "
                                          "val_data and monitor"):
        nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, max_steps=3,
                    scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o), accelerator="cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_reduce_lr_on_plateau_on_two_processes_is_refused_before_training():
    # only the first rank validates, so the ranks' rates would part at the first plateau step
    model, optimizer = plain_parts()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(Exception, match="ReduceLROnPlateau steps on a held-out number that only the first of 2 "
                                        "processes computes; allowed: devices=1"):
        nbtrain.fit(model, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, val_data=data(64, 1),
                    monitor="val_loss", scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
                    max_steps=3, devices=2, accelerator="cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
