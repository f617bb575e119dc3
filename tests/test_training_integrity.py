"""What the user's model learns is never changed without a word (issue 13, items 1, 2, 4 and 5).

Each test is one reproduction from the issue, as a user would meet it.
"""
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain.engine.checkpoint import CheckpointError
from nbtrain.options import ConfigError

from helpers import regression_data, same_weights, weights


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


# --- 1. an optimizer instance keeps its param groups ------------------------------------


def test_an_optimizer_instance_keeps_its_param_groups_and_a_group_at_lr_zero_stays_frozen():
    model = net()
    optimizer = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.0},
                                 {"params": model[2].parameters()}], lr=0.1)
    before = weights(model)
    nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), optimizer=optimizer, batch_size=32, max_steps=5)
    after = weights(model)
    assert same_weights(before[:2], after[:2]), "layer 0 (lr=0) trained"
    assert not same_weights(before[2:], after[2:]), "layer 2 did not train"
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, 0.1]


def test_the_lr_option_scales_every_group_and_keeps_a_frozen_group_at_zero():
    model = net()
    optimizer = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.0},
                                 {"params": model[2].parameters(), "lr": 0.02}], lr=0.01)
    before = weights(model)
    result = nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), optimizer=optimizer, batch_size=32,
                         max_steps=3, lr=0.05)
    assert same_weights(before[:2], weights(model)[:2])
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, pytest.approx(0.1)]  # 0.02 is 2x the default
    assert result.status == "completed"


def test_an_optimizer_built_for_another_model_is_refused_by_name():
    other = net()
    with pytest.raises(ValueError, match="optimizer: 4 of its parameters are not parameters of the model"):
        nbtrain.fit(net(), regression_data(), loss_fn=nn.MSELoss(), optimizer=torch.optim.SGD(other.parameters(), 0.1),
                    max_steps=1)


# --- 2. every resume='last' resumes -------------------------------------------------------


class CrashAt(nn.MSELoss):
    def __init__(self, call):
        super().__init__()
        self.call, self.calls = call, 0

    def forward(self, output, target):
        self.calls += 1
        if self.calls == self.call:
            raise RuntimeError("crash")
        return super().forward(output, target)


def test_resuming_twice_after_two_crashes_ends_where_an_uninterrupted_run_ends(tmp_path):
    options = dict(batch_size=16, max_steps=12, seed=3, checkpoint_every="2", checkpoint_dir=str(tmp_path))
    data = regression_data()
    straight = net()
    nbtrain.fit(straight, data, loss_fn=nn.MSELoss(), optimizer=lambda p: torch.optim.SGD(p, 0.05, momentum=0.9),
                **{**options, "checkpoint_dir": str(tmp_path / "straight")})
    model = net()
    make = lambda p: torch.optim.SGD(p, 0.05, momentum=0.9)  # noqa: E731
    with pytest.raises(RuntimeError, match="crash"):
        nbtrain.fit(model, data, loss_fn=CrashAt(6), optimizer=make, **options)
    with pytest.raises(RuntimeError, match="crash"):
        nbtrain.fit(model, data, loss_fn=CrashAt(4), optimizer=make, resume="last", **options)
    result = nbtrain.fit(model, data, loss_fn=nn.MSELoss(), optimizer=make, resume="last", **options)
    assert same_weights(weights(model), weights(straight))
    assert result.status == "completed"
    assert nbtrain.api.live_engine(model).step == 12, "the run went past its planned end"


# --- 4. an epoch without a batch is refused, not looped over -------------------------------


@pytest.mark.parametrize("budget", [{"max_steps": 5}, {"max_epochs": 2}])
def test_drop_last_with_a_batch_larger_than_the_data_is_one_clear_message(budget):
    data = TensorDataset(torch.randn(10, 8), torch.randn(10, 1))
    model = net()
    before = weights(model)
    with pytest.raises(ConfigError, match=r"batch_size=32: with drop_last=True an epoch of 10 samples holds no "
                                          r"full batch; allowed: batch_size <= 10, or drop_last=False"):
        nbtrain.fit(model, data, loss_fn=nn.MSELoss(), batch_size=32, drop_last=True, **budget)
    assert same_weights(before, weights(model))
    result = nbtrain.fit(model, data, loss_fn=nn.MSELoss(), batch_size=5, drop_last=True, max_steps=2)
    assert result.status == "completed"  # the same model trains on with a batch that fits


