"""The checklist walk's measurement seam: what the walk asks of the machine it walks on.

The walk (checklist.py) measures through a bench: `block(config, seconds)` trains one race block
and puts the state back; `trial(config, seconds)` one whole trial; `bottleneck(config, seconds)`
reads the four ceilings (tools/ceilings.py) at a config and returns their verdict
(measure/bottleneck.py); `apart(label, config, steps)` runs a config in processes of its own (DDP);
`here` answers what the items need to know (samples, cores, CUDA, held data, the optimizer's
kernels, convolutions, whether DDP can run). `EngineBench` is a trial on the live model; a simulated machine
(measure/simulated.py) has the same face, so the walk's logic is tested without a GPU.
"""
from __future__ import annotations

import contextlib
import math

from .ab import diverged_refusal, trial_rate
from .ceilings import measure_ceilings
from ..measure.race import Block
from ..measure.steady import NOTHING, block_rates, columns_series
from ..records import samples_start
from . import trial
from .checklist_items import Tried, cannot_run_ddp_here
from .tune import is_oom, memory_limit

_WARM_UP_STEPS = 3  # uncounted steps before a config's first block in a race: its workers' first batches arrive


class EngineFacts:
    """What the items ask of the live engine."""

    def __init__(self, engine):
        import torch
        from ..engine.toggles import has_conv2d
        from .diagnose import usable_cores
        self.engine = engine
        self.samples = len(engine.recipe.train_data) // engine.world.size
        self.cuda = torch.cuda.is_available()
        self.cores = usable_cores()
        self.has_conv2d = has_conv2d(engine.model)

    def holding(self, current):
        """(held now, what holding costs in words or None where the data cannot be held, why not)."""
        from ..engine.data import hold, size_text
        engine, recipe = self.engine, self.engine.recipe
        held, _ = hold(recipe.train_data, current, engine.world, engine.device, recipe.collate_fn,
                       previous=engine.held_data, own_loader=recipe.fixed_loader)
        on, why = held is not None, ""
        if not on:
            candidate = current.replace(preload_data=True, num_workers=0, persistent_workers=False, prefetch_factor=None)
            held, why = hold(recipe.train_data, candidate, engine.world, engine.device, recipe.collate_fn,
                             own_loader=recipe.fixed_loader)
            if held is None:
                return False, None, why
        cost = f"{size_text(held.copied)} held on {held.device}" if held.copied else \
            "no copy: the TensorDataset's own tensors"
        return on, cost, why

    def optimizer_refusal(self, impl: str) -> str:
        from ..engine.toggles import with_implementation
        return with_implementation(self.engine.optimizer, impl)[1]

    def ddp_refusal(self, config) -> str:
        return cannot_run_ddp_here(config)


