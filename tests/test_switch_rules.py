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
