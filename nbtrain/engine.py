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
front-ends subscribe views to its MetricsLog.
"""
from __future__ import annotations

import contextlib
import functools
import math
import random
import signal
import statistics
import threading
import time

import torch
from torch.utils.data import IterableDataset

from . import checkpoint, data, dist, engine_state, evaluation, fsdp, loggers, toggles
from .split import device_map, input_device
from .config import ConfigError, Problem, TrainConfig, check_runnable
from .memory import PeakMemory
from .metrics import MetricsLog
from .precision import Precision
from .recipe import FIXED_OPTIONS, Recipe, fixed_reason
from .monitor import Monitor
from .schedule import Schedule
from .evaluation import batch_size
from .stream import FixedLoader, StreamLoader
from .result import RunResult, summarize

# Which parts of the live session each option touches.
_LOADER_OPTIONS = {"batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
                   "shuffle", "drop_last", "accelerator", "preload_data"}
_LR_OPTIONS = {"lr", "scale_lr", "base_batch_size", "batch_size", "accumulate_grad_batches", "devices", "num_nodes"}
_OUT_OF_PROCESS = {"devices", "num_nodes", "strategy"}
_TOGGLE_OPTIONS = {"compile", "channels_last", "matmul_precision", "cudnn_benchmark", "optimizer_impl",
                   "activation_checkpointing", "accelerator"}


class Engine:
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
        self._stop_reason = ""
        self.running = False
        self._rows: list[tuple] = []  # one tuple per optimizer step, columns as in _ROW
        # Profiling only: synchronise the device at each phase boundary so CUDA phase times are
        # honest. Off by default, so the hot loop never waits on the device (rule 5).
        self.sync_phases = False
        self._losses: list[torch.Tensor] = []
        self._clock = _Clock()
        self._run_start = {"step": 0, "samples": 0, "epochs_done": 0}
        self._nonfinite: tuple[int, float] | None = None
        if self.config.seed is not None:
            torch.manual_seed(self.config.seed)
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
        self.loader = self._build_loader()
        self.replace_optimizer()
        self._apply_toggles(_TOGGLE_OPTIONS)

    # --- building the parts ----------------------------------------------------------

    def _wrap(self, model):
        if self.config.strategy == "fsdp" and self.world.distributed and torch.distributed.is_initialized():
            fsdp.shard(model, self.device.type, self.world.size)  # FSDP reduces gradients itself: no DDP
            return model
        if self.world.distributed and torch.distributed.is_initialized():
            one_device = self.device.type == "cuda" and device_map(model) is None
            return torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if one_device else None,
                find_unused_parameters=self.config.find_unused_parameters)
        if self.config.strategy == "dp" and self.device.type == "cuda":
            return torch.nn.DataParallel(model, device_ids=list(range(self.config.devices)))
        return model

    def _build_loader(self):
        config = self.config
        if config.strategy == "dp":  # DataParallel splits each loaded batch across the devices
            config = config.replace(batch_size=config.batch_size * config.devices)
        self._held, note = data.hold(self.recipe.train_data, config, self.world, self.device, self.recipe.collate_fn,
                                     previous=self._held)
        self._note("preload_data", note)
        if self._held is not None:  # the same batches in the same order, without the per-sample path
            return data.HeldBatches(self._held, config, self.world, self.seed)
        if self.recipe.fixed_loader is not None:
            return FixedLoader(self.recipe.fixed_loader)
        if isinstance(self.recipe.train_data, IterableDataset):
            return StreamLoader(self.recipe.train_data, config, self.world, self.seed, self.recipe.collate_fn)
        return data.build_loader(self.recipe.train_data, config, self.world, self.seed, self.recipe.collate_fn)

    @property
    def train_model(self):
        """The module the loop calls: the model, or its DDP / compiled wrapper."""
        return self._train_model

    @property
    def base_lrs(self) -> list[float]:
        """Each param group's own rate before the LR rule and warm-up (the optimizer's, as given)."""
        return list(self._optimizer_lrs)

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
        self.schedule = None
        for group, lr in zip(self.optimizer.param_groups, self._target_lrs()):
            group["lr"] = lr  # the scheduler is built over the scaled rates, the warm-up is laid on after
        self.schedule = Schedule.build(self.recipe, self.optimizer)
        if self.schedule is not None:  # an instance built before: its curve scaled to the rule's rates
            base = getattr(self.schedule.scheduler, "base_lrs", self.schedule.lrs())
            self.schedule.rescale([t / b if b else 1.0 for t, b in zip(self._target_lrs(), base)], "LR rule")
        self.set_lr(self.step)

    def _use_optimizer_impl(self) -> None:
        self.optimizer, note = toggles.with_implementation(self.optimizer, self.config.optimizer_impl)
        self._note("optimizer_impl", note)

    def _note(self, option: str, note: str | None) -> None:
        if note:
            self.notes[option] = note
        else:
            self.notes.pop(option, None)

    def _apply_toggles(self, names: set) -> None:
        """Apply the speed toggles among `names`; record why any does not apply here."""
        c = self.config
        if "channels_last" in names:
            self._note("channels_last", toggles.set_memory_format(self.model, c.channels_last))
        if "optimizer_impl" in names:
            self._use_optimizer_impl()
        if "activation_checkpointing" in names:
            toggles.set_activation_checkpointing(self.model, c.activation_checkpointing)
        if {"matmul_precision", "cudnn_benchmark", "accelerator"} & names:
            self.notes.pop("matmul_precision", None)
            self.notes.pop("cudnn_benchmark", None)
            for note in toggles.matmul_settings(c.matmul_precision, c.cudnn_benchmark, self.device.type):
                self.notes[note.split("=")[0]] = note
        if {"compile", "accelerator", "activation_checkpointing"} & names:
            wrapped = self._wrap(self.model)
            self._train_model = wrapped if c.compile == "none" else torch.compile(wrapped, mode=c.compile)
            self._compiled_fresh = c.compile != "none"

    def _target_lrs(self, config: TrainConfig | None = None) -> list[float]:
        config = config or self.config
        factor = config.lr_factor()
        if config.lr is not None:
            # `lr` replaces the optimizer's default rate; groups with rates of their own keep their
            # ratio to it (a group at lr=0, frozen by the user, stays frozen).
            default = self.optimizer.defaults.get("lr") or 0.0
            return [config.lr * factor * (lr / default if default else 1.0) for lr in self._optimizer_lrs]
        return [lr * factor for lr in self._optimizer_lrs]

    def set_lr(self, step: int) -> None:
        targets = self.schedule.lrs() if self.schedule is not None else self._target_lrs()
        warm = self.config.warmup_steps
        ramp = min(1.0, (step + 1) / warm) if warm else 1.0
        for group, lr in zip(self.optimizer.param_groups, targets):
            group["lr"] = lr * ramp

    def lr_note(self, config: TrainConfig | None = None) -> str:
        """The learning rate this run uses (or `config` would use), and why."""
        c = config or self.config
        lr = self._target_lrs(c)[0]
        base = c.lr if c.lr is not None else self._optimizer_lrs[0]
        note = f"{lr:.4g}"
        if c.scale_lr != "none":
            note += f" ({c.scale_lr} rule: base {base:.4g} x {c.lr_factor():.4g} for global batch " \
                    f"{c.global_batch_size} vs {c.base_batch_size})"
        if c.warmup_steps:
            note += f", linear warm-up over {c.warmup_steps} steps"
        if self.schedule is not None:
            note += ", " + self.schedule.describe()
        return note

    # --- changes between steps -------------------------------------------------------

    def request(self, **changes) -> TrainConfig:
        """Ask for a config change; it is validated now and applied at the next optimizer step."""
        new = (self._pending or self.config).replace(**changes)
        check_runnable(new)
        self._check_batches(new)
        out_of_process = set(new.changed_from(self.config)) & _OUT_OF_PROCESS
        if out_of_process:
            raise ValueError(f"{', '.join(sorted(out_of_process))} cannot change inside a running process; "
                             "start a new run with them instead")
        with self._lock:
            self._pending = new
        if not self.running:
            self._apply_pending()
        return new

    def reconfigure(self, config: TrainConfig) -> None:
        """Switch to `config` (between runs, or at the next step boundary of a run)."""
        self.request(**{name: new for name, (_, new) in config.changed_from(self.config).items()})

    def _apply_pending(self) -> None:
        with self._lock:
            new, self._pending = self._pending, None
        if new is None:
            return
        changes = new.changed_from(self.config)
        if not changes:
            return
        previous, self.config = self.config, new
        names = set(changes)
        if new.device_type != self.device.type and device_map(self.model) is None:
            self.device = dist.device_for(new.device_type, self.world)
            self.model.to(self.device)
            # Optimizer state (momentum, Adam moments) follows its parameters to the new device.
            self.optimizer.load_state_dict(self.optimizer.state_dict())
            self._train_model = self._wrap(self.model)
        if _TOGGLE_OPTIONS & names:
            self._apply_toggles(names)
        if {"precision", "accelerator"} & names:
            self.precision = Precision(new.precision, self.device.type)
        if _LOADER_OPTIONS & names:
            self.loader = self._build_loader()
        if _LR_OPTIONS & names or "warmup_steps" in names:
            if self.schedule is not None:  # the rule rescales the user's schedule, and the summary says so
                old = self._target_lrs(previous)
                self.schedule.rescale([n / o if o else 1.0 for n, o in zip(self._target_lrs(), old)],
                                      f"step {self.step}: global batch {previous.global_batch_size} -> "
                                      f"{new.global_batch_size}, {new.scale_lr} rule")
            self.set_lr(self.step)
        if self.running:  # between runs the next run's start event states the config
            self.log.emit({"type": "change", "step": self.step,
                           "changes": {k: [_plain(a), _plain(b)] for k, (a, b) in changes.items()}})

    def _check_batches(self, config: TrainConfig) -> None:
        """Refuse a config whose epoch holds no batch (it would loop over empty epochs forever), and a
        batching change on a DataLoader whose own sampler decides the batches."""
        fixed = self.recipe.fixed_loader
        if fixed is not None:
            changed = [o for o in FIXED_OPTIONS if getattr(config, o) != getattr(self.config, o)]
            if changed:
                raise ConfigError([Problem(o, getattr(config, o), fixed_reason(fixed)) for o in changed])
            return
        per_rank = self.loader.sampler.per_epoch
        if per_rank is None:  # a stream: its length is known only when it ends
            return
        batch = config.batch_size * (config.devices if config.strategy == "dp" else 1)
        if config.drop_last and per_rank < batch:
            shown = f"{per_rank} samples per rank" if self.world.size > 1 else f"{per_rank} samples"
            raise ConfigError([Problem("batch_size", config.batch_size,
                                       f"with drop_last=True an epoch of {shown} holds no full batch; allowed: "
                                       f"batch_size <= {per_rank}, or drop_last=False")])

    def state_dict(self) -> dict:
        """Everything needed to continue training exactly (see engine_state.py); what checkpoints write."""
        return engine_state.capture(self)

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`, all or nothing (engine_state.StateMismatch when it does not fit)."""
        engine_state.restore(self, state)

    @contextlib.contextmanager
    def trial(self):
        """Train inside the block, then put everything back bit for bit: weights, gradients, optimizer,
        schedule, scaler, every RNG, the position and the config (what every checklist tool measures in)."""
        snapshot = engine_state.Snapshot(self)
        try:
            yield self
        finally:
            snapshot.restore()

    def position(self) -> dict:
        """Where training stands, for checkpoints: enough to continue exactly."""
        return {"step": self.step, "epoch": self.epoch, "epoch_offset": self.epoch_offset, "samples": self.samples,
                "seed": self.seed, "run_start": dict(self._run_start)}

    def set_position(self, position: dict) -> None:
        self.step, self.epoch = position["step"], position["epoch"]
        self.epoch_offset, self.samples = position["epoch_offset"], position["samples"]
        self._run_start = dict(position["run_start"])
        if position["seed"] != self.seed:  # the data order is the seed's: a loader of the other seed
            self.seed = position["seed"]
            self.loader = self._build_loader()

    def stop(self, reason: str = "stopped") -> None:
        """Stop at the next optimizer-step boundary (safe from any thread)."""
        self._stop_reason = reason
        self._stop.set()

    # --- the run -----------------------------------------------------------------------

    def run(self, log: MetricsLog | None = None) -> RunResult:
        """Train for the config's budget (max_epochs / max_steps) from where the model is now.

        Each run records into a fresh MetricsLog (or `log`, where views already listen).
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
        if c.monitor is not None and self.recipe.val_data is None:
            raise ConfigError([Problem("monitor", c.monitor, "needs held-out data: give val_data")])
        self._monitor = Monitor(c.monitor, c.mode, c.patience, c.restore_best) if c.monitor else None
        self._logged = {}
        logger = loggers.attach(self.log, c) if c.logger != "none" and self.world.is_main else None
        self._stop.clear()
        self._stop_reason = ""
        self._nonfinite = None
        self.running = True
        peak = PeakMemory(self.device)
        peak.start()
        start_step, start_samples = self._run_start["step"], self._run_start["samples"]
        self._clock = _Clock()
        self.log.emit({"type": "start", "config": _plain(c.to_dict()),
                       "info": {**self._info(), "samples_start": self.samples, "step_start": self.step,
                                "planned_steps": self._planned_steps(),
                                **({"resumed_from": str(resumed_from)} if resumed_from else {})}})
        status, message = "completed", ""
        try:
            with self._stop_on_sigint():
                while True:
                    c = self.config
                    if c.max_steps is not None and self.step - start_step >= c.max_steps:
                        break
                    if c.epochs_budget is not None and self._run_start["epochs_done"] >= c.epochs_budget:
                        break
                    if self._stop.is_set():
                        status = self._stop_reason or "stopped"
                        break
                    steps_left = None if c.max_steps is None else c.max_steps - (self.step - start_step)
                    if self._train_some(steps_left):
                        self._run_start["epochs_done"] += 1
                        self._end_epoch()
        except KeyboardInterrupt:
            status = "interrupted"
        except BaseException as error:
            _release_loader(error.__traceback__)
            raise
        finally:
            self.running = False
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
            self._validate()  # a run ending mid-epoch still reports held-out numbers
        if status == "early_stopped":  # a planned end, not a stop from outside
            status, message = "completed", self._monitor.stop_message(self.step)
        best = self._monitor.put_best_back(self.model) if self._monitor is not None and c.restore_best else None
        per_epoch = (self.loader.sampler.per_epoch or 0) * self.world.size
        epochs = (self.samples - start_samples) / per_epoch if per_epoch else self._run_start["epochs_done"]
        extra = {"epochs_trained": epochs, "status": status,
                 "peak_mem_mb": peak.peak() / 2**20, "mem_kind": peak.kind, "run_steps": self.step - start_step}
        extra.update(self._info())
        extra["notes"] = list(self.notes.values()) + self._compile_accounting(extra) + ([best] if best else []) \
            + (self.schedule.notes if self.schedule is not None else [])
        if self._logged:
            extra["logged"] = dict(self._logged)
        if self.log.thinning:  # rows were dropped to bound memory: the count of steps is the log's, not its rows'
            extra["notes"].append(self.log.thinning)
            extra["steps"] = self.log.steps_seen
        summary = summarize(self.log, extra)
        self.log.emit({"type": "end", "summary": _plain(summary), "status": status, "message": message})
        if logger is not None:
            logger.close()
        return RunResult(self.config, self.log, summary, status, message)

    def _compile_accounting(self, extra: dict) -> list[str]:
        """Compile time apart from step time, and the step count at which compiling pays off."""
        steps = self.log.columns["step_s"]
        if len(steps) < 3:
            return []
        steady = statistics.median(steps[1:])
        if self.config.compile == "none":
            self._eager_step_s = steady
            return []
        if not self._compiled_fresh:
            return []
        self._compiled_fresh = False
        # Everything above the steady step time is compilation (the first step, and any recompiles).
        cost = sum(steps) - steady * len(steps)
        extra["compile_s"] = cost
        note = f"compile cost {cost:.1f} s; compiled step {1000 * steady:.2f} ms"
        if self._eager_step_s is None:
            return [note + "; run once without compile on this model to see when it pays off"]
        gain = self._eager_step_s - steady
        if gain <= 0:
            return [note + f" vs {1000 * self._eager_step_s:.2f} ms eager: no speed-up at this size, it never pays off"]
        return [note + f" vs {1000 * self._eager_step_s:.2f} ms eager ({self._eager_step_s / steady:.2f}x): "
                f"pays off after ~{math.ceil(cost / gain):,} steps"]

    def _planned_steps(self) -> int:
        c = self.config
        if self.loader.sampler.per_epoch is None:
            passes = getattr(self.loader, "batches_per_pass", None)
            by_epochs = math.ceil(passes() / c.accumulate_grad_batches) * c.epochs_budget \
                if passes is not None and c.epochs_budget is not None else None
            return min(x for x in (by_epochs, c.max_steps) if x is not None)
        per_epoch = math.ceil(len(data.batch_sizes(self.loader.sampler.per_epoch, self.loader.batch_size, c.drop_last))
                              / c.accumulate_grad_batches)
        by_epochs = per_epoch * c.epochs_budget if c.epochs_budget is not None else None
        return min(x for x in (by_epochs, c.max_steps) if x is not None)

    def _info(self) -> dict:
        c = self.config
        return {"device": str(self.device), "strategy": self._strategy(), "world_size": self.world.size,
                "global_batch": c.global_batch_size,
                "lr": self._target_lrs()[0], "lr_note": self.lr_note(), "precision": c.precision,
                "scaler": self.precision.scaler.is_enabled(), "pin_memory": c.pin, "seed": self.seed}

    def _strategy(self) -> str:
        if fsdp.is_sharded(self.model):
            return "fsdp"
        if self.config.strategy == "dp" and self.device.type == "cuda":
            return "dp"
        return "ddp" if self.world.distributed else "single process"

    def _train_some(self, steps_left: int | None) -> bool:
        """Train from the current position until the epoch ends (True) or a stop, budget or change (False)."""
        c, recipe, precision = self.config, self.recipe, self.precision
        model, optimizer, scaler = self._train_model, self.optimizer, precision.scaler
        sampler = self.loader.sampler
        sampler.set_position(self.epoch, self.epoch_offset)
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
        stop, step_loss = self._stop, recipe.step_loss
        val_every = c.val_every_n_steps if self.recipe.val_data is not None else None
        every = c.checkpoint_every
        save_steps = int(every) if every and not every.endswith("s") else 0
        save_seconds = float(every[:-1]) if every and every.endswith("s") else 0.0
        sync = functools.partial(torch.cuda.synchronize, self.device) \
            if self.sync_phases and self.device.type == "cuda" else _no_sync
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
            if i + 1 < n and (steps_left == 0 or stop.is_set() or self._pending is not None):
                self._after_boundary()
                return False
            t_step = perf()
        self._after_boundary()
        return sizes is not None  # a stream's budget ending is not the end of its pass

    _saved_at = float("-inf")

    def _end_stream_pass(self, micro: int) -> None:
        """A stream ended: a half-accumulated window is dropped (its gradients would be scaled for a full one)."""
        if micro:
            self.model.zero_grad(set_to_none=True)
            self._note("stream", f"the stream's last {micro} batch(es) of an accumulation window were dropped at "
                       "the end of a pass")
        self._after_boundary()

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

    # --- logging: losses stay on the device until a window is full ----------------------

    _ROW = ("step", "epoch", "samples", "time", "lr", "step_s", "data_s", "h2d_s", "forward_s", "backward_s",
            "optimizer_s")

    def _flush(self) -> None:
        """Emit the buffered steps, reading their losses back in one transfer."""
        if not self._losses:
            return
        columns = {name: list(values) for name, values in zip(self._ROW, zip(*self._rows))}
        columns["loss"] = torch.stack(self._losses).float().tolist()  # the one host<->device sync per window
        if self._nonfinite is None and self.config.on_nonfinite_loss == "stop":
            bad = next(((s, v) for s, v in zip(columns["step"], columns["loss"]) if not math.isfinite(v)), None)
            if bad is not None:
                self._nonfinite = bad
                self.stop("failed")
        self._rows.clear()
        self._losses.clear()
        self.log.emit({"type": "steps", "rows": columns})
        logged = self.recipe.logged.drain() if self.recipe.logged is not None else None
        if logged:  # the user's own self.log(...) values, read back with the losses
            self._logged.update(logged)
            self.log.emit({"type": "logged", "step": self.step, "values": logged})

    # --- epochs and validation ---------------------------------------------------------

    def _end_epoch(self) -> None:
        self._flush()
        if self.schedule is not None and self.schedule.interval == "epoch":
            self.schedule.step(self.optimizer)
            self.set_lr(self.step)
        self.epoch += 1
        self.epoch_offset = 0
        event = {"type": "epoch", "epoch": self.epoch, "step": self.step}
        if self.recipe.val_data is not None and self._validates and not self.config.val_every_n_steps:
            with self._clock.paused():
                event.update(self._validate(emit=False))
        self.log.emit(event)

    @property
    def _validates(self) -> bool:
        # A sharded model's forward gathers parameters from every rank, so every rank validates.
        return self.world.is_main or fsdp.is_sharded(self.model)

    def evaluate(self, dataset) -> dict:
        """Held-out numbers of the live model on `dataset` (see evaluation.py)."""
        return evaluation.evaluate(self, dataset)

    _validated_at: int | None = None

    def _validate(self, emit: bool = True) -> dict:
        numbers = self.evaluate(self.recipe.val_data)
        self._validated_at = self.step
        if emit:
            self.log.emit({"type": "epoch", "epoch": self.epoch, "step": self.step, "partial": True, **numbers})
        if self._monitor is not None and self._monitor.update(numbers, self.step, self.model):
            self.stop("early_stopped")
        return numbers

    def _validate_now(self) -> None:
        """A held-out evaluation between steps (val_every_n_steps), kept out of the training clock."""
        self._flush()
        if self._validates:
            with self._clock.paused():
                self._validate()

    @contextlib.contextmanager
    def _stop_on_sigint(self):
        """First Ctrl-C / kernel interrupt stops at the next step boundary; a second one aborts."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_interrupt(signum, frame):
            if self._stop.is_set():
                raise KeyboardInterrupt
            self.stop("interrupted")

        signal.signal(signal.SIGINT, on_interrupt)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def _release_loader(tb) -> None:
    """Drop the failed loop's locals (its DataLoader iterator): the error's traceback, which the kernel
    keeps for %debug, would otherwise keep the loader's worker processes alive."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    loop = next((f for f in frames if f.f_code is Engine._train_some.__code__), None)
    iterator = loop.f_locals.get("iterator") if loop is not None else None
    if iterator is None:
        return
    for frame in frames:  # the loop's frame and the loader's own frames below it (their `self`)
        if frame is loop or any(value is iterator for value in frame.f_locals.values()):
            frame.clear()
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _no_sync() -> None:
    pass


class _Clock:
    """Training wall time, with validation paused out of it."""

    def __init__(self):
        self._start = time.perf_counter()
        self._paused = 0.0

    def now(self, t: float | None = None) -> float:
        return (time.perf_counter() if t is None else t) - self._start - self._paused

    @contextlib.contextmanager
    def paused(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - t0


def _plain(value):
    """JSON-able copy of a value (NaN stays a float; tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    return value
