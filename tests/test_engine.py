import threading

import pytest
import torch
from torch import nn

import nbtrain
from nbtrain import Engine, TrainConfig
from nbtrain.recipe import Recipe

from helpers import IndexedData, regression_recipe, same_weights, weights


def test_accumulating_k_batches_of_b_equals_one_batch_of_k_times_b():
    small = regression_recipe(optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    big = regression_recipe(optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    Engine(small, TrainConfig(batch_size=8, accumulate_grad_batches=4, max_epochs=2)).run()
    Engine(big, TrainConfig(batch_size=32, max_epochs=2)).run()
    assert same_weights(weights(small.model), weights(big.model), atol=1e-5)
    assert not same_weights(weights(small.model), weights(regression_recipe().model), atol=1e-3)


def test_a_bf16_mixed_run_on_the_cpu_trains():
    from nbtrain.demo import digits_recipe
    recipe = digits_recipe()
    result = Engine(recipe, TrainConfig(precision="bf16-mixed", batch_size=64, max_epochs=3)).run()
    assert result.summary.precision == "bf16-mixed"
    assert result.summary.last_loss < 0.5 * result.summary.first_loss
    assert result.summary.val_acc > 0.8


def test_same_seed_gives_identical_weights():
    runs = []
    for _ in range(2):
        recipe = regression_recipe(seed=3)
        Engine(recipe, TrainConfig(seed=7, max_epochs=2, batch_size=16)).run()
        runs.append(weights(recipe.model))
    assert same_weights(*runs)


def test_live_changes_between_runs_take_effect_and_keep_the_weights_and_optimizer_state():
    recipe = regression_recipe(optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    engine = Engine(recipe, TrainConfig(batch_size=16, max_steps=5))
    engine.run()
    after_first = weights(recipe.model)
    momentum = engine.optimizer.state[next(recipe.model.parameters())]["momentum_buffer"].clone()
    optimizer_before = engine.optimizer
    engine.reconfigure(engine.config.replace(batch_size=32, num_workers=1, accumulate_grad_batches=2,
                                             precision="bf16-mixed"))
    assert same_weights(weights(recipe.model), after_first)
    assert engine.optimizer is optimizer_before
    assert torch.equal(engine.optimizer.state[next(recipe.model.parameters())]["momentum_buffer"], momentum)
    assert engine.loader.batch_size == 32 and engine.loader.num_workers == 1
    assert engine.precision.dtype == torch.bfloat16
    result = engine.run()
    rows = result.history
    # 32 samples per micro-batch x 2 micro-batches per optimizer step.
    assert rows["samples"][1] - rows["samples"][0] == 64
    assert result.config.accumulate_grad_batches == 2
    assert not same_weights(weights(recipe.model), after_first)


def test_a_change_requested_during_a_run_applies_at_the_next_optimizer_step():
    recipe = regression_recipe()
    engine = Engine(recipe, TrainConfig(batch_size=8, max_steps=12, log_every_n_steps=1))
    seen = []

    def step(model, batch):
        x, y = batch
        seen.append(len(x))
        if len(seen) == 4:
            engine.request(batch_size=16)
        return nn.functional.mse_loss(model(x), y)

    recipe.training_step = step
    result = engine.run()
    assert seen[:4] == [8, 8, 8, 8] and set(seen[4:]) == {16}
    change = result.log.last("change")
    assert change["step"] == 4 and change["changes"] == {"batch_size": [8, 16]}


def test_a_mid_epoch_batch_size_change_continues_with_the_samples_not_yet_seen():
    seen = []

    def step(model, batch):
        x, index = batch
        seen.extend(index.tolist())
        return model(x).pow(2).mean()

    model = nn.Linear(4, 1)
    recipe = Recipe(model=model, train_data=IndexedData(100), training_step=step,
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    engine = Engine(recipe, TrainConfig(batch_size=10, max_steps=3))
    engine.run()
    engine.reconfigure(engine.config.replace(batch_size=7, max_steps=None, max_epochs=1))
    engine.run()
    assert sorted(seen) == list(range(100))
    assert engine.epoch == 1


def test_splitting_an_epoch_over_two_runs_gives_the_same_weights_as_one_run():
    whole = regression_recipe()
    Engine(whole, TrainConfig(batch_size=16, max_epochs=1)).run()
    split = regression_recipe()
    engine = Engine(split, TrainConfig(batch_size=16, max_steps=5))
    engine.run()
    engine.reconfigure(engine.config.replace(max_steps=11))
    engine.run()
    assert same_weights(weights(whole.model), weights(split.model))


def test_losses_are_read_back_only_once_per_logging_window(monkeypatch):
    recipe = regression_recipe()
    engine = Engine(recipe, TrainConfig(batch_size=8, max_steps=20, log_every_n_steps=10))
    reads = {"item": 0, "tolist": 0}
    original_item, original_tolist = torch.Tensor.item, torch.Tensor.tolist

    def counted(name, original):
        def read(self, *args):
            # Index tensors (the sampler's order, the loader's seed) are host data, not losses.
            reads[name] += self.is_floating_point()
            return original(self, *args)
        return read

    monkeypatch.setattr(torch.Tensor, "item", counted("item", original_item))
    monkeypatch.setattr(torch.Tensor, "tolist", counted("tolist", original_tolist))
    result = engine.run()
    assert reads == {"item": 0, "tolist": 2}
    assert len(result.history["loss"]) == 20


def test_stop_from_another_thread_ends_at_a_step_boundary_and_keeps_the_history():
    recipe = regression_recipe(n=4096)
    engine = Engine(recipe, TrainConfig(batch_size=4, max_epochs=50, log_every_n_steps=1))
    stopper = threading.Timer(0.3, engine.stop)
    stopper.start()
    result = engine.run()
    assert result.status == "stopped"
    assert "stopped at step" in result.message
    assert 0 < len(result.history["step"]) == engine.step < 50 * 1024


def test_summary_states_measured_numbers():
    from nbtrain.demo import digits_recipe
    result = Engine(digits_recipe(), TrainConfig(batch_size=64, max_epochs=1)).run()
    s = result.summary
    assert s.samples == 1437 and s.steps == 23
    assert s.samples_per_s > 0 and s.time_per_epoch_s > 0 and s.peak_mem_mb > 10
    assert abs(sum(s.phase_fraction.values()) - 1) < 0.2
    assert "samples/s" in result.table()


def test_linear_lr_scaling_and_warmup_are_applied_and_stated():
    recipe = regression_recipe(optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    config = TrainConfig(batch_size=32, scale_lr="linear", base_batch_size=8, warmup_steps=4, max_steps=6,
                         log_every_n_steps=1)
    result = Engine(recipe, config).run()
    assert result.history["lr"][:4] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert result.history["lr"][4:] == pytest.approx([0.04, 0.04])
    assert "linear rule" in result.summary.lr_note and "warm-up over 4 steps" in result.summary.lr_note


def test_fit_reuses_the_live_engine_of_a_model():
    recipe = regression_recipe(optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    first = nbtrain.fit(recipe=recipe, max_steps=3)
    second = nbtrain.fit(recipe=recipe, max_steps=3)
    assert first.history["step"] == [1, 2, 3] and second.history["step"] == [4, 5, 6]


@pytest.mark.cuda
def test_moving_to_cuda_rehomes_optimizer_state():
    recipe = regression_recipe(optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    engine = Engine(recipe, TrainConfig(accelerator="cpu", max_steps=3))
    engine.run()
    engine.reconfigure(engine.config.replace(accelerator="cuda"))
    state = engine.optimizer.state[next(recipe.model.parameters())]
    assert state["exp_avg"].is_cuda and next(recipe.model.parameters()).is_cuda
    result = engine.run()
    assert result.summary.device.startswith("cuda") and result.summary.pin_memory


@pytest.mark.cuda
@pytest.mark.parametrize("precision, scaler", [("16-mixed", True), ("bf16-mixed", False), ("32-true", False)])
def test_cuda_precisions_train(precision, scaler):
    from nbtrain.demo import digits_recipe
    result = Engine(digits_recipe(), TrainConfig(accelerator="cuda", precision=precision, max_epochs=2,
                                                 batch_size=64)).run()
    assert result.summary.scaler is scaler
    assert result.summary.last_loss < result.summary.first_loss


def test_the_seed_is_torchs_global_seed():
    """The engine seeds torch as torch.manual_seed does: what the cell draws next is the same."""
    Engine(regression_recipe(seed=3), TrainConfig(seed=11, max_steps=1))
    after_engine = torch.rand(5)
    torch.manual_seed(11)
    assert torch.equal(after_engine, torch.rand(5))
