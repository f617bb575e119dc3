"""A run: one loop for every mode, on the Engine's live model.

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

`Engine.run()` (engine.py) makes a Run: what a run resets lives here (its buffered rows and losses, the
monitor, the user's logged values, the stop events, the clock, the peak memory), what lives across runs
(model, optimizer, loader, precision, config, position) stays on the Engine. Read top to bottom: the start
(`train`), the loop (`_train_some`), its helpers (losses read back, epoch ends, held-out numbers), the end
(`_finish`). `report` states the plan, device and compile cost; `workload` digests what a run trains.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time

import torch

from . import checkpoint, data, epoch_order, fsdp, loggers, rates, report, time_limit, workload
from ..options import ConfigError, Problem
from ..measure import load
from .changes import check_batches
from .evaluation import batch_size
from .memory import PeakMemory
from ..metrics import MetricsLog
from .monitor import Monitor, check_monitor
from ..records import EndEvent, EpochEvent, LoggedEvent, StartEvent, StartInfo, StepsEvent
from ..runs.result import RunResult, summarize
from .support import Clock, no_device_sync, plain, release_loader, stop_on_sigint

_NEVER = threading.Event()  # the stop event of a run whose caller gave none: never set
ROW = ("step", "epoch", "samples", "time", "lr", "step_s", "data_s", "h2d_s", "forward_s", "backward_s",
       "optimizer_s")  # the columns of a buffered step row


class Run:
    """One call of Engine.run(): trains the config's budget from where the engine's model is now."""

    def __init__(self, engine, log: MetricsLog | None, stop: threading.Event | None, *, validate: bool = True,
                 sync_phases: bool = False):
        self.engine = engine
        self.validates = validate
        self.val_data = engine.recipe.val_data if validate else None  # None: no held-out numbers
        self.sync_phases = sync_phases
        self.log = engine.log = log if log is not None else MetricsLog()
        self._stop = threading.Event()
        self._caller_stop = stop if stop is not None else _NEVER  # the event its caller may set to end it
        self._stop_reason = ""
        self._rows: list[tuple] = []  # one tuple per optimizer step, columns as in ROW
        self._losses: list[torch.Tensor] = []  # on the device until a window is read back
        self._nonfinite: tuple[int, float] | None = None  # (step, loss) of the first loss that was not finite
        self._logged = {}  # the user's own self.log(...) values, latest each
        self._monitor: Monitor | None = None
        self._clock = Clock()
        self._device_done_s: float | None = None  # CUDA: when the device finished the run's last step (run clock)
        self._closing_validation_s = 0.0

    @property
    def stopping(self) -> bool:
        return self._stop.is_set() or self._caller_stop.is_set()

    def stop(self, reason: str) -> None:
        self._stop_reason = reason
        self._stop.set()

    def train(self) -> RunResult:
        engine, c = self.engine, self.engine.config
        self._entered = time.perf_counter()  # the run's start-up counts from here (the summary's time split)
        check_batches(engine, c)
        engine.run_start = {"step": engine.step, "samples": engine.samples, "epochs_done": 0}
        resumed_from = None
        if c.resume:
            # Every run asked to resume does (a second crash and `resume='last'` continues again); the
            # request is then consumed, so trials and later runs on this engine do not rewind it.
            resumed_from = checkpoint.resolve(c)
            checkpoint.load(engine, resumed_from)  # restores the interrupted run's start too
            engine.config = c = c.replace(resume=None)
        # A run starts at a step boundary: gradients a crashed run left mid-accumulation must not
        # leak into its first step (a plain loop's zero_grad at the top says the same).
        for parameter in engine.model.parameters():
            parameter.grad = None
        if engine.recipe.fixed_loader is None and engine.loader.sampler.per_epoch is None and c.max_steps is None:
            raise ConfigError([Problem("max_steps", None, "a whole number >= 1: the training data is an "
                                       "IterableDataset (a stream has no length, so no epoch count can budget it)")])
        if self.validates:  # a trial's run validates nothing, so it monitors nothing
            check_monitor(c, engine.recipe)
        monitored = c.monitor and self.validates
        self._monitor = Monitor(c.monitor, c.mode, c.patience, c.restore_best) if monitored else None
        logger = loggers.attach(self.log, c) if c.logger != "none" and engine.world.is_main else None
        # this run's loader says it again where it applies; a rebuilt split says its order is nbtrain's
        engine.note("data order", engine.recipe.order_note)
        engine.running = True
        peak = PeakMemory(engine.device)
        peak.start()
        # The budget counts from the run's start (a resumed run's: the interrupted one's); what this
        # call trains, and every figure of it, counts from where it begins training.
        start_step, from_step, from_samples = engine.run_start["step"], engine.step, engine.samples
        # On CUDA a run's edges are the device's: work queued before it (a tool's restore between two timed
        # blocks) is not charged to its first step, and its end (below) waits for the steps it queued.
        cuda = engine.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(engine.device)
        self._clock = Clock()
        self._load, self._workload = load.of_device(engine.device), workload.digest(engine.recipe, engine.model)
        self.log.emit(StartEvent(type="start", config=plain(c.to_dict()),
                                 info=StartInfo(**vars(report.info(engine, self._workload)), samples_start=engine.samples,
                                                step_start=engine.step,
                                                planned_steps=report.planned_steps(c, engine.loader)
                                                - (from_step - start_step),
                                                resumed_from=str(resumed_from) if resumed_from else None).to_dict()))
        status = "completed"
        try:
            with stop_on_sigint(engine), time_limit.within(engine, c.max_time, self):
                while True:
                    c = engine.config
                    if c.max_steps is not None and engine.step - start_step >= c.max_steps:
                        break
                    if c.epochs_budget is not None and engine.run_start["epochs_done"] >= c.epochs_budget:
                        break
                    if self.stopping:
                        status = time_limit.ended(engine, self._stop_reason, engine.step - from_step)
                        break
                    steps_left = None if c.max_steps is None else c.max_steps - (engine.step - start_step)
                    if self._train_some(steps_left):
                        engine.run_start["epochs_done"] += 1
                        self._end_epoch()
        except KeyboardInterrupt:
            status = "interrupted"
        except BaseException as error:
            release_loader(error.__traceback__)
            raise
        finally:
            if cuda:  # the device's end of the run: the host may have queued its last steps ahead of it
                torch.cuda.synchronize(engine.device)
                self._device_done_s = self._clock.now()
            engine.running = False
            self._caller_stop = _NEVER
            if engine.kept_loaders is None or not engine.kept_loaders.settle(engine.loader):
                data.stop_workers(engine.loader)
            self._flush()
        return self._finish(status, peak, logger, resumed_from, from_step, from_samples)

    def _train_some(self, steps_left: int | None) -> bool:
        """Train from the current position until the epoch ends (True) or a stop, budget or change (False)."""
        engine = self.engine
        c, recipe, precision = engine.config, engine.recipe, engine.precision
        model, optimizer, scaler = engine.train_model, engine.optimizer, precision.scaler
        loader = engine.loader
        sampler = loader.sampler
        sampler.set_position(engine.epoch, engine.epoch_offset)
        if hasattr(engine.model, "start_batches_at"):  # a LightningModule's batch_idx: the batch's index in its epoch
            engine.model.start_batches_at(engine.epoch_offset // c.batch_size)
        k, world = c.accumulate_grad_batches, engine.world.size
        if sampler.per_epoch is None:  # a stream: as many batches as the budget needs, or until it ends
            sizes = None
            passes = getattr(loader, "batches_per_pass", None)  # the user's own DataLoader knows its length
            n = steps_left * k if passes is None else min(passes(), steps_left * k if steps_left else passes())
        else:
            sizes = data.batch_sizes(len(sampler), loader.batch_size, c.drop_last)
            n = len(sizes)
        if not n:
            return True
        # Everything the hot loop touches is a local: this loop must cost no more than a hand-written one.
        device = engine.device
        move = (device.type != "cpu" and not isinstance(loader, data.HeldBatches)) or c.channels_last
        perf, now = time.perf_counter, self._clock.now
        no_sync = getattr(model, "no_sync", None)
        # FSDP's no_sync: a flag that must hold through backward, set before every micro-step's forward.
        set_sync = getattr(model, "set_requires_gradient_sync", None) if k > 1 else None
        null = contextlib.nullcontext()
        clip, warm_until, log_every = c.gradient_clip_val, c.warmup_steps, c.log_every_n_steps
        schedule = engine.schedule
        step_schedule = schedule.step if schedule is not None and schedule.interval == "step" else None
        position = engine.schedule_position  # the schedule's steps after a step (config.schedule_counts)
        rows, losses, group = self._rows, self._losses, optimizer.param_groups[0]
        stop, caller_stop, step_loss = self._stop, self._caller_stop, recipe.step_loss
        val_every = c.val_every_n_steps if self.val_data is not None else None
        every = c.checkpoint_every  # an options.Interval: steps or seconds, read once by the config
        save_steps, save_seconds = (every.steps, every.seconds) if every else (0, 0.0)
        sync = functools.partial(torch.cuda.synchronize, device) \
            if self.sync_phases and device.type == "cuda" else no_device_sync
        # A disabled GradScaler (any precision but fp16 on CUDA) passes the loss and the step through: not
        # called four times a step for nothing, nor a forward's two empty contexts entered at fp32 without
        # accumulation (~8 us a step of the ~1 ms steps of a small model).
        scaling = scaler.is_enabled()
        plain_forward = k == 1 and precision.dtype is None  # every batch a whole step, no autocast
        steps_as_written = rates.steps_as_written(c)  # then no position look-ups: one schedule step a step
        iterator = epoch_order.start_pass(loader, engine.epoch_offset)  # with the user's loop's draw at offset 0
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
                batch = engine.prepare(batch)
            sync()
            t2 = perf()
            boundary = micro + 1 == window
            if set_sync is not None:
                set_sync(boundary)
            if plain_forward:
                loss = step_loss(model, batch)
            else:
                with (null if boundary or no_sync is None else no_sync()), precision.autocast():
                    loss = step_loss(model, batch)
                    if window > 1:
                        loss = loss / window
            sync()
            t3 = perf()
            (scaler.scale(loss) if scaling else loss).backward()
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
                if scaling:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(engine.model.parameters(), clip)
            if scaling:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            t5 = perf()
            engine.step += 1
            engine.epoch_offset += window_samples
            engine.samples += window_samples * world
            rows.append((engine.step, engine.epoch, engine.samples, now(t5), group["lr"], t5 - t_step,
                         data_s, h2d_s, forward_s, backward_s, t5 - t4))
            losses.append(loss_sum)
            if len(losses) >= log_every:
                self._flush()
            if step_schedule is not None:  # once a step; laid over samples, as many as the step's samples hold
                for _ in range(1 if steps_as_written else position(engine.step) - position(engine.step - 1)):
                    step_schedule(optimizer)
            if (engine.step - 1 if steps_as_written else position(engine.step - 1)) < warm_until:
                engine.set_lr(engine.step)
            if (save_steps and engine.step % save_steps == 0) or \
                    (save_seconds and t5 - engine.saved_at >= save_seconds):
                with self._clock.paused("checkpointing"):
                    engine.save_checkpoint()
            if val_every and engine.step % val_every == 0:
                self._validate_now()
            micro = window_samples = 0
            data_s = h2d_s = forward_s = backward_s = 0.0
            if steps_left is not None:
                steps_left -= 1
            if i + 1 < n and (steps_left == 0 or stop.is_set() or caller_stop.is_set()
                              or engine.pending is not None):
                self._after_boundary()
                return False
            t_step = perf()
        self._after_boundary()
        return sizes is not None  # a stream's budget ending is not the end of its pass

    # --- the loop's helpers ---------------------------------------------------------------

    def _flush(self) -> None:
        """Emit the buffered steps, reading their losses back in one transfer."""
        if not self._losses:
            return
        engine = self.engine
        columns = {name: list(values) for name, values in zip(ROW, zip(*self._rows))}
        columns["loss"] = torch.stack(self._losses).float().tolist()  # the one host<->device sync per window
        if self._nonfinite is None and engine.config.on_nonfinite_loss == "stop":
            bad = next(((s, v) for s, v in zip(columns["step"], columns["loss"]) if not math.isfinite(v)), None)
            if bad is not None:
                self._nonfinite = bad
                self.stop("failed")
        self._rows.clear()
        self._losses.clear()
        self.log.emit(StepsEvent(type="steps", rows=columns))
        logged = engine.recipe.logged.drain() if engine.recipe.logged is not None else None
        if logged:  # the user's own self.log(...) values, read back with the losses
            self._logged.update(logged)
            self.log.emit(LoggedEvent(type="logged", step=engine.step, values=logged))

    def _after_boundary(self) -> None:
        if self.engine.pending is not None:
            self._flush()
            self.engine.apply_pending()

    def _end_stream_pass(self, micro: int) -> None:
        """A stream ended: a half-accumulated window is dropped (its gradients would be scaled for a full one)."""
        if micro:
            self.engine.model.zero_grad(set_to_none=True)
            self.engine.note("stream", f"the stream's last {micro} batch(es) of an accumulation window were "
                             "dropped at the end of a pass")
        self._after_boundary()

    def _end_epoch(self) -> None:
        self._flush()
        engine = self.engine
        if engine.schedule is not None and engine.schedule.interval == "epoch":
            engine.schedule.step(engine.optimizer)
            engine.set_lr(engine.step)
        engine.epoch += 1
        engine.epoch_offset = 0
        event = EpochEvent(type="epoch", epoch=engine.epoch, step=engine.step)
        if self.val_data is not None and self._validates() and not engine.config.val_every_n_steps:
            with self._clock.paused():
                event.update(self._validate(emit=False))
        self.log.emit(event)

    def _validates(self) -> bool:
        # A sharded model's forward gathers parameters from every rank, so every rank validates.
        return self.engine.world.is_main or fsdp.is_sharded(self.engine.model)

    def _validate(self, emit: bool = True, closing: bool = False) -> dict:
        """Held-out numbers now; `closing`: the report of a run ending mid-epoch, which a plateau schedule
        does not step on (a run continued in the next call then steps where one longer run would)."""
        engine = self.engine
        numbers = engine.evaluate(self.val_data)
        engine.validated_at = engine.step
        if emit:
            self.log.emit(EpochEvent(type="epoch", epoch=engine.epoch, step=engine.step, partial=True, **numbers))
        if engine.schedule is not None and engine.schedule.on_plateau and not closing:
            engine.schedule.step_on(numbers, engine.config, engine.optimizer)
            engine.set_lr(engine.step)
        if self._monitor is not None and self._monitor.update(numbers, engine.step, engine.model):
            self.stop("failed" if self._monitor.problem else "early_stopped")
        return numbers

    def _validate_now(self) -> None:
        """A held-out evaluation between steps (val_every_n_steps), kept out of the training clock."""
        self._flush()
        if self._validates():
            with self._clock.paused():
                self._validate()

    # --- the end ------------------------------------------------------------------------

    def _finish(self, status, peak, logger, resumed_from, from_step: int, from_samples: int) -> RunResult:
        """The run's status, its closing held-out numbers and its summary (the `end` event)."""
        engine, c, message = self.engine, self.engine.config, ""
        if status != "completed" and status != "early_stopped":
            message = f"stopped at step {engine.step} (epoch {engine.epoch}, {engine.epoch_offset} samples into it)"
        if self._nonfinite is not None:
            bad_step, value = self._nonfinite
            status = "failed"
            message = (f"the loss became {value} at step {bad_step} ({c.precision}); training stopped at step "
                       f"{engine.step}, where the losses were read back; lower the learning rate, check the data, "
                       f"or resume from a checkpoint written before step {bad_step}")
        if self.val_data is not None and engine.epoch_offset and self._validates() \
                and engine.validated_at != engine.step:
            closing = time.perf_counter()
            self._validate(closing=True)  # a run ending mid-epoch still reports held-out numbers
            self._closing_validation_s = time.perf_counter() - closing
        if self._monitor is not None and self._monitor.failure:
            status, message = "failed", self._monitor.failure
        if status == "early_stopped":  # a planned end, not a stop from outside
            status, message = "completed", self._monitor.stop_message(engine.step)
        best = self._monitor.put_best_back(engine.model) if self._monitor is not None and c.restore_best else None
        per_epoch = (engine.loader.sampler.per_epoch or 0) * engine.world.size
        epochs = (engine.samples - from_samples) / per_epoch if per_epoch else engine.run_start["epochs_done"]
        extra = {"epochs_trained": epochs, "status": status,
                 "peak_mem_mb": peak.peak() / 2**20, "mem_kind": peak.kind, "run_steps": engine.step - from_step}
        extra.update(vars(report.info(engine, self._workload)))
        if self._device_done_s is not None:
            extra["device_done_s"] = self._device_done_s
        # preload_data left on auto and not applying is the engine's business, not this summary's (except
        # where the user's own sampler is why: that their order is kept is worth a line)
        quiet = {"preload_data"} if engine.config.preload_data is None and engine.held_data is None \
            and engine.recipe.fixed_loader is None else set()
        extra["notes"] = [n for k, n in engine.notes.items() if k not in quiet] \
            + engine.compile_cost.notes(self.log.columns["step_s"], engine.config.compile, extra) \
            + ([best] if best else []) + (engine.schedule.run_notes(self.log.columns["step"], self.log.columns["lr"])
                                    if engine.schedule is not None else []) \
            + ([f"resumed from {os.path.basename(resumed_from)}: this run trained steps {from_step + 1:,} to "
                f"{engine.step:,} of the interrupted run's budget"] if resumed_from else []) \
            + ([logger.note] if logger is not None else [])
        if self._logged:
            extra["logged"] = dict(self._logged)
        if self.log.thinning:  # rows were dropped to bound memory: the count of steps is the log's, not its rows'
            extra["notes"].append(self.log.thinning)
            extra["steps"] = self.log.steps_seen
        extra["load"] = self._load.reading().as_dict()
        summary = summarize(self.log, extra)
        summary = summary.replace(time_split=report.time_split(self._entered, self._clock, summary.steady.warmup_s,
                                                               summary.train_time_s, self._closing_validation_s))
        self.log.emit(EndEvent(type="end", summary=plain(summary.to_dict()), status=status, message=message))
        if logger is not None:
            logger.close()
        return RunResult(engine.config, self.log, summary, status, message)
