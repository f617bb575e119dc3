"""What a config learns in a given wall time, scored on held-out data: one side of a race of what is learned.

The walk (walk/quality.py, through its bench) and nbtrain.ab race a change that alters what is learned against
the current config this way (rule 11): each trains `seconds` from the trial's starting weights on the same data in
the same order (the trial's seed and position), and is scored by its loss on the recipe's val_data, or, where none
was given, on a seeded slice of the training data that the races then do not train on (held_out), said as such.
"""
from __future__ import annotations

import dataclasses

from ..engine.data import stop_workers
from ..engine.state import Snapshot
from ..measure.learned import Learned
from ..metrics import MetricsLog
from . import trial

_SCORED_SLICE = 512  # training samples a race of what is learned scores on where the recipe has no val_data


class EqualTimeScorer:
    """Trains a config for a wall time on a trial (`lent`, tools/trial.borrow) and scores it; every call puts the
    trial's engine back where it found it."""

    def __init__(self, lent):
        self.lent = lent
        self.engine = lent.engine
        self._parts, self._start, self._start_score = None, None, None

    def quality(self, config, seconds: float, current=None, evaluations: int = 1) -> Learned:
        """`config` trained `seconds` from the trial's starting weights, its loss on held-out data, with the starting
        weights' loss. `evaluations` > 1: scored after each of that many equal parts of the time too (Learned.curve;
        the seconds are its runs' training clocks, each part's start-up and the scoring set apart)."""
        if config.world_size > 1:
            return Learned(float("nan"), note="it runs in processes of its own, which this race cannot alternate")
        engine, data, scored = self._scoring()
        if data is None:
            return Learned(float("nan"), note=scored)
        start, curve, trained = float("nan"), [], 0.0
        try:
            start = self._start_loss(engine, data)
            with engine.keeping_workers():  # DataLoader workers kept from one part to the next, as in one run
                for part in range(evaluations):
                    log = MetricsLog()
                    m = trial.measure(engine, config, seconds=seconds / evaluations, warmup_steps=0, log=log)
                    # a later part that a busy machine left no step: no progress in its time, not a failure
                    stalled = part and m.steps == 0 and not m.diverged
                    if (m.error or m.diverged) and not stalled:
                        return Learned(float("nan"), scored, note=m.error or "its loss diverged", start=start)
                    # the run's own training clock (a part's start-up is each side's alike, and not training)
                    trained += log.columns["time"][-1] if log.columns["step"] else 0.0
                    curve.append((trained, float(engine.evaluate(data)["val_loss"])))
            return Learned(curve[-1][1], scored, start=start, curve=tuple(curve) if evaluations > 1 else ())
        except Exception as error:  # noqa: BLE001 - a candidate that cannot train is a row, never the walk's end
            if trial.is_oom(error):
                return Learned(float("nan"), scored, note="out of memory", start=start)
            return Learned(float("nan"), scored, note=trial.failed(error), start=start)
        finally:
            if engine is not self.engine:  # the races' own engine back where it started, its workers stopped
                self._start.restore()
                stop_workers(engine.loader)
            self.lent.reset()
            trial.release_memory()

    def _start_loss(self, engine, data) -> float:
        """The held-out loss of the weights every race starts from, read once (every call starts from them)."""
        if self._start_score is None:
            self._start_score = float(engine.evaluate(data)["val_loss"])
            self.lent.reset()  # whatever scoring touched (the RNG, modes) put back before the first race trains
            if self._start is not None:
                self._start.restore()
        return self._start_score

    def _scoring(self) -> tuple:
        """(the engine a race of what is learned trains, the data it is scored on, how that is said), made once: the
        trial's engine where val_data was given, else a fork of it over the training data less a slice set aside."""
        if self._parts is None:
            recipe = self.engine.recipe
            data, scored, rest = held_out(recipe)
            engine = self.engine
            if rest is not None:
                engine = self.engine.fork(dataclasses.replace(recipe, train_data=rest))
                self._start = Snapshot(engine)
            self._parts = (engine, data, scored)
        return self._parts


def held_out(recipe) -> tuple:
    """(the data a race of what is learned scores on, how it is said, the training data it then trains on: None for
    the recipe's own); (None, why, None) where there is none. Without val_data a seeded slice of the training data
    (a fifth, at most _SCORED_SLICE samples) is set aside and the races train on the rest; a user's own DataLoader
    cannot be split, so there it is scored on samples also trained on, and said so."""
    if recipe.val_data is not None:
        return recipe.val_data, "held-out (val_data)", None
    data = recipe.train_data
    try:
        n = len(data)
    except TypeError:
        return None, "no val_data given, and the training data has no length to set a slice of it aside", None
    import torch
    from torch.utils.data import Subset
    k = max(1, min(n // 5, _SCORED_SLICE))
    if recipe.fixed_loader is not None or n < 2:
        return (Subset(data, range(k)), f"training loss on its first {k} samples (no val_data given, and a "
                                        f"DataLoader of the user's own is not split)", None)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    return (Subset(data, order[:k]), f"held-out ({k} training samples set aside, no val_data given)",
            Subset(data, order[k:]))
