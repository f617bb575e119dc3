"""A session's runs, the same for every front-end: train, record, number and name a result.

The magic and the panel parse what the user gave, show what happens and forward here; this
module (which knows nothing of Jupyter) trains through `nbtrain.fit`, records the result in
the run store (numbering it: run #id), names it, and words how a run that did not complete
left the model. `%nbtrain_runs` and `nbtrain.compare` then see every front-end's runs alike.
"""
from __future__ import annotations

from pathlib import Path

from .api import fit
from .config import TrainConfig
from .metrics import MetricsLog
from .recipe import Recipe
from .records import start_info
from .runs.result import RunResult
from .runs.store import RunStore


class Session:
    def __init__(self, store=None):
        self.store = RunStore(store)

    def train(self, recipe: Recipe, config: TrainConfig, log: MetricsLog, *, name: str | None = None,
              stop=None) -> RunResult:
        """One run on the recipe's live model (in this process, or DDP workers for devices > 1)."""
        return fit(recipe=recipe, config=config, log=log, name=name, stop=stop)

    def record(self, result: RunResult, model) -> list[str]:
        """Record `result` (numbered by the store; named '#id' unless it has a name) and return the
        notes to show under it: how it ended when it did not complete, and where it was recorded."""
        notes = [] if result.status == "completed" else [ending(result)]
        described = describe_model(model)
        run_id = self.store.record(result, model=described)
        result.extras.update(run_id=run_id, model=described, store=str(self.store.path))
        if result.name is None and run_id is not None:
            result.name = f"#{run_id}"
        notes.append(f"recorded as run #{run_id} in {shown(self.store.path)}" if run_id is not None
                     else "not recorded: the run store is unusable (see the warning)")
        return notes


def ending(result: RunResult) -> str:
    """How a run that did not complete ended, and what the model holds: one statement about it. An
    in-kernel run's model holds its steps so far; a DDP run that did not complete loaded nothing back."""
    planned = start_info(result.log).planned_steps or "?"
    model = "" if result.extras.get("weights_loaded") is False else " and the model keeps its training so far"
    steps = result.summary.trained_steps
    return (f"{result.status} after {steps} of {planned} planned steps: {result.message}. "
            f"The partial history is kept{model}.")


def describe_model(model) -> str:
    """'DigitsMLP (109,386 parameters)', as the run store and the runs table show a model."""
    return f"{type(model).__name__} ({sum(p.numel() for p in model.parameters()):,} parameters)"


def shown(path) -> str:
    """A path under the working folder as a relative path (.nbtrain/runs.sqlite), others in full."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def namespace_lr(namespace, config: TrainConfig, given: bool) -> TrainConfig:
    """`config` with the namespace's `lr` (a plain number) as its base learning rate, unless the
    learning rate was given explicitly (`given`). A bad value raises the config's own ConfigError,
    which a front-end words as "lr (in the namespace)"."""
    lr = namespace.get("lr")
    if given or not isinstance(lr, (int, float)) or isinstance(lr, bool):
        return config
    return config.replace(lr=lr)
