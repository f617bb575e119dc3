"""The four ceilings as a checklist tool: `nbtrain.ceilings`, the `%%nbtrain --ceilings` flag, the
panel's Ceilings button. The measurement is measure/ceilings.py; this module only declares it."""
from __future__ import annotations

from ..config import TrainConfig
from ..measure import ceilings as measured
from .tool_options import declare, option


@declare("ceilings", "nbtrain.ceilings", "the step's four ceilings (data, host, compute, memory), each measured "
         "with its interval, the binding one first, and the remedies in the order the numbers favour", (
             option("steps", "whole", "batches and steps measured per ceiling",
                    note="batches and steps measured per ceiling", low=10),
             option("seconds", "number", "longest time per ceiling", noun="a number of seconds",
                    note="longest time per ceiling", above=0)),
         label="Ceilings", figsize=(7, 2.6))
def ceilings(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None, steps: int = 30,
             seconds: float = 5.0, **parts) -> measured.Ceilings:
    """Measure the four ceilings of the current config (see nbtrain.measure.ceilings), in a trial: the live
    engine is never reached and the model is given back bit for bit."""
    return measured.ceilings(model, train_data, recipe=recipe, config=config, steps=steps, seconds=seconds, **parts)
