"""LR finder: an exponential learning-rate sweep on the live model, suggestion at the steepest descent.

The sweep trains one batch per rate, from `start_lr` to `end_lr`, with the engine's own loop
(the rate of every parameter group is set between steps), stops when the smoothed loss
diverges, and restores the model and optimizer afterwards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import plotting
from . import trial
from ..config import TrainConfig
from .tool_options import JointProblem, ToolRefusal, declare, option


@dataclass
class LRFind:
    lrs: list
    losses: list             # raw training loss at each rate
    smoothed: list           # exponentially smoothed, bias-corrected
    suggestion: float
    stopped_early: bool

    def table(self) -> str:
        best = int(np.argmin(self.smoothed))
        return (f"nbtrain LR finder: {len(self.lrs)} rates from {self.lrs[0]:.2g} to {self.lrs[-1]:.2g}"
                f"{' (stopped: loss diverged)' if self.stopped_early else ''}\n"
                f"  lowest smoothed loss {self.smoothed[best]:.4g} at lr {self.lrs[best]:.3g}\n"
                f"  suggestion (steepest descent): lr = {self.suggestion:.3g}")

    def plot(self, path=None, ax=None):
        with plotting.axes(path, ax, figsize=(6, 3.2)) as ax:
            ax.plot(self.lrs, self.losses, color="tab:blue", alpha=0.3, lw=1, label="loss")
            ax.plot(self.lrs, self.smoothed, color="tab:blue", lw=1.6, label="smoothed")
            ax.axvline(self.suggestion, color="tab:red", ls="--", label=f"suggestion {self.suggestion:.2g}")
            ax.set_xscale("log")
            ax.set_xlabel("learning rate")
            ax.set_ylabel("training loss")
            ax.legend(fontsize=7)
        return ax.figure


def _rates_in_order(values: dict) -> list:
    if values["start_lr"] < values["end_lr"]:
        return []
    return [JointProblem("start_lr", values["start_lr"], "numbers with 0 < start_lr < end_lr",
                         others=(("end_lr", values["end_lr"]),))]


@declare("find_lr", "nbtrain.tune.find_lr", "LR finder: exponential sweep, suggestion at the steepest descent", (
    option("start_lr", "number", "first rate of the sweep", note="the sweep's first rate", above=0, flag="start_lr",
           metavar="LR"),
    option("end_lr", "number", "last rate of the sweep", note="the sweep's last rate", above=0, flag="end_lr",
           metavar="LR"),
    option("steps", "whole", "rates to try", note="rates to try", low=5, flag="steps"),
    option("beta", "number", "loss smoothing", note="loss smoothing", low=0, below=1),
    option("diverge", "number", "the smoothed loss this many times its lowest ends the sweep",
           note="the smoothed loss this many times its lowest ends the sweep", above=1)), joint=_rates_in_order)
def find_lr(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
            start_lr: float = 1e-7, end_lr: float = 10.0, steps: int = 100, beta: float = 0.9,
            diverge: float = 4.0, **parts) -> LRFind:
    """Sweep the rate exponentially over `steps` batches; suggest the rate where the loss falls fastest."""
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        return _sweep(lent.engine, start_lr, end_lr, steps, beta, diverge)


def _sweep(engine, start_lr: float, end_lr: float, steps: int, beta: float, diverge: float) -> LRFind:
    start = trial.plain_config(engine.config)
    ratio = (end_lr / start_lr) ** (1 / (steps - 1))
    rates = [start_lr * ratio**i for i in range(steps)]
    lrs, losses, smoothed = [], [], []
    state = {"avg": 0.0, "best": math.inf, "diverged": False}
    group_scale = None

    def on_event(event, log):
        nonlocal group_scale
        if event["type"] != "steps":
            return
        for lr, loss in zip(event["rows"]["lr"], event["rows"]["loss"]):
            lrs.append(lr)
            losses.append(loss)
            state["avg"] = beta * state["avg"] + (1 - beta) * loss
            smooth = state["avg"] / (1 - beta ** len(losses))
            smoothed.append(smooth)
            state["best"] = min(state["best"], smooth)
            if not math.isfinite(loss) or smooth > diverge * state["best"]:
                state["diverged"] = True
                engine.stop("diverged")
        if len(lrs) < steps:  # the next step's rate, for every group in proportion
            for group, scale in zip(engine.optimizer.param_groups, group_scale):
                group["lr"] = rates[len(lrs)] * scale

    from ..metrics import MetricsLog
    log = MetricsLog()
    log.subscribe(on_event)
    sweep = start.replace(scale_lr="none", warmup_steps=0, log_every_n_steps=1, base_batch_size=None)
    engine.reconfigure(sweep.replace(max_steps=steps))
    first = engine.optimizer.param_groups[0]["lr"]
    group_scale = [g["lr"] / first for g in engine.optimizer.param_groups]
    for group, scale in zip(engine.optimizer.param_groups, group_scale):  # the trial's own optimizer's rates
        group["lr"] = rates[0] * scale
    trial.measure(engine, sweep, steps=steps, warmup_steps=0, log=log)
    if len(lrs) < 5:
        raise ToolRefusal(lambda spell: f"the loss diverged after {len(lrs)} rates; lower {spell('start_lr')}")
    return LRFind(lrs, losses, smoothed, _steepest(lrs, smoothed), state["diverged"])


def _steepest(lrs, smoothed) -> float:
    """The rate where the smoothed loss falls fastest against log(lr), up to its minimum."""
    end = int(np.argmin(smoothed)) + 1
    skip = max(1, end // 10)  # the first few smoothed values are still settling
    xs, ys = np.log10(lrs[skip:end]), np.asarray(smoothed[skip:end])
    if len(xs) < 3:
        return float(lrs[max(end - 1, 0)])
    return float(10 ** xs[int(np.argmin(np.gradient(ys, xs)))])
