"""The user's schedules, held-out metrics, early stopping, best weights and loggers (issue 16)."""
import csv

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain.options import ConfigError
from nbtrain.recipe import RecipeError

from helpers import same_weights, weights


def classes(n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def step_lr(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_a_scheduler_factory_trains_as_a_plain_loop_stepping_it(interval):
    data = classes()
    model, reference = net(), net()
    nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), optimizer=sgd, scheduler=step_lr,
                scheduler_interval=interval, batch_size=16, max_steps=20, shuffle=False)
    optimizer = sgd(reference.parameters())
    scheduler = step_lr(optimizer)
    for step in range(20):
        start = (step % 8) * 16
        nn.functional.cross_entropy(reference(data.tensors[0][start:start + 16]),
                                    data.tensors[1][start:start + 16]).backward()
        optimizer.step()
        optimizer.zero_grad()
        if interval == "step" or (step + 1) % 8 == 0:
            scheduler.step()
    assert same_weights(weights(model), weights(reference), atol=1e-6)


def test_warm_up_and_the_lr_rule_compose_with_the_schedule_and_the_plot_shows_the_curve():
    result = nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), optimizer=sgd, scheduler=step_lr,
                         scheduler_interval="step", batch_size=32, base_batch_size=16, scale_lr="linear",
                         warmup_steps=2, max_steps=10, log_every_n_steps=1)
    lrs = list(result.history["lr"])
    # rule: 0.1 x 2 = 0.2; warm-up ramps steps 1-2 (0.1, 0.2); StepLR halves every 4 steps
    assert lrs[:2] == pytest.approx([0.1, 0.2])
    assert lrs[2:4] == pytest.approx([0.2, 0.2]) and lrs[4:8] == pytest.approx([0.1] * 4)
    assert lrs[8:] == pytest.approx([0.05, 0.05])
    assert "then StepLR every step (as given)" in result.summary.lr_note


def test_a_live_batch_change_rescales_the_schedule_and_the_summary_says_how():
    model = net()
    data = classes()
    first = nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), optimizer=sgd, scheduler=step_lr,
                        batch_size=16, base_batch_size=16, scale_lr="linear", max_steps=2)
    second = nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), optimizer=sgd, scheduler=step_lr,
                         batch_size=32, base_batch_size=16, scale_lr="linear", max_steps=1, log_every_n_steps=1)
    assert first.history["lr"][-1] == pytest.approx(0.1)
    assert second.history["lr"][0] == pytest.approx(0.2)  # the same point of the curve, doubled by the rule
    assert any("schedule rescaled x2" in note and "16 -> 32" in note for note in second.summary.notes)


def test_held_out_metrics_are_reported_every_n_steps():
    def accuracy(output, target):
        return (output.argmax(1) == target).float().mean()

    result = nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(64, seed=1),
                         metrics={"accuracy": accuracy}, batch_size=16, max_steps=12, val_every_n_steps=4)
    held_out = [e for e in result.log.of_type("epoch") if "val_loss" in e]
    assert [e["step"] for e in held_out][:3] == [4, 8, 12]
    assert all(0 <= e["val_accuracy"] <= 1 and e["val_accuracy"] == pytest.approx(e["val_acc"]) for e in held_out)


def test_early_stopping_ends_the_run_and_restore_best_puts_the_best_weights_back():
    seen = []

    def noisy(output, target):  # a metric that gets worse after the first evaluation
        seen.append(1)
        return torch.tensor(float(len(seen)))

    model = net()
    result = nbtrain.fit(model, classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(16, seed=1),
                         metrics={"noisy": noisy}, batch_size=16, max_steps=100, val_every_n_steps=2,
                         monitor="val_noisy", mode="min", patience=2, restore_best=True)
    assert result.status == "completed"
    assert result.message.startswith("early stop at step 6: val_noisy did not improve for 2 validations "
                                     "(best 1 at step 2)")
    assert any(n.startswith("kept the best weights: val_noisy 1 at step 2") for n in result.summary.notes)
    replay = net()  # the same two steps, trained again: the weights put back are those of step 2
    nbtrain.fit(replay, classes(), loss_fn=nn.CrossEntropyLoss(), batch_size=16, max_steps=2)
    assert same_weights(weights(model), weights(replay))


def test_monitor_without_held_out_data_or_an_unknown_name_is_one_clear_message():
    with pytest.raises(ConfigError, match="monitor='val_loss': needs held-out data: give val_data"):
        nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), monitor="val_loss", max_steps=2)
    with pytest.raises(ConfigError, match="monitor='val_f1': not among the held-out numbers; .*allowed: val_loss"):
        nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(32), monitor="val_f1",
                    max_steps=2, val_every_n_steps=1)


def accuracy(output, target):
    return (output.argmax(1) == target).float().mean()


def test_a_misspelt_monitor_is_refused_before_anything_trains_when_the_names_are_known_up_front():
    model = net()
    before = weights(model)
    with pytest.raises(ConfigError) as refused:
        nbtrain.fit(model, classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(32), metrics={"accuracy": accuracy},
                    monitor="val_acuracy", max_steps=8, val_every_n_steps=4)
    assert str(refused.value) == ("invalid training configuration: monitor='val_acuracy': not among the held-out "
                                  "numbers; did you mean 'val_accuracy'? allowed: val_loss, val_acc, val_accuracy")
    assert same_weights(before, weights(model))  # not one step trained before the refusal


