"""A user's action checks its config against this machine, and adopts the recipe's DataLoader settings, once: a Run
click in the panel, a trial's snapshot put back, a trial's run in processes of its own. Each test counts the calls
of the check (or the adoption) through the real call path, on a tiny model on the CPU; a second check would be a
second code path that must agree with the first. A refused config still gives one error naming the option and
leaves the live engine and the model as they were."""
import threading

import pytest
import torch
from torch.utils.data import DataLoader

import nbtrain
from nbtrain import TrainConfig, hardware
from nbtrain.api import live_engine
from nbtrain.engine.engine import Engine
from nbtrain.engine.state import Snapshot
from nbtrain.options import ConfigError
from nbtrain.recipe import Recipe
from nbtrain.tools import trial
from helpers import regression_data, regression_recipe, same_weights, weights

NO_GPU = hardware.Inventory(cuda_devices=0, cuda_bf16=False, mps=False, cpu_cores=2)


def counted_checks(monkeypatch) -> list:
    """(thread, config) of every check that this machine runs a config, by whichever module's name it is called."""
    import nbtrain.api
    import nbtrain.engine.changes
    import nbtrain.engine.engine
    import nbtrain.notebook.panel
    from nbtrain import config as config_module
    calls, original = [], config_module.check_runnable

    def check_runnable(config, *args, **kwargs):
        calls.append((threading.get_ident(), config))
        return original(config, *args, **kwargs)
    for module in (config_module,  # run_apart imports it from config.py when it runs
                   nbtrain.api, nbtrain.engine.changes, nbtrain.engine.engine, nbtrain.notebook.panel):
        monkeypatch.setattr(module, "check_runnable", check_runnable)
    return calls


def counted_adoptions(monkeypatch) -> list:
    """The config of every adoption of a recipe's DataLoader settings (Recipe.adopt_settings)."""
    calls, original = [], Recipe.adopt_settings

    def adopt_settings(recipe, config):
        calls.append(config)
        return original(recipe, config)
    monkeypatch.setattr(Recipe, "adopt_settings", adopt_settings)
    return calls


# --- the panel's Run ------------------------------------------------------------------------------------------

@pytest.fixture
def panel():
    made = nbtrain.panel(regression_recipe(), TrainConfig(accelerator="cpu", batch_size=16, seed=0), display=False)
    yield made
    made.close()


def test_a_run_click_checks_its_config_against_this_machine_once(panel, monkeypatch):
    panel.controls.max_steps.value = "3"  # a control changed is checked as it changes (the readout), not counted
    checks, adoptions = counted_checks(monkeypatch), counted_adoptions(monkeypatch)
    panel.run_button.click()
    clicked = [config for thread, config in checks if thread == threading.get_ident()]
    adopted = len(adoptions)  # before the run's thread (nbtrain.fit, a door of its own) adopts it again
    assert panel.wait(60)
    assert len(clicked) == 1, clicked  # the click's own check; engine_for is told it is settled
    assert adopted >= 1  # the recipe's DataLoader settings, given to the config in the click
    record = panel.runs[0]
    assert record.status == "completed" and panel.engine.step == 3 and panel.engine.config == record.config
    assert live_engine(panel.recipe.model) is panel.engine


def test_a_run_click_refused_by_this_machine_says_why_once_and_leaves_the_engine_as_it_was(panel, monkeypatch):
    engine, config, before = panel.engine, panel.engine.config, weights(panel.recipe.model)
    with hardware.assume(NO_GPU):
        panel.controls.precision.select("16-mixed")  # accelerator='cpu': refused on any machine
        checks = counted_checks(monkeypatch)
        panel.run_button.click()
    assert len(checks) == 1
    assert panel.status_text == ("invalid training configuration: precision='16-mixed': 16-mixed needs a CUDA GPU "
                                 "(it uses a GradScaler); on cpu use 32-true or bf16-mixed")
    assert panel.runs == [] and not panel.running and panel.errors == []
    assert panel.engine is engine and engine.config is config and live_engine(panel.recipe.model) is engine
    assert same_weights(before, weights(panel.recipe.model))


# --- a trial's snapshot put back ------------------------------------------------------------------------------

def test_a_snapshot_put_back_does_not_check_its_config_against_this_machine_again(monkeypatch):
    checks = counted_checks(monkeypatch)
    engine = Engine(regression_recipe(), TrainConfig(accelerator="cpu", batch_size=16, seed=0))
    snapshot = Snapshot(engine)
    before, optimizer = weights(engine.model), repr(engine.optimizer.state_dict())
    engine.reconfigure(engine.config.replace(batch_size=32, max_steps=3))
    engine.run()
    assert engine.step == 3 and not same_weights(before, weights(engine.model))
    snapshot.restore()
    assert sum(config is snapshot.config for _, config in checks) == 1  # when it became the engine's, not again
    assert engine.config is snapshot.config and engine.step == 0
    assert same_weights(before, weights(engine.model)) and repr(engine.optimizer.state_dict()) == optimizer


