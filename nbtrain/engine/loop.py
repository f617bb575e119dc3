"""The training engine: one loop for every mode, on one live model.

    for each optimizer step:
        apply a requested config change (only here, between optimizer steps)
        for each of the k = accumulate_grad_batches micro-batches:
            batch = next(loader)                              # phase: data
            batch = to_device(batch, non_blocking=pinned)     # phase: h2d
            with no_sync unless last micro-batch, autocast:   # (null contexts when off; FSDP: a flag)
                loss = recipe.step_loss(model, batch) / k     # phase: forward
            scaler.scale(loss).backward()                     # phase: backward
        scaler.step(optimizer); scaler.update(); zero_grad     # phase: optimizer
        keep the loss on the device; every log_every_n_steps read the window back
        in one transfer and emit it to the MetricsLog

The engine keeps the model, optimizer, loader and precision for the current config
and, on a change, rebuilds only what the change touches. It knows nothing of Jupyter:
front-ends subscribe views to its MetricsLog. This module is the loop and the run; the parts
it is made of have modules of their own: engine_lr (rates, rule, warm-up, schedule),
engine_changes (live config changes), engine_state (state as data, trials), engine_validation
(epoch ends, held-out numbers) and engine_report (plan, device, compile costs).
"""
from __future__ import annotations

import contextlib
import functools
import os
import random
import threading
import time
import weakref

import torch
from torch.utils.data import IterableDataset

from . import checkpoint, data, dist, loggers, toggles
from ..config import ConfigError, Problem, TrainConfig, check_runnable
from .changes import TOGGLE_OPTIONS, LiveChanges
from .rates import LearningRates
from .report import RunReport
from .state import StateAPI
from .support import Clock, no_device_sync, plain, release_loader, seed_torch, stop_on_sigint
from .validation import Validation
from .evaluation import batch_size
from .memory import PeakMemory
from ..metrics import MetricsLog
from .monitor import Monitor, check_monitor
from .precision import Precision
from ..recipe import Recipe
from ..records import EndEvent, StartEvent, StartInfo
from ..runs.result import RunResult, summarize
from .split import device_map, input_device
from .stream import FixedLoader, StreamLoader


_NEVER = threading.Event()  # the stop event of a run whose caller gave none: never set

