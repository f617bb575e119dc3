"""The checklist walk's measurement seam: what the walk asks of the machine it walks on, as a Protocol.

The walk (walker.py) measures through a `Bench`: `block(config, seconds, current)` trains one race block
and puts the state back; `trial(config, seconds, current)` one whole trial; `bottleneck(config, seconds)`
reads the four ceilings (tools/ceilings.py) at a config and returns their verdict
(measure/bottleneck.py); `apart(label, config, steps)` runs a config in processes of its own (DDP);
`here` (a `Here`) answers what the items need to know (samples, cores, CUDA, held data, the optimizer's
kernels, convolutions, whether DDP can run). `EngineBench` is a trial on the live model; a simulated machine
(tests/simulated_machine.py) is another Bench, so the walk's logic is tested without a GPU.
"""
from __future__ import annotations

import contextlib
import math
from typing import Protocol

from ..config import TrainConfig
from ..measure.bottleneck import Bottleneck
from ..measure.race import Block
from ..measure.steady import NOTHING, block_rates, columns_series
from ..records import samples_start
from ..tools import trial
from ..tools.ab import diverged_refusal, trial_rate
from ..tools.ceilings import measure_ceilings
from ..tools.trial import is_oom
from ..tools.tune import memory_limit
from .items import Tried, cannot_run_ddp_here
from ..measure.learned import Learned
from ..measure.noise_scale import NoiseScale
from ..tools.gradient_noise import read_noise_scale
from ..tools.equal_time import EqualTimeScorer

_WARM_UP_STEPS = 3  # uncounted steps before a config's first block in a race: its workers' first batches arrive


class Here(Protocol):
    """What the items ask of the machine the walk walks on."""
    samples: int       # training samples per rank
    cores: int         # CPU cores the DataLoader's workers may use
    threads: int       # torch's intra-op threads a run at num_threads=None trains at
    cuda: bool         # a GPU is there
    has_conv2d: bool   # the model has 2-D convolutions (channels_last acts on them)

    def holding(self, current: TrainConfig) -> tuple[bool, str | None, str]:
        """(held now, what holding costs in words or None where the data cannot be held, why not)."""

    def optimizer_refusal(self, impl: str) -> str:
        """Why the optimizer cannot step on `impl` kernels ('' where it can)."""

    def ddp_refusal(self, config: TrainConfig) -> str:
        """Why this machine cannot run DDP config `config` ('' where it can)."""


class Bench(Protocol):
    """What the walk measures through (walker.run_walk): the live engine's trial, or a simulated machine. Every
    measurement leaves the bench where the walk started it; `current` is the config the walk has kept so far,
    beside which a candidate is measured (its loss diverging ends the walk, a candidate's is a row)."""
    here: Here
    start: TrainConfig   # the config the walk starts from
    device: str          # where it measures, in words

    def block(self, config: TrainConfig, seconds: float, current: TrainConfig | None = None) -> Block:
        """One race block of `config`, about `seconds` long."""

    def trial(self, config: TrainConfig, seconds: float, current: TrainConfig | None = None) -> Tried:
        """One whole trial of `config` (DDP's comparison)."""

    def bottleneck(self, config: TrainConfig, seconds: float) -> Bottleneck:
        """The ceilings' verdict at `config`, each ceiling read for about `seconds`."""

    def noise_scale(self, config: TrainConfig, seconds: float) -> NoiseScale:
        """The gradient noise scale of the model at `config`'s batch, read for about `seconds`."""

    def quality(self, config: TrainConfig, seconds: float, current: TrainConfig | None = None) -> Learned:
        """`config` trained `seconds` of wall time from the walk's starting weights, on the same data in the same
        order as every other config, scored on held-out data (walk/quality.py)."""

    def apart(self, label: str, config: TrainConfig, steps: int) -> Tried:
        """`config` run in processes of its own (DDP), `steps` steps."""

    def race_over(self, keep=()) -> None:
        """A race is over: only the configs in `keep` stay warm."""

    def checked_lr(self, config: TrainConfig) -> tuple[TrainConfig, list]:
        """(config, notes): a scaled learning rate that diverges lowered before the walk hands it over."""

    def schedule_note(self) -> str:
        """What keeping a config with a new learning rate does to the live schedule, in words."""

    def schedule_stepping(self) -> tuple:
        """(how often the live schedule is stepped: 'step', 'epoch' or None where there is none, which in words)."""

    def restore(self, config: TrainConfig | None = None) -> None:
        """The walk is over: the bench back where it started; `config` the one the walk keeps (keep_best)."""