class Rows(torch.utils.data.Dataset):
    """A data set the user can shorten while a tool holds a snapshot of an engine training it."""

    def __init__(self, n):
        self.rows = list(regression_data(n=n))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def test_a_snapshot_put_back_still_refuses_a_config_the_data_no_longer_fills_and_changes_nothing():
    """What can change between the capture and the restore is checked again: the data set is the user's object."""
    data = Rows(64)
    recipe = Recipe(model=regression_recipe().model, train_data=data, loss_fn=torch.nn.MSELoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.05))
    engine = Engine(recipe, TrainConfig(accelerator="cpu", batch_size=16, drop_last=True, seed=0, max_steps=2))
    snapshot = Snapshot(engine)
    engine.run()
    config, trained, optimizer = engine.config, weights(engine.model), repr(engine.optimizer.state_dict())
    del data.rows[8:]
    with pytest.raises(ConfigError) as refused:
        snapshot.restore()
    assert str(refused.value).count("\n") == 0 and "batch_size=16: with drop_last=True an epoch of 8 samples" \
        in str(refused.value)
    assert engine.config is config and engine.step == 2
    assert same_weights(trained, weights(engine.model)) and repr(engine.optimizer.state_dict()) == optimizer


# --- a trial's run in processes of its own ----------------------------------------------------------------------

@pytest.fixture
def launched(monkeypatch):
    """The configs trial.run_apart hands the DDP launcher, which then really starts its ranks with them."""
    from nbtrain.distributed import launch
    configs, real = [], launch.fit_distributed

    def fit_distributed(recipe, config, **kwargs):
        configs.append(config)
        return real(recipe, config, **kwargs)
    monkeypatch.setattr(launch, "fit_distributed", fit_distributed)
    return configs


def live_model(loader, **options):
    torch.manual_seed(0)
    model = regression_recipe().model
    nbtrain.fit(model, loader, loss_fn=torch.nn.MSELoss(), accelerator="cpu", seed=0, max_steps=1, **options)
    return model


@pytest.mark.slow  # two real DDP ranks start
def test_a_trials_run_apart_adopts_the_loaders_settings_once(launched, monkeypatch):
    model = live_model(DataLoader(regression_data(n=64), batch_size=16, shuffle=True))
    adoptions = counted_adoptions(monkeypatch)
    with trial.borrow(model) as lent:
        candidate = lent.engine.config.replace(devices=2)
        result = trial.run_apart(lent, candidate, 5)
    assert result.status == "completed" and result.summary.steps == 5, result.status
    assert len(adoptions) == 1  # the trial's config, in borrow; a candidate made from it is not adopted again
    assert launched == [candidate.replace(max_steps=5, max_epochs=None)]
    assert (launched[0].batch_size, launched[0].shuffle) == (16, True)  # the loader's, adopted for the trial


@pytest.mark.slow  # two real DDP ranks start
def test_a_trials_run_apart_runs_the_candidate_as_the_trials_own_engine_would(launched):
    """A candidate that turns workers on over a trial whose config gave none runs apart with the settings it names,
    as the trial's engine runs it in this process: not the DataLoader's worker settings taken again."""
    loader = DataLoader(regression_data(n=64), batch_size=16, num_workers=2, persistent_workers=True,
                        prefetch_factor=4)
    model = live_model(loader, num_workers=0)
    with trial.borrow(model) as lent:
        candidate = lent.engine.config.replace(num_workers=2)
        lent.engine.reconfigure(candidate)
        here = lent.engine.config
        lent.reset()
        result = trial.run_apart(lent, candidate.replace(devices=2), 5)
    for apart in (launched[0], result.config):  # what the launcher was handed, and what its ranks ran
        assert (apart.num_workers, apart.persistent_workers, apart.prefetch_factor) == \
            (here.num_workers, here.persistent_workers, here.prefetch_factor)


@pytest.mark.parametrize("case", ["a batching change on a DataLoader whose own sampler decides",
                                  "more processes than this machine has"])
def test_a_trials_run_apart_refused_names_the_option_once_and_leaves_the_model_and_live_engine(launched, case):
    data = regression_data(n=64)
    fixed = case.startswith("a batching")
    loader = DataLoader(data, batch_sampler=[list(range(i, i + 16)) for i in range(0, 64, 16)]) if fixed else \
        DataLoader(data, batch_size=16)
    model = live_model(loader)
    engine = live_engine(model)
    config, before, state = engine.config, weights(model), repr(engine.optimizer.state_dict())
    change, option = ({"num_workers": 2}, "num_workers") if fixed else ({"devices": 10_000}, "devices")
    with trial.borrow(model) as lent:
        with pytest.raises(ConfigError) as refused:
            trial.run_apart(lent, lent.engine.config.replace(**{"devices": 2, **change}), 5)
    text = str(refused.value)
    assert text.startswith(f"invalid training configuration: {option}=") and "\n" not in text, text
    if fixed:
        assert "own batch_sampler" in text
    assert launched == []
    assert live_engine(model) is engine and engine.config is config
    assert same_weights(before, weights(model)) and repr(engine.optimizer.state_dict()) == state
