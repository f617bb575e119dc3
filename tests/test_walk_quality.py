"""The walk's race of what is learned cannot tell anything where neither side learned: it races longer while the budget
allows, says "too short to tell" where neither learns even then, and keeps no math-changing candidate on it; a longer
budget races a longer horizon (issue 48: a CNN that learned nothing at 16x its rate read "learns as well")."""
import dataclasses
import time

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from landscapes import LANDSCAPES
from nbtrain import TrainConfig
from nbtrain.tools import trial
from nbtrain.walk.bench import EngineBench
from nbtrain.walk.quality import horizon_s, race_quality
from nbtrain.walk.walker import Walk
from simulated_machine import SimulatedMachine

from checklist_recipes import same_state, state

H200 = LANDSCAPES[0]
X16 = dict(batch_size=256, scale_lr="linear", base_batch_size=16)  # the CNN's kept batch: 16x the rate


def _blobs(n, seed, labels=None):
    """4 classes of 16-feature points around fixed centres (seeded 0); `labels` 'random': labels no input predicts."""
    centres = 2 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4  # as many of each class in every set: an untrained uniform guess scores ln 4 on each
    x = centres[y] + torch.randn(n, 16, generator=g)
    if labels == "random":
        y = y[torch.randperm(n, generator=g)]
    return TensorDataset(x, y)


def _race(labels, lr, budget_s=30.0, candidate=X16):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    nn.init.zeros_(model[2].weight), nn.init.zeros_(model[2].bias)  # a uniform guess to start: ln 4 held out
    before = state(model)
    with trial.borrow(model, _blobs(1024, 1, labels), val_data=_blobs(256, 2, labels), loss_fn=nn.CrossEntropyLoss(),
                      optimizer=lambda p: torch.optim.SGD(p, lr=lr), batch_size=16, accelerator="cpu") as lent:
        bench = EngineBench(lent)
        walk = Walk(bench, budget_s, 0.6, 0.03, time.monotonic, time.monotonic())
        quality = race_quality(walk, bench.start.replace(**candidate), bench.start)
    assert same_state(before, state(model))  # every race gave the weights back
    return walk, quality


@pytest.mark.slow
def test_a_race_in_which_neither_side_learned_is_too_short_to_tell_and_keeps_nothing():
    # Labels no input predicts: held out, neither the start nor 16x its rate gets below the untrained ln 4, however long
    walk, quality = _race("random", lr=0.05, budget_s=8.0)
    assert quality.unlearned and not quality.measured and not quality.worse, quality.text()
    assert quality.text().startswith("too short to tell: neither side learned in "), quality.text()
    assert "1.39 before training" in quality.text()  # ln 4: the uniform guess it started from
    assert len(quality.current) == len(quality.candidate) == 1  # a first round that learned nothing ends the race


@pytest.mark.slow
def test_the_start_learns_and_16x_its_rate_does_not_so_16x_is_not_kept_on_its_race():
    # SGD at 0.5 learns the blobs within a few steps; at 8 (16x) every step overshoots, its held-out loss thousands of
    # times the start's and then not a number: worse in the same time, or diverged where the start did not
    walk, quality = _race(None, lr=0.5)
    assert min(quality.current) < 0.5 * quality.start, quality.text()  # the start left its uniform guess
    assert quality.worse and not quality.unlearned, quality.text()
    assert quality.text().startswith(("learns worse in the same time (held-out (val_data) ",
                                      "learns worse in the same time: its held-out (val_data) loss was not a number")), \
        quality.text()


class Unlearned(SimulatedMachine):
    """Scores each race from the start's loss (4: the simulated loss before any sample), so a race too short for
    either side to learn reads as one."""

    def quality(self, config, seconds, current=None):
        return dataclasses.replace(super().quality(config, seconds, current), start=4.0)


def test_a_race_in_which_neither_side_learned_is_raced_again_at_twice_the_horizon_until_one_does():
    # The loss falls by e over 1.6e5 samples: about 1% in a 0.5 s race at the start's rate, 4% in 2 s (the candidate
    # clips, which the simulated machine times and scores as the start)
    land = dataclasses.replace(H200, name="slow-to-learn", loss_samples=1.6e5, loss_noise=0.001)
    machine = Unlearned(land, seed=0)
    walk = Walk(machine, 60.0, 3.0, 0.03, machine.clock, machine.clock())
    quality = race_quality(walk, machine.start.replace(gradient_clip_val=1.0), machine.start)
    assert quality.seconds > horizon_s(walk) and not quality.unlearned, quality.text()
    assert "raced from 0.5 s, doubled while neither side learned; a longer budget races a longer horizon" in \
        quality.text(), quality.text()


def test_a_longer_budget_races_a_longer_horizon():
    # The race blocks stop growing at 3 s trials (a 60 s budget): the horizon still grows with the budget
    machine = SimulatedMachine(H200, seed=0)
    horizons = [horizon_s(Walk(machine, budget, min(max(budget / 20, 0.5), 3.0), 0.03, machine.clock, 0.0))
                for budget in (60, 120, 600)]
    assert horizons == [0.5, 1.0, 5.0]


class DeadAt16x(Unlearned):
    """A 16x batch at 16x the rate kills the model's units (the benchmark's CNN): its held-out loss stays at the
    start's 4, where the start's falls; each of the start's losses varies by a fifth from race to race."""

    def quality(self, config, seconds, current=None):
        learned = super().quality(config, seconds, current)
        if config.global_batch_size >= 16 * self.start.global_batch_size:
            return dataclasses.replace(learned, loss=4.0 * (1 + 0.001 * self.rng.normal()))
        return learned


def test_a_candidate_that_never_leaves_the_start_where_the_current_always_does_learns_worse_however_wide_the_rounds():
    land = dataclasses.replace(H200, name="dead-at-16x", loss_samples=2e3, loss_noise=0.2)
    machine = DeadAt16x(land, seed=3)
    walk = Walk(machine, 60.0, 3.0, 0.03, machine.clock, machine.clock())
    x16 = machine.start.replace(batch_size=16 * machine.start.batch_size, scale_lr="linear",
                                base_batch_size=machine.start.batch_size)
    quality = race_quality(walk, x16, machine.start)
    assert not quality.verdict.measurable, quality.verdict  # three rounds' paired interval alone cannot tell...
    assert quality.stalled and quality.measured and quality.worse, quality.text()  # ... what never learning can
    assert quality.text().startswith("learns worse in the same time: it never got 2% below the starting weights' 4, "
                                     "where the current config did every time (held-out (simulated) 4 vs "), \
        quality.text()