class Engine(LearningRates, LiveChanges, StateAPI, Validation, RunReport):
    def __init__(self, recipe: Recipe, config: TrainConfig | None = None, log: MetricsLog | None = None):
        self.recipe = recipe
        self.config = config or TrainConfig()
        check_runnable(self.config)  # the engine runs here: this machine is the target
        self.log = log or MetricsLog()
        self.world = dist.world()
        self.model = recipe.model
        self.step = 0            # optimizer steps taken on this model by this engine
        self.epoch = 0           # current epoch
        self.epoch_offset = 0    # this rank's samples already used in the current epoch
        self.samples = 0         # samples used, all ranks together
        self.seed = self.config.seed if self.config.seed is not None else random.randrange(2**31)
        self._pending: TrainConfig | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._caller_stop = _NEVER  # during a run: the event its caller may set to end it
        self._stop_reason = ""
        self.running = False
        self._rows: list[tuple] = []  # one tuple per optimizer step, columns as in _ROW
        # Profiling only: synchronise the device at each phase boundary so CUDA phase times are
        # honest. Off by default, so the hot loop never waits on the device (rule 5).
        self.sync_phases = False
        self._losses: list[torch.Tensor] = []
        self._clock = Clock()
        self._run_start = {"step": 0, "samples": 0, "epochs_done": 0}
        self._nonfinite: tuple[int, float] | None = None
        if self.config.seed is not None:
            seed_torch(self.config.seed)
        self.notes: dict[str, str] = {}  # option -> why it does not apply here
        self._eager_step_s: float | None = None
        self._compiled_fresh = False
        # A split model (split.py) stays where its parts are; batches go to its first part.
        self.device = input_device(self.model) or dist.device_for(self.config.device_type, self.world)
        if device_map(self.model) is None:
            self.model.to(self.device)
        self._train_model = self._wrap(self.model)
        self.precision = Precision(self.config.precision, self.device.type)
        self._held: data.Held | None = None  # the training data held for preload_data, kept across loaders
        # Live Snapshots (state.py) keep the held data a restore dropped, so a tool alternating a holding
        # config with one that does not hold reads the data set once, not once a block.
        self._snapshots = weakref.WeakSet()
        self.loader = self._build_loader()
        self.replace_optimizer()
        self._apply_toggles(TOGGLE_OPTIONS)

    # --- building the parts ----------------------------------------------------------

    def _build_loader(self):
        config = self.config
        if config.strategy == "dp":  # DataParallel splits each loaded batch across the devices
            config = config.replace(batch_size=config.batch_size * config.devices)
        spare = next((s.spare_held for s in list(self._snapshots) if s.spare_held is not None), None)
        self._held, note = data.hold(self.recipe.train_data, config, self.world, self.device, self.recipe.collate_fn,
                                     previous=self._held or spare, own_loader=self.recipe.fixed_loader)
        self._note("preload_data", note)
        if self._held is not None:  # the same batches in the same order, without the per-sample path
            return data.HeldBatches(self._held, config, self.world, self.seed)
        if self.recipe.fixed_loader is not None:
            return FixedLoader(self.recipe.fixed_loader, lambda text: self._note("data order", text))
        if isinstance(self.recipe.train_data, IterableDataset):
            return StreamLoader(self.recipe.train_data, config, self.world, self.seed, self.recipe.collate_fn)
        return data.build_loader(self.recipe.train_data, config, self.world, self.seed, self.recipe.collate_fn)

    @property
    def train_model(self):
        """The module the loop calls: the model, or its DDP / compiled wrapper."""
        return self._train_model

    @property
    def held_data(self) -> data.Held | None:
        """The training data held in memory for preload_data (what it costs, where), or None."""
        return self._held

    def rebuild_loader(self) -> None:
        """New training data: start its first epoch from the beginning."""
        self._held = None
        self.loader = self._build_loader()
        self.epoch_offset = 0

    def replace_optimizer(self) -> None:
        """A new optimizer from the recipe's factory (fresh state), at the configured rate, and its schedule."""
        self.optimizer = self.recipe.build_optimizer(self.model.parameters())
        self._use_optimizer_impl()
        self._optimizer_lrs = [group.get("initial_lr", group["lr"]) for group in self.optimizer.param_groups]
        self.replace_schedule(fresh=False)

    @property
    def stopping(self) -> bool:
        """A stop was asked for and the run has not reached its step boundary yet."""
        return self._stop.is_set() or self._caller_stop.is_set()

    def stop(self, reason: str = "stopped") -> None:
        """Stop at the next optimizer-step boundary (safe from any thread)."""
        self._stop_reason = reason
        self._stop.set()

    # --- the run -----------------------------------------------------------------------

    def run(self, log: MetricsLog | None = None, stop: threading.Event | None = None) -> RunResult:
        """Train for the config's budget (max_epochs / max_steps) from where the model is now.

        Each run records into a fresh MetricsLog (or `log`, where views already listen). `stop`, an
        event set from any thread, ends the run at the next optimizer step as stop() does (one set
        before the run starts ends it before its first step); the engine never sets it itself.
        """
        self.log = log if log is not None else MetricsLog()
        c = self.config
        self._check_batches(c)
        self._run_start = {"step": self.step, "samples": self.samples, "epochs_done": 0}
        resumed_from = None
        if c.resume:
            # Every run asked to resume does (a second crash and `resume='last'` continues again); the
            # request is then consumed, so trials and later runs on this engine do not rewind it.
            resumed_from = checkpoint.resolve(c)
            checkpoint.load(self, resumed_from)  # restores the interrupted run's start too
            self.config = c = c.replace(resume=None)
        # A run starts at a step boundary: gradients a crashed run left mid-accumulation must not
        # leak into its first step (a plain loop's zero_grad at the top says the same).
        for parameter in self.model.parameters():
            parameter.grad = None
        if self.recipe.fixed_loader is None and self.loader.sampler.per_epoch is None and c.max_steps is None:
            raise ConfigError([Problem("max_steps", None, "a whole number >= 1: the training data is an "
                                       "IterableDataset (a stream has no length, so no epoch count can budget it)")])
        check_monitor(c, self.recipe)
        self._monitor = Monitor(c.monitor, c.mode, c.patience, c.restore_best) if c.monitor else None
        self._logged = {}
        logger = loggers.attach(self.log, c) if c.logger != "none" and self.world.is_main else None
        self._stop.clear()
        self._caller_stop = stop if stop is not None else _NEVER
        self._stop_reason = ""
        self._nonfinite = None
        self.notes.pop("data order", None)  # this run's loader says it again where it applies
        self.running = True
        peak = PeakMemory(self.device)
        peak.start()
        # The budget counts from the run's start (a resumed run's: the interrupted one's); what this
        # call trains, and every figure of it, counts from where it begins training.
        start_step, from_step, from_samples = self._run_start["step"], self.step, self.samples
        self._clock = Clock()
        self.log.emit(StartEvent(type="start", config=plain(c.to_dict()),
                                 info=StartInfo(**self._info(), samples_start=self.samples, step_start=self.step,
                                                planned_steps=self._planned_steps() - (from_step - start_step),
                                                **({"resumed_from": str(resumed_from)} if resumed_from else {}))))
        status, message = "completed", ""
        try:
            with stop_on_sigint(self):
                while True:
                    c = self.config
                    if c.max_steps is not None and self.step - start_step >= c.max_steps:
                        break
                    if c.epochs_budget is not None and self._run_start["epochs_done"] >= c.epochs_budget:
                        break
                    if self.stopping:
                        status = self._stop_reason or "stopped"
                        break
                    steps_left = None if c.max_steps is None else c.max_steps - (self.step - start_step)
                    if self._train_some(steps_left):
                        self._run_start["epochs_done"] += 1
                        self._end_epoch()
        except KeyboardInterrupt:
            status = "interrupted"
        except BaseException as error:
            release_loader(error.__traceback__)
            raise
        finally:
            self.running = False
            self._caller_stop = _NEVER
            data.stop_workers(self.loader)
            self._flush()
        if status != "completed" and status != "early_stopped":
            message = f"stopped at step {self.step} (epoch {self.epoch}, {self.epoch_offset} samples into it)"
        if self._nonfinite is not None:
            bad_step, value = self._nonfinite
            status = "failed"
            message = (f"the loss became {value} at step {bad_step} ({c.precision}); training stopped at step "
                       f"{self.step}, where the losses were read back; lower the learning rate, check the data, "
                       f"or resume from a checkpoint written before step {bad_step}")
        if self.recipe.val_data is not None and self.epoch_offset and self._validates \
                and self._validated_at != self.step:
            self._validate(closing=True)  # a run ending mid-epoch still reports held-out numbers
        if self._monitor is not None and self._monitor.failure:
            status, message = "failed", self._monitor.failure
        if status == "early_stopped":  # a planned end, not a stop from outside
            status, message = "completed", self._monitor.stop_message(self.step)
        best = self._monitor.put_best_back(self.model) if self._monitor is not None and c.restore_best else None
        per_epoch = (self.loader.sampler.per_epoch or 0) * self.world.size
        epochs = (self.samples - from_samples) / per_epoch if per_epoch else self._run_start["epochs_done"]
        extra = {"epochs_trained": epochs, "status": status,
                 "peak_mem_mb": peak.peak() / 2**20, "mem_kind": peak.kind, "run_steps": self.step - from_step}
        extra.update(self._info())
        # preload_data left on auto and not applying is the engine's business, not this summary's (except
        # where the user's own sampler is why: that their order is kept is worth a line)
        quiet = {"preload_data"} if self.config.preload_data is None and self._held is None \
            and self.recipe.fixed_loader is None else set()
        extra["notes"] = [n for k, n in self.notes.items() if k not in quiet] + self._compile_accounting(extra) \
            + ([best] if best else []) + (self.schedule.notes if self.schedule is not None else []) \
            + ([f"resumed from {os.path.basename(resumed_from)}: this run trained steps {from_step + 1:,} to "
                f"{self.step:,} of the interrupted run's budget"] if resumed_from else []) \
            + ([logger.note] if logger is not None else [])
        if self._logged:
            extra["logged"] = dict(self._logged)
        if self.log.thinning:  # rows were dropped to bound memory: the count of steps is the log's, not its rows'
            extra["notes"].append(self.log.thinning)
            extra["steps"] = self.log.steps_seen
        summary = summarize(self.log, extra)
        self.log.emit(EndEvent(type="end", summary=plain(summary), status=status, message=message))
        if logger is not None:
            logger.close()
        return RunResult(self.config, self.log, summary, status, message)

    def _train_some(self, steps_left: int | None) -> bool:
        """Train from the current position until the epoch ends (True) or a stop, budget or change (False)."""
        c, recipe, precision = self.config, self.recipe, self.precision
        model, optimizer, scaler = self._train_model, self.optimizer, precision.scaler
        sampler = self.loader.sampler
        sampler.set_position(self.epoch, self.epoch_offset)
        if hasattr(self.model, "start_batches_at"):  # a LightningModule's batch_idx: the batch's index in its epoch
            self.model.start_batches_at(self.epoch_offset // c.batch_size)
        k, world = c.accumulate_grad_batches, self.world.size
        if sampler.per_epoch is None:  # a stream: as many batches as the budget needs, or until it ends
            sizes = None
            passes = getattr(self.loader, "batches_per_pass", None)  # the user's own DataLoader knows its length
            n = steps_left * k if passes is None else min(passes(), steps_left * k if steps_left else passes())
        else:
            sizes = data.batch_sizes(len(sampler), self.loader.batch_size, c.drop_last)
            n = len(sizes)
        if not n:
            return True
        # Everything the hot loop touches is a local: this loop must cost no more than a hand-written one.
        move = (self.device.type != "cpu" and not isinstance(self.loader, data.HeldBatches)) or c.channels_last
        perf, now = time.perf_counter, self._clock.now
        no_sync = getattr(model, "no_sync", None)
        # FSDP's no_sync: a flag that must hold through backward, set before every micro-step's forward.
        set_sync = getattr(model, "set_requires_gradient_sync", None) if k > 1 else None
        null = contextlib.nullcontext()
        clip, warm_until, log_every = c.gradient_clip_val, c.warmup_steps, c.log_every_n_steps
        step_schedule = self.schedule.step if self.schedule is not None and self.schedule.interval == "step" else None
        rows, losses, group = self._rows, self._losses, optimizer.param_groups[0]
        stop, caller_stop, step_loss = self._stop, self._caller_stop, recipe.step_loss
        val_every = c.val_every_n_steps if self.recipe.val_data is not None else None
        every = c.checkpoint_every  # an options.Interval: steps or seconds, read once by the config
        save_steps, save_seconds = (every.steps, every.seconds) if every else (0, 0.0)
        sync = functools.partial(torch.cuda.synchronize, self.device) \
            if self.sync_phases and self.device.type == "cuda" else no_device_sync
        iterator = iter(self.loader)
        micro = window = window_samples = 0
        data_s = h2d_s = forward_s = backward_s = 0.0
        loss_sum = None
        t_step = perf()
        for i in range(n):
            if micro == 0:
                window = min(k, n - i)
            t0 = perf()
            try:
                batch = next(iterator)
            except StopIteration:  # only a stream ends before its count: the pass is over
                self._end_stream_pass(micro)
                return True
            t1 = perf()
            if move:
                batch = self.prepare(batch)
            sync()
            t2 = perf()
            boundary = micro + 1 == window
            if set_sync is not None:
                set_sync(boundary)
            with (null if boundary or no_sync is None else no_sync()), precision.autocast():
                loss = step_loss(model, batch)
                if window > 1:
                    loss = loss / window
            sync()
            t3 = perf()
            scaler.scale(loss).backward()
            sync()
            t4 = perf()
            loss_sum = loss.detach() if micro == 0 else loss_sum + loss.detach()
            data_s += t1 - t0
            h2d_s += t2 - t1
            forward_s += t3 - t2
            backward_s += t4 - t3
            micro += 1
            window_samples += sizes[i] if sizes is not None else batch_size(batch)
            if not boundary:
                continue
            if clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            sync()
            t5 = perf()
            self.step += 1
            self.epoch_offset += window_samples
            self.samples += window_samples * world
            rows.append((self.step, self.epoch, self.samples, now(t5), group["lr"], t5 - t_step,
                         data_s, h2d_s, forward_s, backward_s, t5 - t4))
            losses.append(loss_sum)
            if len(losses) >= log_every:
                self._flush()
            if step_schedule is not None:
                step_schedule(optimizer)
            if self.step <= warm_until:
                self.set_lr(self.step)
            if (save_steps and self.step % save_steps == 0) or (save_seconds and t5 - self._saved_at >= save_seconds):
                self.save_checkpoint()
            if val_every and self.step % val_every == 0:
                self._validate_now()
            micro = window_samples = 0
            data_s = h2d_s = forward_s = backward_s = 0.0
            if steps_left is not None:
                steps_left -= 1
            if i + 1 < n and (steps_left == 0 or stop.is_set() or caller_stop.is_set()
                              or self._pending is not None):
                self._after_boundary()
                return False
            t_step = perf()
        self._after_boundary()
        return sizes is not None  # a stream's budget ending is not the end of its pass

    _saved_at = float("-inf")

    def save_checkpoint(self):
        """Write a checkpoint now (the run's folder, step-N.pt); returns its path."""
        self._saved_at = time.perf_counter()
        if not self.world.is_main:
            return None
        return checkpoint.save(self, checkpoint.folder(self.config))

    def prepare(self, batch):
        """A batch on the training device, in the model's memory format."""
        batch = data.to_device(batch, self.device, self.config.pin)
        return toggles.to_channels_last(batch) if self.config.channels_last else batch

    def _after_boundary(self) -> None:
        if self._pending is not None:
            self._flush()
            self._apply_pending()