def test_a_misspelt_monitor_of_a_validation_step_ends_the_run_at_the_first_validation_keeping_its_steps():
    """With a validation_step the names are known only once it has run: the run stops there, failed, with
    the same message, and what it trained is kept (and recorded), not lost in an exception."""
    def held_out_loss(model, batch):
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    model, reference = net(), net()
    result = nbtrain.fit(model, classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(32),
                         validation_step=held_out_loss, monitor="val_los", mode="min", max_steps=12, val_every_n_steps=4,
                         batch_size=16, shuffle=False)
    assert result.status == "failed" and result.summary.run_steps == 4
    assert result.message == ("monitor='val_los': not among the held-out numbers; did you mean 'val_loss'? "
                              "allowed: val_loss")
    nbtrain.fit(reference, classes(), loss_fn=nn.CrossEntropyLoss(), max_steps=4, batch_size=16, shuffle=False)
    assert same_weights(weights(model), weights(reference))


@pytest.mark.parametrize("metric, got", [(lambda o, t: (o.argmax(1) == t).float(), "a tensor of shape (16,)"),
                                         (lambda o, t: "good", "a str ('good')"), (lambda o, t: None, "None"),
                                         (lambda o, t: [0.5, 0.5], "a list")])
def test_a_metric_that_returns_no_number_is_one_message_naming_it(metric, got):
    with pytest.raises(RecipeError) as refused:
        nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(32), metrics={"per_sample": metric},
                    max_steps=2, val_every_n_steps=2, batch_size=16)
    assert str(refused.value) == (f"the metric 'per_sample' returned {got} on a held-out batch; it must return a "
                                  "number (a float or a one-element tensor, e.g. a mean over the batch)")


def run_folders(parent):
    return sorted(p for p in parent.iterdir() if p.name.startswith("run-"))


def test_the_csv_logger_writes_losses_rates_and_held_out_numbers(tmp_path):
    result = nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), val_data=classes(32, seed=1), batch_size=16,
                         max_steps=8, log_every_n_steps=4, logger="csv", logger_dir=str(tmp_path))
    [folder] = run_folders(tmp_path)
    assert f"csv log of this run in {folder}" in result.summary.notes
    with open(folder / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    names = {r["name"] for r in rows}
    assert {"train/loss", "train/lr", "train/samples_per_s", "val/loss"} <= names
    assert [int(r["step"]) for r in rows if r["name"] == "train/loss"] == list(range(1, 9))


def test_the_tensorboard_logger_writes_an_event_file_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), batch_size=16, max_steps=6,
                log_every_n_steps=3, logger="tensorboard", logger_dir=str(tmp_path))
    [folder] = run_folders(tmp_path)
    events = EventAccumulator(str(folder))
    events.Reload()
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2, 3, 4, 5, 6] and all(e.value > 0 for e in losses)


@pytest.mark.slow
def test_a_ddp_run_logs_once_from_rank_0(tmp_path):
    nbtrain.fit(net(), classes(), loss_fn=nn.CrossEntropyLoss(), batch_size=8, max_steps=4, log_every_n_steps=2,
                devices=2, accelerator="cpu", logger="csv", logger_dir=str(tmp_path))
    [folder] = run_folders(tmp_path)
    with open(folder / "metrics.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r["name"] == "train/loss"]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize("given", [True, False])
def test_every_run_logs_into_a_folder_of_its_own_even_runs_started_the_same_second(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default folder, .nbtrain/logs, is under the working folder
    parent = tmp_path / "logs" if given else tmp_path / ".nbtrain" / "logs"
    options = dict(logger="csv", logger_dir=str(parent) if given else None, batch_size=16, log_every_n_steps=1)
    model = net()
    for steps in (2, 3, 4):  # quick runs: a few milliseconds each
        nbtrain.fit(model, classes(), loss_fn=nn.CrossEntropyLoss(), max_steps=steps, **options)
    folders = run_folders(parent)
    assert len(folders) == 3, folders
    logged = []
    for folder in folders:
        with open(folder / "metrics.csv") as f:
            logged.append([int(r["step"]) for r in csv.DictReader(f) if r["name"] == "train/loss"])
    assert sorted(logged, key=len) == [[1, 2], [3, 4, 5], [6, 7, 8, 9]]  # each run's own steps, no run's twice


@pytest.mark.parametrize("devices", [1, 2])
def test_an_unwritable_logger_dir_is_one_message_naming_the_option_before_anything_trains(devices, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    model = net()
    before = weights(model)
    with pytest.raises(ConfigError) as refused:
        nbtrain.fit(model, classes(), loss_fn=nn.CrossEntropyLoss(), max_steps=2, logger="csv",
                    logger_dir=str(blocker / "logs"), devices=devices, accelerator="cpu")
    assert str(refused.value) == (f"invalid training configuration: logger_dir='{blocker}/logs': a folder nbtrain "
                                  f"can write to (creating {blocker}/logs: Not a directory)")
    assert same_weights(before, weights(model))
