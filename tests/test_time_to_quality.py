"""Faster means the same model sooner (issue 48, rule 11): the walk keeps only what its own closing race backs, and
a change that alters what is learned is judged by held-out loss at equal wall time (simulated machine)."""
import dataclasses

from landscapes import LANDSCAPES
from nbtrain.walk.walker import run_walk
from simulated_machine import SimulatedMachine, true_rate

H200 = LANDSCAPES[0]


class GainGoneAtTheEnd(SimulatedMachine):
    """The items' races read their true gains; the closing race (the start raced after the walk moved) sees every
    config at the start's rate, as a load that took the gain away would: it reads no measurable difference."""

    moved = False

    def block(self, config, seconds, current=None):
        self.moved |= current is not None and current != self.start
        if self.moved and current == self.start and config != self.start:
            config = self.start  # timed as the start: the same true rate on both sides
        return super().block(config, seconds, current)


def test_a_walk_whose_closing_race_reads_no_difference_keeps_nothing():
    machine = GainGoneAtTheEnd(H200, seed=0)
    walk = run_walk(machine, budget_s=60, clock=machine.clock, keep_best=True)
    assert any(i.kept for i in walk.items), walk.table()  # the items kept changes on their own races
    assert walk.chosen_config != walk.start_config and walk.best_config == walk.start_config, walk.table()
    assert not walk.head_to_head.verdict.faster and not walk.moved
    assert walk.headline().startswith("nothing kept: the closing race of the walk's choice against the start read "
                                      "no measurable difference"), walk.headline()
    assert "best config: the starting one" in walk.table() and "nothing kept" in walk.table().splitlines()[-4]
    # an honest walk on the same machine keeps what its closing race backs
    plain = run_walk(m := SimulatedMachine(H200, seed=0), budget_s=60, clock=m.clock)
    assert plain.moved and plain.head_to_head.verdict.faster and not plain.withdrawn, plain.table()
    assert plain.best_config == plain.chosen_config