class EngineBench:
    """The walk's measurements on a trial's engine (trial.borrow: the live engine is never reached); every one
    puts the trial's engine back where the walk started it. A kept config goes to the live model through
    `trial.keep`, the call a user's change goes through."""

    def __init__(self, lent, memory_budget=None):
        self.lent = lent
        self.engine = engine = lent.engine
        self.here = EngineFacts(engine)
        self.start = trial.plain_config(engine.config)  # the user's own config: its errors are theirs
        self.current = self.start
        self.device = str(engine.device)
        self.device_rates: dict = {}  # the device's peaks and bandwidth, measured at the first reading only
        self.limit, _ = memory_limit(memory_budget, engine.device) if engine.device.type == "cpu" else (None, "")
        # A race's DataLoader workers stay up between its blocks (Engine.keeping_workers), and each config is
        # warmed up once before its first counted block: worker start-up, allocator growth and first calls
        # fall outside every block. Between races only the loaders of the configs the walk goes on with stay.
        self._keeping = contextlib.ExitStack()
        self._kept = None
        self.warm: set = set()
        self.kept = None  # the config the walk keeps (keep_best), for the live model

    def _over_memory(self, m) -> str:
        if self.limit is not None and m.config.device_type == "cpu" and m.peak_bytes > self.limit:
            return f"over the memory budget (peak {m.peak_bytes / 2**20:,.0f} MB)"
        return ""

    def _trial(self, config, seconds: float):
        """(measurement or None, steady rate, block rates, why it failed) of `config` trained for `seconds`
        on the trial's engine, which is put back where the walk started it; out of memory, a candidate whose
        loss diverged, or any error of a config the walk chose, is a result ("failed: ..."); only the user's own
        starting config raises (and the current config diverging: nothing could be compared with it)."""
        try:
            m, steady, parts = trial_rate(self.engine, config, seconds=seconds)
        except Exception as error:  # noqa: BLE001 - see the docstring
            if is_oom(error):
                return None, NOTHING, [], "out of memory"
            if config == self.start:
                raise
            return None, NOTHING, [], trial.failed(error)
        finally:
            self.lent.reset()
        if m.diverged and config == self.current:  # a candidate that diverges leaves the race; the current
            # config diverging leaves nothing to measure candidates against
            raise diverged_refusal("the current config", m.error)
        return m, steady, parts, m.error or self._over_memory(m)

    def block(self, config, seconds: float) -> Block:
        if self._kept is None:
            self._kept = self._keeping.enter_context(self.engine.keeping_workers())
        if config not in self.warm:
            self.warm.add(config)
            self._warm_up(config)
        m, steady, parts, note = self._trial(config, seconds)
        rate = float("nan") if m is None else steady.rate if math.isfinite(steady.rate) else m.samples_per_s
        if note:  # a config that did not fit leaves memory behind that the next block would be charged with
            trial.release_memory()
        return Block(rate, parts, note)

    def trial(self, config, seconds: float) -> Tried:
        m, steady, blocks, note = self._trial(config, seconds)
        trial.release_memory()
        ok = not note and math.isfinite(steady.rate)
        return Tried("", config, steady.rate if ok else None, note, steady if ok else NOTHING, blocks)

    def _warm_up(self, config) -> None:
        """A few uncounted steps of `config`: its workers start (and stay, see block), first calls happen. A
        config that cannot run fails again in its counted block, which says why."""
        try:
            trial.measure(self.engine, config, steps=_WARM_UP_STEPS)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception:  # noqa: BLE001 - see the docstring
            pass
        finally:
            self.lent.reset()

    def race_over(self, keep=()) -> None:
        """The race is over: only the loaders of the configs in `keep` (the current one, the leader) keep their
        workers, and only those stay warm."""
        if self._kept is not None:
            self._kept.keep_only({self.engine.loader_key(c) for c in keep})
        self.warm &= set(keep)
        trial.release_memory()

    def bottleneck(self, config, seconds: float):
        """The ceilings' verdict at `config` (measure/bottleneck.py), each ceiling read for about `seconds`."""
        try:
            self.engine.reconfigure(config)
            return measure_ceilings(self.engine, steps=10, seconds=seconds, known=self.device_rates).bottleneck()
        finally:
            self.lent.reset()

    def apart(self, label: str, config, steps: int) -> Tried:
        """`config` run by fit in processes of its own (DDP), `steps` steps."""
        try:
            result = trial.run_apart(self.lent, config, steps)
        except Exception as error:  # noqa: BLE001 - a candidate the walk chose is a row, never the walk's end
            return Tried(label, config, None, trial.failed(error))
        finally:
            self.lent.reset()
        if result.status != "completed":
            return Tried(label, config, None, result.status)
        series = columns_series(result.log.columns, samples_start(result.log))
        steady = result.steady()
        return Tried(label, config, steady.rate, steady=steady, blocks=block_rates(*series), apart=True)

    def checked_lr(self, config):
        """(config, notes): a scaled learning rate that diverges is lowered before the walk hands it over."""
        from .tune import checked_lr
        return checked_lr(self.engine, config)

    def schedule_note(self) -> str:
        s = self.engine.schedule  # the trial's copy of the live schedule (the same scheduler class)
        return "" if s is None else f"; the live {type(s.scheduler).__name__}'s rates rescaled by the same factor"

    def restore(self, config=None) -> None:
        """The walk is over (or an item failed): every worker it kept is stopped and the trial's engine is back
        where the walk started it; `config`, the walk's kept config, is left on the live model once the walk
        gives the model back (checklist: trial.keep)."""
        self._keeping.close()
        self._kept, self.warm = None, set()
        self.lent.reset()
        if config is not None:
            self.kept = config
