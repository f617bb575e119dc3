"""A live engine switched to another config keeps every rule of a switch, whichever door the config comes through:
a call given again (nbtrain.fit), Engine.reconfigure and Engine.request between runs, Engine.request during a run.
What this machine cannot run, an epoch with no full batch, a process count changed inside the process and a batching
change on a DataLoader whose own sampler decides are each refused with one error naming the option, and the engine is
left as it was (config, weights, optimizer state; a run asked mid-run trains on as it was)."""
import itertools

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import nbtrain
from nbtrain.api import live_engine
from nbtrain.options import ConfigError
from helpers import regression_data, same_weights, weights

RULES = {  # rule -> (the change asked for, the option its refusal names)
    "this machine cannot run it": ({"precision": "16-mixed"}, "precision"),  # accelerator='cpu': on any machine
    "an epoch with no full batch": ({"batch_size": 100, "drop_last": True}, "batch_size"),
    "processes inside this one": ({"devices": 2}, "devices"),
    "the loader's own sampler decides": ({"batch_size": 8}, "batch_size"),
}
DOORS = ("fit given again", "reconfigure", "request", "request mid-run")
# fit with devices=2 starts DDP ranks: a run elsewhere, not a switch of this process's engine.
CASES = [(rule, door) for rule, door in itertools.product(RULES, DOORS)
         if (rule, door) != ("processes inside this one", "fit given again")]


def train_once(rule, ask_mid_run=None):
    """A model trained one step (its live engine made), and the fit that trains it again with `options`."""
    data = regression_data(n=64)
    train = DataLoader(data, batch_sampler=[list(range(i, i + 16)) for i in range(0, 64, 16)]) \
        if rule == "the loader's own sampler decides" else data
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    asked = []

    def training_step(model, batch):
        if ask_mid_run is not None and not asked:
            try:
                live_engine(model).request(**ask_mid_run)
                asked.append(None)
            except (ConfigError, ValueError) as error:
                asked.append(error)
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    def fit(**options):
        return nbtrain.fit(model, train, training_step=training_step, accelerator="cpu", max_steps=1, **options)
    fit()
    return model, fit, asked


@pytest.mark.parametrize("rule,door", CASES)
def test_a_refused_switch_names_the_option_and_leaves_the_engine_as_it_was(rule, door):
    change, option = RULES[rule]
    model, fit, asked = train_once(rule, ask_mid_run=change if door == "request mid-run" else None)
    engine = live_engine(model)
    config, before, state = engine.config, weights(model), repr(engine.optimizer.state_dict())
    if door == "request mid-run":
        result = fit()
        assert result.status == "completed"
        assert len(asked) == 1 and isinstance(asked[0], (ConfigError, ValueError)), asked
        assert option in str(asked[0])
    else:
        with pytest.raises((ConfigError, ValueError)) as refused:
            if door == "fit given again":
                fit(**change)
            elif door == "reconfigure":
                engine.reconfigure(config.replace(**change))
            else:
                engine.request(**change)
        assert option in str(refused.value)
        assert same_weights(before, weights(model)) and repr(engine.optimizer.state_dict()) == state
    assert live_engine(model) is engine and engine.pending is None
    # Mid-run, the run's own call gave its config again (equal values); elsewhere nothing was switched at all.
    assert engine.config == config if door == "request mid-run" else engine.config is config


NEW_PARTS = {  # a call given again with these parts, each other than the live ones (and a config refused)
    "optimizer": lambda data: {"optimizer": lambda p: torch.optim.Adam(p, lr=0.01)},
    "scheduler": lambda data: {"scheduler": lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)},
    "data": lambda data: {"train_data": regression_data(n=64, seed=1)},
    "loss": lambda data: {"loss_fn": nn.L1Loss()},
}


def live_and_twin():
    """Two models trained alike (SGD with momentum: state a fresh optimizer would lose), one step each."""
    made = []
    for _ in range(2):
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        data = regression_data(n=64)
        parts = dict(train_data=data, loss_fn=nn.MSELoss(), accelerator="cpu", batch_size=16, seed=0,
                     optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
        nbtrain.fit(model, max_steps=1, **parts)
        made.append((model, parts))
    return made


@pytest.mark.parametrize("part", NEW_PARTS)
def test_a_refused_call_with_new_parts_leaves_the_live_parts_as_they_were(part):
    """The switch's rules are checked against the call's own parts before any is adopted: a call refused for an
    epoch with no full batch of its data leaves the live optimizer (and its state), schedule, data and position,
    and the next call trains on bit for bit as a twin's that was never refused."""
    (live, parts), (twin, twin_parts) = live_and_twin()
    engine = live_engine(live)
    optimizer, schedule, recipe = engine.optimizer, engine.schedule, engine.recipe
    with pytest.raises(ConfigError, match="batch_size=100: with drop_last=True an epoch of 64 samples"):
        nbtrain.fit(live, max_steps=1, **{**parts, **NEW_PARTS[part](parts["train_data"]), "batch_size": 100,
                                          "drop_last": True})
    assert (engine.optimizer, engine.schedule, engine.recipe) == (optimizer, schedule, recipe)
    nbtrain.fit(live, max_steps=2, **parts)
    nbtrain.fit(twin, max_steps=2, **twin_parts)
    assert same_weights(weights(live), weights(twin))