class EngineFacts:
    """What the items ask of the live engine (a Here)."""

    def __init__(self, engine):
        import torch
        from ..engine.toggles import has_conv2d
        from ..hardware import usable_cores
        self.engine = engine
        self.samples = len(engine.recipe.train_data) // engine.world.size
        self.cuda = torch.cuda.is_available()
        self.cores = usable_cores()
        self.threads = torch.get_num_threads()  # what a run at num_threads=None trains at (torch's own count)
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
    """The walk's measurements on a trial's engine (a Bench) (trial.borrow: the live engine is never reached); every one
    puts the trial's engine back where the walk started it. A kept config goes to the live model through
    `trial.keep`, the call a user's change goes through."""

    def __init__(self, lent, memory_budget=None):
        self.lent = lent
        self.engine = engine = lent.engine
        self.here = EngineFacts(engine)
        self.start = trial.plain_config(engine.config)  # the user's own config: its errors are theirs
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
        self._scorer = None  # races of what is learned (quality)

    def _over_memory(self, m) -> str:
        if self.limit is not None and m.config.device_type == "cpu" and m.peak_bytes > self.limit:
            return f"over the memory budget (peak {m.peak_bytes / 2**20:,.0f} MB)"
        return ""

    def _trial(self, config, seconds: float, current=None):
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
        if m.diverged and config == (current or self.start):  # a candidate that diverges leaves the race; the current
            # config diverging leaves nothing to measure candidates against
            raise diverged_refusal("the current config", m.error)
        return m, steady, parts, m.error or self._over_memory(m)

    def block(self, config, seconds: float, current=None) -> Block:
        if self._kept is None:
            self._kept = self._keeping.enter_context(self.engine.keeping_workers())
        if config not in self.warm:
            self.warm.add(config)
            self._warm_up(config)
        m, steady, parts, note = self._trial(config, seconds, current)
        rate = float("nan") if m is None else steady.rate if math.isfinite(steady.rate) else m.samples_per_s
        if note:  # a config that did not fit leaves memory behind that the next block would be charged with
            trial.release_memory()
        return Block(rate, parts, note)

    def trial(self, config, seconds: float, current=None) -> Tried:
        m, steady, blocks, note = self._trial(config, seconds, current)
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

    def noise_scale(self, config, seconds: float) -> NoiseScale:
        """The gradient noise scale at `config`'s batch (tools/gradient_noise.py), in the trial, put back after."""
        try:
            self.engine.reconfigure(config)
            return read_noise_scale(self.engine, seconds=seconds)
        finally:
            self.lent.reset()

    def quality(self, config, seconds: float, current=None) -> Learned:
        """`config` trained `seconds` from the trial's starting weights, scored on held-out data (tools/equal_time.py)."""
        if self._scorer is None:
            self._scorer = EqualTimeScorer(self.lent)
        return self._scorer.quality(config, seconds, current)

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
        """(config, notes): a scaled learning rate that diverges is lowered before the walk hands it over. A config
        of another world size runs its check the way it ran its measurement: in processes of its own (the
        engine here cannot change devices inside the running process)."""
        from ..tools.tune import checked_lr
        apart = config.world_size != self.engine.world.size
        return checked_lr(self.engine, config, diverges=self._diverges_apart if apart else None)

    def _diverges_apart(self, engine, config, steps: int = 30) -> str | None:
        """tune._diverges for DDP: `steps` steps of `config` in processes of their own, every loss read."""
        from ..tools.tune import worse
        try:
            result = trial.run_apart(self.lent, config.replace(log_every_n_steps=1), steps)
        finally:
            self.lent.reset()
        if result.status != "completed":
            raise RuntimeError(f"the ranks' check ended {result.status}")
        return worse(list(result.log.columns["loss"]))

    def schedule_stepping(self) -> tuple:
        s = self.engine.schedule
        return (None, "") if s is None or s.on_plateau else (s.interval, s.stepping())

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
