"""The Engine: what lives across runs on one live model.

It keeps the model, optimizer (with its own rates and the schedule), loader, precision, config and the
position (step, epoch, samples), and on a config change rebuilds only what the change touches. Each
`run()` is a `loop.Run`: what a run resets (its rows, losses, monitor, logged values, stop events,
clock) lives there, with the loop. The Engine holds its collaborators and calls them with what they
read: `rates` (LR rule, warm-up, schedule), `changes` (what a config change touches), `state` (state as
data, and the copies a fork starts from), `borrow` (a tool's trial: a fork of this engine over the borrowed
model), `report.CompileCost` (compile cost across runs), `data` / `stream` (batches), `evaluation`. Only
the Engine (and its run) sets its own fields: other modules call its methods. It knows nothing of
Jupyter: front-ends subscribe views to its MetricsLog.
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
import weakref

from torch.utils.data import DataLoader, IterableDataset

from . import adoption, borrow, changes, checkpoint, data, data_identity, dist, evaluation, rates, state, threads, toggles
from .kept_loaders import KeptLoaders
from ..config import TrainConfig, check_runnable
from .loop import Run
from ..measure import load
from ..metrics import MetricsLog
from .precision import Precision
from ..recipe import Recipe
from .report import CompileCost
from ..runs.result import RunResult
from .split import device_map, input_device
from .stream import FixedLoader, StreamLoader
from .support import seed_torch


class Engine:
    def __init__(self, recipe: Recipe, config: TrainConfig | None = None, log: MetricsLog | None = None, *,
                 like: Engine | None = None, machine_checked: bool = False):
        """`like`: an engine this one starts as a copy of, sharing only the model (see fork). `machine_checked`:
        the caller has checked in this call that this machine runs `config` (check_runnable), as nbtrain.fit
        does once per call; otherwise the engine checks it here."""
        self.recipe = recipe
        self.config = config or TrainConfig()
        if not machine_checked:
            check_runnable(self.config)  # the engine runs here: this machine is the target
        self.log = log or MetricsLog()  # the current (or last) run's log
        self.world = dist.world()
        self.model = recipe.model
        self.step = 0            # optimizer steps taken on this model by this engine
        self.epoch = 0           # current epoch
        self.epoch_offset = 0    # this rank's samples already used in the current epoch
        self.samples = 0         # samples used, all ranks together
        # Where the current run's budget counts from (a resumed run's: the interrupted one's); checkpoints keep it.
        self.run_start = {"step": 0, "samples": 0, "epochs_done": 0}
        self.seed = like.seed if like is not None else \
            self.config.seed if self.config.seed is not None else random.randrange(2**31)
        self.pending: TrainConfig | None = None  # a requested config, applied at the next step boundary
        self._lock = threading.Lock()
        self._run: Run | None = None  # the run in progress
        self.running = False
        if self.config.seed is not None and like is None:
            seed_torch(self.config.seed)
        self.notes: dict[str, str] = {}  # option -> why it does not apply here
        self.compile_cost = CompileCost()
        self.validated_at: int | None = None  # the step the model was last validated at
        self.saved_at = float("-inf")  # when the last checkpoint was written (perf_counter)
        # A split model (split.py) stays where its parts are; batches go to its first part.
        self.device = input_device(self.model) or dist.device_for(self.config.device_type, self.world)
        if device_map(self.model) is None and not toggles.moves_nothing(self.model, device=self.device):
            self.model.to(self.device)
        # The module the loop calls: the model, or its wrapper (a copy's is the original's: the same model, config)
        self.train_model = like.train_model if like is not None else changes.wrap(self, self.model)
        self.precision = Precision(self.config.precision, self.device.type)
        # The training data held for preload_data, kept across loaders (a copy's loader reads the same held data)
        self.held_data: data.Held | None = like.held_data if like is not None else None
        # Live Snapshots (state.py) keep the held data a restore dropped, so a tool alternating a holding
        # config with one that does not hold reads the data set once, not once a block.
        self.snapshots = weakref.WeakSet()
        self.kept_loaders: KeptLoaders | None = None  # loaders whose workers outlive a run (keeping_workers)
        self.loader = self.build_loader()
        if like is None:
            self.replace_optimizer()  # with its optimizer_impl applied
            self.apply_toggles(changes.TOGGLE_OPTIONS - {"optimizer_impl"})
        else:
            self.start_as_copy_of(like)

    def fork(self, recipe: Recipe | None = None) -> Engine:
        """An engine of its own over this engine's model, for a tool's trial (borrow.Trial borrows the model and
        gives it back): it starts where this one stands, with copies of the optimizer and its state, the schedule
        and its notes, the scaler, the position and the config, and its own loader over the same data (a user's
        DataLoader copied: its sampler and generators, no open pass). `recipe`: other parts for the trial (an
        optimizer or scheduler of its own is built from them). Nothing it does reaches this engine."""
        recipe = recipe or self.recipe
        # This engine's optimizer is copied (start_as_copy_of); another one given as an instance is copied here.
        own = borrow.own_parts(recipe, instances=recipe.optimizer is not self.recipe.optimizer)
        # This engine's config was checked against this machine when it became this engine's.
        return Engine(own, self.config, like=self, machine_checked=True)

    def start_as_copy_of(self, like: Engine) -> None:
        """Copies of `like`'s optimizer (and state), schedule (state and notes), scaler, notes and position."""
        if self.recipe.optimizer is like.recipe.optimizer:
            self.optimizer = state.copy_optimizer(like.optimizer)
            self.built = dataclasses.replace(like.built)  # its own record: a schedule built here sets its part
            self.base_lrs = like.base_lrs
            if self.recipe.scheduler is like.recipe.scheduler:
                self.schedule = state.copy_schedule(like.schedule, like.optimizer, self.optimizer)
            else:
                self.replace_schedule()
        else:
            self.replace_optimizer()
        if like.precision.scaler.state_dict():  # a disabled scaler saves nothing
            self.precision.scaler.load_state_dict(like.precision.scaler.state_dict())
        self.notes = {**like.notes, **self.notes}
        self.set_position(like.position())
        if self.recipe.train_data is not like.recipe.train_data:
            self.epoch_offset = 0  # other data: its first epoch from the beginning
        self.validated_at = like.validated_at

    # --- building the parts ----------------------------------------------------------

    def build_loader(self, read_again: bool = False):
        """The loader of the current config; `read_again`: no held copy of the data is reused (Engine.adopt)."""
        config = self.config
        if config.strategy == "dp":  # DataParallel splits each loaded batch across the devices
            config = config.replace(batch_size=config.batch_size * config.devices)
        spare = next((s.spare_held for s in list(self.snapshots) if s.spare_held is not None), None)
        previous = None if read_again else self.held_data or spare
        self.held_data, note = data.hold(self.recipe.train_data, config, self.world, self.device,
                                         self.recipe.collate_fn, previous=previous,
                                         own_loader=self.recipe.fixed_loader)
        self.note("preload_data", note)
        if self.held_data is not None:  # the same batches in the same order, without the per-sample path
            return data.HeldBatches(self.held_data, config, self.world, self.seed)
        if self.recipe.fixed_loader is not None:
            return FixedLoader(self.recipe.fixed_loader, lambda text: self.note("data order", text))
        if isinstance(self.recipe.train_data, IterableDataset):
            return StreamLoader(self.recipe.train_data, config, self.world, self.seed, self.recipe.collate_fn)
        def build():
            return data.build_loader(self.recipe.train_data, config, self.world, self.seed, self.recipe.collate_fn)
        if self.kept_loaders is None or not (config.num_workers and config.persistent_workers):
            return build()
        return self.kept_loaders.get(self.loader_key(config), build)

    def loader_key(self, config: TrainConfig) -> tuple:
        """What a DataLoader of `config` is built from: two configs with one key share a kept loader."""
        return (id(self.recipe.train_data), id(self.recipe.collate_fn), self.seed, config.pin,
                *(getattr(config, name) for name in sorted(changes.LOADER_OPTIONS)))

    @contextlib.contextmanager
    def keeping_workers(self):
        """Inside the block, loaders with persistent workers outlive their runs (kept_loaders.py): a later run
        with the same loader settings takes one back with its workers running. Yields the KeptLoaders (its
        keep_only stops those a caller is done with); every worker kept is stopped on the way out."""
        if self.kept_loaders is not None:  # already keeping: the outer block stops them
            yield self.kept_loaders
            return
        self.kept_loaders = KeptLoaders()
        if isinstance(self.loader, DataLoader) and self.loader.persistent_workers:  # the live loader is one too
            self.kept_loaders.get(self.loader_key(self.config), lambda: self.loader)
        try:
            yield self.kept_loaders
        finally:
            kept, self.kept_loaders = self.kept_loaders, None
            kept.keep_only()

    def rebuild_loader(self) -> None:
        """New training data: start its first epoch from the beginning."""
        self.held_data = None
        self.loader = self.build_loader()
        self.epoch_offset = 0

    def adopt(self, recipe: Recipe) -> None:
        """Train `recipe` from now on. What carries on is decided by what the recipe's parts are, compared with
        what the live ones were built as (adoption.py): an equal optimizer keeps its state, an equal schedule
        its position, the same data set (data_identity.py) its epoch and held copy; anything else is new, and the
        run's summary says which. Everything is decided before anything changes: a refusal leaves the engine
        as it was."""
        made, optimizer_note = adoption.optimizer_change(self.built, recipe, self.model)
        new_schedule, schedule_note = (True, None) if made is not None else \
            adoption.schedule_change(self.built, self.schedule, recipe)
        old, self.recipe = self.recipe, recipe
        self.note("optimizer", optimizer_note)
        self.note("scheduler", schedule_note)
        if made is not None:
            self.replace_optimizer(made)
        elif new_schedule:
            self.replace_schedule()  # given, replaced or removed (None) in this call: it takes effect now
        elif self.schedule is not None:
            self.schedule.interval = recipe.scheduler_interval
        if old.collate_fn is not recipe.collate_fn:
            self.note("training data", None)
            self.rebuild_loader()
        elif old.train_data is not recipe.train_data:
            self.note("training data", self.follow_new_data_object(old.train_data))
        else:
            self.note("training data", self.follow_data_changes())

    def take(self, recipe: Recipe, config: TrainConfig, *, machine_checked: bool = False) -> None:
        """A call given again (api.engine_for): train `recipe` under `config` from now on. The rules of a switch are
        checked against the call's own parts first (changes.check_request), so a refused call leaves the live
        optimizer, schedule, data and position as they were; then the parts are adopted (adopt) and the engine
        switches to `config` as it is. `machine_checked`: as for reconfigure."""
        changes.check_request(self, config, recipe, machine_checked=machine_checked)
        self.adopt(recipe)
        self.switch_to(config)

    def follow_new_data_object(self, old) -> str | None:
        """Another data set object given: its epoch goes on where the last one's stood only where nbtrain shows
        it reads the same samples (data_identity.same_data: the same structure over the same tensors or equal
        ones); otherwise its first epoch from the start."""
        dataset = self.recipe.train_data
        why = "a DataLoader read as it is" if self.recipe.fixed_loader is not None else \
            data_identity.same_data(old, dataset)
        if why is not None:
            self.rebuild_loader()
            return None if "cannot compare" not in why else \
                f"training data: another data set object, its first epoch from the start ({why})"
        self.loader = self.build_loader(read_again=True)
        return (f"training data: another {type(dataset).__name__} object over the same data (compared: structure, "
                f"lengths, indices and tensors): its epoch goes on, {self.epoch_offset} samples into epoch {self.epoch}")

    def follow_data_changes(self) -> str | None:
        """The same data set given again: a new length is a new epoch from its start (the sampler's length is the
        data set's); held data nbtrain cannot show unchanged is read again (the held-data rule, data.py)."""
        dataset, sampler = self.recipe.train_data, getattr(self.loader, "sampler", None)
        length = getattr(sampler, "length", None)
        if length is not None and length != len(dataset):
            self.rebuild_loader()
            return f"training data: its length changed ({length} -> {len(dataset)}): a new epoch from its start"
        why = data_identity.why_read_again(self.held_data, dataset)
        if why is None:
            return None
        self.loader = self.build_loader(read_again=True)  # the same position: the same samples, read again
        return f"training data: read again, {why}"

    def replace_optimizer(self, made=None) -> None:
        """A new optimizer (`made`, or the recipe factory's) with fresh state, at the configured rate, and its
        schedule; what it was built as is kept (adoption.Built) for the next call to compare with."""
        made = made if made is not None else self.recipe.build_optimizer(self.model.parameters())
        self.built = adoption.Built.of(made, self.model)
        self.optimizer = made
        self.use_optimizer_impl()
        # Each group's own rate before the LR rule and warm-up (the optimizer's, as given); a tuple: nobody edits it.
        self.base_lrs = tuple(group.get("initial_lr", group["lr"]) for group in self.optimizer.param_groups)
        self.replace_schedule(fresh=False)

    def note(self, option: str, note: str | None) -> None:
        """Say (or stop saying) why `option` does not apply here; runs report these."""
        if note:
            self.notes[option] = note
        else:
            self.notes.pop(option, None)

    def prepare(self, batch):
        """A batch on the training device, in the model's memory format."""
        batch = data.to_device(batch, self.device, self.config.pin)
        return toggles.to_channels_last(batch) if self.config.channels_last else batch

    # --- learning rates (rates.py) ------------------------------------------------------

    def target_lrs(self, config: TrainConfig | None = None) -> list[float]:
        """Each group's rate under the LR rule of `config` (default: the live one), before warm-up."""
        return rates.target_lrs(config or self.config, self.optimizer, self.base_lrs)

    def replace_schedule(self, fresh: bool = True) -> None:
        """The recipe's scheduler (or none) over the live optimizer (see rates.build_schedule)."""
        self.schedule = None
        self.schedule = rates.build_schedule(self.recipe, self.optimizer, self.config, self.base_lrs, fresh)
        self.built.schedule = adoption.schedule_record(self.recipe.scheduler, self.built)
        self.set_lr(self.step)

    def check_schedule(self) -> None:
        """Before a run (not a trial, which never validates): a plateau schedule has a number to step on."""
        if self.schedule is not None:
            self.schedule.check(self.config, self.recipe.val_data is not None, self.world.size)

    def set_lr(self, step: int) -> None:
        targets = self.schedule.lrs() if self.schedule is not None else self.target_lrs()
        rates.set_lr(self.optimizer, targets, self.config.warmup_steps, self.schedule_position(step))

    def schedule_position(self, step: int) -> int:
        """The steps a step-counted schedule and the warm-up have taken after `step` (config.schedule_counts)."""
        return rates.schedule_position(self.config, step)

    def lr_note(self, config: TrainConfig | None = None) -> str:
        """The learning rate this run uses (or `config` would use), and why."""
        c = config or self.config
        return rates.lr_note(c, self.target_lrs(c)[0], self.base_lrs[0], self.schedule)

    # --- config changes (changes.py) ------------------------------------------------------

    def request(self, **asked) -> TrainConfig:
        """Ask for a config change; it is validated now and applied at the next optimizer step."""
        new = (self.pending or self.config).replace(**asked)
        self.reconfigure(new)
        return new

    def reconfigure(self, config: TrainConfig, *, machine_checked: bool = False) -> None:
        """Switch to `config` as it is (between runs, or at the next step boundary of a run), once the rules of a
        switch hold (changes.check_request: refused, it changes nothing). `machine_checked`: the caller has checked
        in this call that this machine runs `config`, as nbtrain.fit does once per call."""
        changes.check_request(self, config, machine_checked=machine_checked)
        with self._lock:
            self.pending = config
        if not self.running:
            self.apply_pending()

    def apply_pending(self) -> None:
        """Apply the requested config (the run calls this at a step boundary)."""
        with self._lock:
            new, self.pending = self.pending, None
        if new is not None:
            self.switch_to(new)

    def switch_to(self, new: TrainConfig) -> None:
        """Switch to `new`, rebuilding only what the changed options touch (changes.py says which)."""
        changed = new.changed_from(self.config)
        previous, self.config = self.config, new  # the call's own config (its given options), even at equal values
        if not changed:
            return
        names = set(changed)
        if new.device_type != self.device.type and device_map(self.model) is None:
            self.device = dist.device_for(new.device_type, self.world)
            self.model.to(self.device)
            # Optimizer state (momentum, Adam moments) follows its parameters to the new device.
            self.optimizer.load_state_dict(self.optimizer.state_dict())
            self.train_model = changes.wrap(self, self.model)
        if changes.TOGGLE_OPTIONS & names:
            self.apply_toggles(names)
        if "num_threads" in names and self.running:  # a live change: from the next step on
            self._threads.follow(new.num_threads)
        if {"precision", "accelerator"} & names:
            self.precision = Precision(new.precision, self.device.type)
        if changes.LOADER_OPTIONS & names:
            self.loader = self.build_loader()
        if changes.LR_OPTIONS & names or "warmup_steps" in names:
            changes.follow_lr_rule(self, previous)
        if self.running:  # between runs the next run's start event states the config
            self.log.emit(changes.change_event(self, changed))

    def apply_toggles(self, names: set) -> None:
        """Apply the speed toggles among `names` (toggles.py); record why any does not apply here."""
        c = self.config
        if "channels_last" in names:
            self.note("channels_last", toggles.set_memory_format(self.model, c.channels_last))
        if "optimizer_impl" in names:
            self.use_optimizer_impl()
        if "activation_checkpointing" in names:
            toggles.set_activation_checkpointing(self.model, c.activation_checkpointing)
        if {"matmul_precision", "cudnn_benchmark", "accelerator"} & names:
            self.note("matmul_precision", None)
            self.note("cudnn_benchmark", None)
            for option, note in changes.matmul_notes(self).items():
                self.note(option, note)
        if {"compile", "accelerator", "activation_checkpointing"} & names:
            self.train_model = changes.compiled(self, changes.wrap(self, self.model))
            self.compile_cost.fresh = c.compile != "none"

    def use_optimizer_impl(self) -> None:
        self.optimizer, note = toggles.with_implementation(self.optimizer, self.config.optimizer_impl)
        self.note("optimizer_impl", note)

    # --- state as data (state.py) ---------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed to continue training exactly (see state.py); what checkpoints write."""
        return state.capture(self)

    def load_state_dict(self, saved: dict) -> None:
        """Continue from `saved`, all or nothing (StateMismatch when it does not fit)."""
        state.restore(self, saved)

    def trial(self, recipe: Recipe | None = None, config: TrainConfig | None = None) -> borrow.Trial:
        """A trial on this engine's model: an engine of its own (`.engine`, a fork, configured with `config`)
        that borrows the model and gives it back bit for bit when the trial closes (use it in a `with` block).
        This engine is never reached: its optimizer, schedule, loader, config and position stay as they are."""
        return borrow.Trial(self.model, lambda: self.fork(recipe), config, recipe or self.recipe, self.optimizer)

    def position(self) -> dict:
        """Where training stands, for checkpoints: enough to continue exactly."""
        return {"step": self.step, "epoch": self.epoch, "epoch_offset": self.epoch_offset, "samples": self.samples,
                "seed": self.seed, "run_start": dict(self.run_start)}

    def set_position(self, position: dict) -> None:
        self.step, self.epoch = position["step"], position["epoch"]
        self.epoch_offset, self.samples = position["epoch_offset"], position["samples"]
        self.run_start = dict(position["run_start"])
        if position["seed"] != self.seed:  # the data order is the seed's: a loader of the other seed
            self.seed = position["seed"]
            self.loader = self.build_loader()

    def save_checkpoint(self):
        """Write a checkpoint now (the run's folder, step-N.pt); returns its path."""
        self.saved_at = time.perf_counter()
        if not self.world.is_main:
            return None
        return checkpoint.save(self, checkpoint.folder(self.config))

    def evaluate(self, dataset) -> dict:
        """Held-out numbers of the live model on `dataset` (see evaluation.py)."""
        return evaluation.evaluate(self, dataset)

    # --- runs (loop.py) -------------------------------------------------------------------

    def run(self, log: MetricsLog | None = None, stop: threading.Event | None = None, *, validate: bool = True,
            sync_phases: bool = False) -> RunResult:
        """Train for the config's budget (max_epochs / max_steps) from where the model is now.

        Each run records into a fresh MetricsLog (or `log`, where views already listen). `stop`, an
        event set from any thread, ends the run at the next optimizer step as stop() does (one set
        before the run starts ends it before its first step); the engine never sets it itself.
        `validate=False`: no held-out numbers (a trial's timed steps are training only). `sync_phases`:
        synchronise the device at each phase boundary so CUDA phase times are honest (profiling only: off,
        the hot loop never waits on the device, rule 5).
        """
        self._run = Run(self, log, stop, validate=validate, sync_phases=sync_phases)
        try:
            with load.stamping(self._run.log), threads.running(self) as self._threads:  # the config's torch threads
                return self._run.train()  # (and the machine's load beside the steps, window by window)
        finally:
            self._run = None

    @property
    def stopping(self) -> bool:
        """A stop was asked for and the run has not reached its step boundary yet."""
        run = self._run
        return run is not None and run.stopping

    def stop(self, reason: str = "stopped") -> None:
        """Stop the run in progress at its next optimizer-step boundary (safe from any thread)."""
        run = self._run
        if run is not None:
            run.stop(reason)
