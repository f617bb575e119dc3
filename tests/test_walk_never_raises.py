"""The checklist walk never raises on the user's model: an item whose keep cannot be checked is reported in its
row and the walk goes on (issue 49, item 11: the ddp item won, its learning-rate check trained devices=2 inside
the kernel, and the walk ended in Engine.reconfigure's ValueError)."""
import dataclasses

import pytest

from landscapes import LANDSCAPES
from nbtrain.walk.items import Tried
from nbtrain.walk.walker import run_walk
from simulated_machine import SimulatedMachine, true_rate

_IN_PROCESS = "devices cannot change inside a running process; start a new run with them instead"


class _DDPWins(SimulatedMachine):
    """A machine whose two DDP processes train three times as fast, and whose learning-rate check trains in this
    process (as walk/bench.py's did before the fix): a devices change there raises as Engine.reconfigure does."""

    def __post_init__(self):
        super().__post_init__()
        self.here.ddp_refusal = lambda config: ""
        self.lr_checked = []

    def apart(self, label, config, steps):
        rate = 3 * true_rate(self.land, config.replace(devices=1))
        self.now += 5.0
        return Tried(label, config, rate, blocks=[rate * (1 + 0.01 * k) for k in range(6)], apart=True)

    def checked_lr(self, config):
        self.lr_checked.append(config)
        if config.world_size != self.start.world_size:
            raise ValueError(_IN_PROCESS)
        return config, []


@pytest.mark.parametrize("land", [LANDSCAPES[0], next(x for x in LANDSCAPES if not x.cuda)], ids=lambda x: x.name)
def test_a_keep_whose_learning_rate_check_cannot_run_is_a_row_and_the_walk_goes_on(land):
    start = land.start.replace(scale_lr="linear", base_batch_size=land.start.global_batch_size)
    bench = _DDPWins(dataclasses.replace(land, start=start), seed=0)
    walk = run_walk(bench, budget_s=600, clock=bench.clock, items=("batch_size", "ddp"))
    (ddp,) = [i for i in walk.items if i.name == "ddp"]
    assert any(c.world_size == 2 for c in bench.lr_checked), walk.table()  # the ddp item won: its check ran
    assert not ddp.kept and "learning-rate check" in ddp.note and _IN_PROCESS in ddp.note, walk.table()
    assert walk.best_config.world_size == 1 and _IN_PROCESS in walk.table()


@pytest.mark.slow
def test_the_learning_rate_check_of_a_devices_change_runs_in_processes_of_its_own():
    # The real cause of item 11: EngineBench.checked_lr trained devices=2 on the trial's engine in this process.
    from nbtrain import TrainConfig
    from nbtrain.demo import digits_recipe
    from nbtrain.tools import trial
    from nbtrain.walk.bench import EngineBench
    from checklist_recipes import same_state, state

    recipe = digits_recipe()
    before = state(recipe.model)
    start = TrainConfig(batch_size=32, scale_lr="linear", base_batch_size=32)
    with trial.borrow(recipe=recipe, config=start) as lent:
        bench = EngineBench(lent)
        ddp = start.replace(devices=2)
        assert ddp.lr_factor() == 2
        checked, notes = bench.checked_lr(ddp)
        bench.restore()
    assert checked.world_size == 2 and checked.scale_lr in ("linear", "sqrt", "none"), notes
    assert same_state(before, state(recipe.model))