def test_the_magic_shows_the_empty_epoch_as_one_line(ip, capsys):
    ip.user_ns.update(model=net(), train_data=TensorDataset(torch.randn(10, 8), torch.randn(10, 1)),
                         loss_fn=nn.MSELoss())
    ip.run_cell("%%nbtrain --max-steps 5 --drop-last true --batch-size 32 --no-plot --no-progress\npass")
    err = capsys.readouterr()
    text = err.out + err.err
    assert "--batch-size=32: with drop_last=True an epoch of 10 samples holds no full batch" in text
    assert "Traceback" not in text


# --- 5. a refused resume leaves model and optimizer exactly as they were --------------------


def _state(model, optimizer):
    return [t.clone() for t in model.state_dict().values()], repr(optimizer.state_dict())


def test_resuming_another_architecture_loads_nothing(tmp_path):
    nbtrain.fit(net(), regression_data(), loss_fn=nn.MSELoss(), max_steps=2, batch_size=32,
                checkpoint_every="2", checkpoint_dir=str(tmp_path))
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(other.parameters(), lr=1e-3)
    before = _state(other, optimizer)
    with pytest.raises(CheckpointError, match="does not fit this model.*nothing was loaded"):
        nbtrain.fit(other, regression_data(), loss_fn=nn.MSELoss(), optimizer=optimizer, max_steps=2,
                    checkpoint_dir=str(tmp_path), resume="last")
    after = _state(other, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0])) and before[1] == after[1]


def test_resuming_an_sgd_checkpoint_into_adam_is_refused_and_the_model_trains_on(tmp_path):
    data = regression_data()
    nbtrain.fit(net(), data, loss_fn=nn.MSELoss(), optimizer=lambda p: torch.optim.SGD(p, 0.1), max_steps=2,
                batch_size=32, checkpoint_every="2", checkpoint_dir=str(tmp_path))
    model = net()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), optimizer=adam, max_steps=1, batch_size=32)
    before = _state(model, adam)
    with pytest.raises(CheckpointError, match=r"its optimizer is SGD, this recipe.s is Adam\); nothing was loaded"):
        nbtrain.fit(model, data, loss_fn=nn.MSELoss(), optimizer=adam, max_steps=2, batch_size=32,
                    checkpoint_dir=str(tmp_path), resume="last")
    after = _state(model, adam)
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0])) and before[1] == after[1]
    result = nbtrain.fit(model, data, loss_fn=nn.MSELoss(), optimizer=adam, max_steps=2, batch_size=32)
    assert result.status == "completed"  # no KeyError: 'betas' in the next cell


# --- the engine's state as an API ----------------------------------------------------------


def test_a_trial_gives_back_every_rng_and_the_weights_bit_for_bit_and_never_reaches_the_live_engine():
    import random

    import numpy as np
    model = net()
    nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), max_steps=3, batch_size=16, seed=1)
    engine = nbtrain.api.live_engine(model)
    optimizer, momentum = engine.optimizer, [dict(s) for s in engine.optimizer.state_dict()["state"].values()]
    before = (weights(model), engine.position(), torch.get_rng_state(), np.random.get_state()[1].copy(),
              random.getstate())
    with engine.trial(config=engine.config.replace(batch_size=8, max_steps=4)) as trial:
        trial.engine.run()
        assert trial.engine.position()["step"] == 7 and engine.position() == before[1]  # its own position
        np.random.rand(3), random.random(), torch.rand(2)  # a tool's own random draws
    after = (weights(model), engine.position(), torch.get_rng_state(), np.random.get_state()[1], random.getstate())
    assert same_weights(before[0], after[0]) and before[1] == after[1]
    assert torch.equal(before[2], after[2]) and (before[3] == after[3]).all() and before[4] == after[4]
    assert engine.config.batch_size == 16 and engine.optimizer is optimizer
    assert all(torch.equal(a[k], b[k]) for a, b in zip(momentum, engine.optimizer.state_dict()["state"].values())
               for k in a)


def test_state_dict_round_trip_continues_exactly_as_one_run():
    data = regression_data()
    straight = net()
    nbtrain.fit(straight, data, loss_fn=nn.MSELoss(), max_steps=8, batch_size=16, seed=2,
                optimizer=lambda p: torch.optim.Adam(p, 1e-2))
    model = net()
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=4, batch_size=16, seed=2,
                optimizer=lambda p: torch.optim.Adam(p, 1e-2))
    state = nbtrain.api.live_engine(model).state_dict()
    fresh = net()  # another kernel: a fresh model and engine, the state brings everything
    engine = nbtrain.Engine(nbtrain.Recipe(model=fresh, train_data=data, loss_fn=nn.MSELoss(),
                                           optimizer=lambda p: torch.optim.Adam(p, 1e-2)),
                            nbtrain.TrainConfig(batch_size=16, seed=2, max_steps=4))
    engine.load_state_dict(state)
    engine.run()
    assert same_weights(weights(fresh), weights(straight))
