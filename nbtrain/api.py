"""`nbtrain.fit`: train a model with a config, in this process or as DDP workers."""
from __future__ import annotations

import time

from .config import TrainConfig, check_runnable
from .options import ConfigError, Problem
from .engine import imports
from .engine.engine import Engine
from .engine.report import with_call
from .engine.loggers import check_folder
from .engine.monitor import check_monitor
from .metrics import MetricsLog
from .adapters import recipe_for
from .recipe import Recipe, RecipeError
from .user_loader import fixed_reason
from .runs.result import RunResult
from .slots import Slot

# One live engine per model, so a second run continues with the same optimizer state. The engine
# hangs off its model (a reference cycle the garbage collector frees with the model) rather than
# off a module-level table, which would keep every model and its memory alive.
_SLOT = "_nbtrain_engine"


def live_engine(model):
    """The engine that last trained `model` in this process, or None."""
    slot = model.__dict__.get(_SLOT)
    return slot.value if slot is not None else None


def _attach(model, engine) -> None:
    model.__dict__[_SLOT] = Slot(engine)  # not a Module attribute: no state_dict, no repr; pickles empty


def engine_for(recipe: Recipe, config: TrainConfig, *, settled: bool = False) -> Engine:
    """The live engine of `recipe.model`, adopting the recipe's data, loss and config: a live one switches to
    `config` as it is (Engine.take). `settled`: the caller has, in this call, given `config` the recipe's
    DataLoader settings (Recipe.adopt_settings) and checked that this machine runs it (check_runnable), as
    nbtrain.fit does once per call; otherwise both happen here, once."""
    if not settled:
        config = recipe.adopt_settings(config)
        check_runnable(config)  # the engine runs here: this machine is the target
    engine = live_engine(recipe.model)
    if engine is None or engine.running:
        engine = Engine(recipe, config, machine_checked=True)
        _attach(recipe.model, engine)
        return engine
    engine.take(recipe, config, machine_checked=True)  # checked against these parts, then adopted (Engine.take)
    return engine


def kernel_engine(recipe: Recipe, config: TrainConfig) -> Engine | None:
    """The kernel's engine that a run elsewhere (`config`'s ranks) continues, and that continues from it: the live
    engine, as a call in this process would find it, so a later call (DDP or not) continues this one. None under
    fsdp: sharded optimizer state stays with its ranks."""
    from .distributed import carry
    if config.strategy == "fsdp":
        return None
    engine = engine_for(recipe, carry.kernel_config(config, recipe.model, live_engine(recipe.model)))
    if engine.schedule is not None:  # refused here, before any rank starts (the ranks would, in rank 0)
        engine.schedule.check(config, recipe.val_data is not None, config.world_size)
    return engine


def check_schedule_before_ranks(recipe: Recipe, config: TrainConfig) -> None:
    """What every rank's engine refuses of the recipe's schedule before training (its optimizer and scheduler
    built as given; Schedule.check: a plateau schedule under DDP), refused here before any rank starts, without
    an engine: a factory is called over a copy of the user's optimizer instance, never the instance itself."""
    from .engine.schedule import Schedule, is_scheduler
    from .engine.state import copy_optimizer
    if recipe.scheduler is None:
        return
    optimizer = recipe.build_optimizer(recipe.model.parameters())
    if not is_scheduler(recipe.scheduler) and optimizer is getattr(recipe.optimizer, "instance", None):
        optimizer = copy_optimizer(optimizer)  # a factory sets its rates (initial_lr) in the groups it is given
    Schedule.build(recipe, optimizer).check(config, recipe.val_data is not None, config.world_size)


def kernel_side(recipe: Recipe, config: TrainConfig):
    """(engine, first) for a run elsewhere: the kernel's live engine that its ranks continue (kernel_engine), or,
    where the model has none, no engine built only to carry state: a carry.FirstCall, whose engine is made from
    what the ranks bring back. (None, None) under fsdp: sharded optimizer state stays with its ranks."""
    from .distributed import carry
    if config.strategy == "fsdp":
        return None, None
    if carry.live_engine(recipe.model) is not None:
        return kernel_engine(recipe, config), None
    check_schedule_before_ranks(recipe, config)
    return None, carry.FirstCall(config, lambda: engine_for(
        recipe, carry.kernel_config(config, recipe.model, live_engine(recipe.model))))


def _checked_target(config: TrainConfig, options: dict | None):
    """The launcher target `config` names, with `options`, once it checked that it runs `config` (not this
    machine, for a remote one); refused, it lets go of what it took (a Ray cluster it started)."""
    from .distributed.launchers import launcher_for
    if options is not None and not isinstance(options, dict):
        from .distributed.launchers.base import LauncherOptionError
        raise LauncherOptionError(f"launcher_options={options!r}: allowed: a dict of the launcher's options, or None")
    target = launcher_for(config, **(options or {}))
    try:
        target.check(config)
    except BaseException:
        target.release()
        raise
    return target


def fit(model=None, train_data=None, *, loss_fn=None, training_step=None, optimizer=None, val_data=None,
        collate_fn=None, scheduler=None, scheduler_interval=None, metrics=None, validation_step=None,
        recipe: Recipe | None = None, config: TrainConfig | None = None,
        log: MetricsLog | None = None, name: str | None = None, stop=None, launcher_options: dict | None = None,
        **options) -> RunResult:
    """Train `model` on `train_data` (or a ready `recipe`) and return the measured result.

    `model` may be any nn.Module or a LightningModule (its own steps, optimizers and data);
    `train_data` a Dataset or a DataLoader (its settings are the starting config). Options
    may be given as a TrainConfig and/or as keywords (`batch_size=64`), which override it.
    With devices > 1 or num_nodes > 1 the run goes to DDP workers and the trained weights
    come back into `model`. `stop`, a threading.Event, ends the run at the next optimizer step once
    set from any thread (every DDP rank at the same step), keeping what it trained.
    `launcher_options`: the options of the launcher the config names (launchers.launcher_for), e.g.
    `launcher="slurm", launcher_options={"partition": "gpu", "time": "01:00:00"}`; that target, not this
    machine, is checked (a SLURM partition through sinfo, a Ray cluster's resources).
    """
    called = time.perf_counter()  # the call's wall time, all of it, is split in the summary
    imported_s = imports.settle()  # before the first optimizer is built (an interrupt cannot cut those imports)
    parts = {"model": model, "train_data": train_data, "loss_fn": loss_fn, "training_step": training_step,
             "optimizer": optimizer, "val_data": val_data, "collate_fn": collate_fn, "scheduler": scheduler,
             "scheduler_interval": scheduler_interval, "metrics": metrics, "validation_step": validation_step}
    given = [name for name, value in parts.items() if value is not None]
    if recipe is not None and given:
        raise RecipeError(f"fit: a recipe and {', '.join(given)} were both given; allowed: the recipe alone "
                          "(put those parts in it) or the parts without a recipe")
    if recipe is None:
        recipe = recipe_for(model, train_data, loss_fn=loss_fn, training_step=training_step, optimizer=optimizer,
                            val_data=val_data, collate_fn=collate_fn, scheduler=scheduler,
                            scheduler_interval=scheduler_interval, metrics=metrics, validation_step=validation_step)
    config = TrainConfig.of(config)
    # One config made, not a default one and then its replacement (each is validated whole)
    if config is None:
        config = TrainConfig.with_options(**options)
    elif options:
        config = config.replace(**options)
    config = recipe.adopt_settings(config)
    # DataParallel: one process driving several GPUs. A launcher named on purpose runs even one rank its way
    # (one GPU of a Ray cluster); by default one rank trains here, in the kernel.
    elsewhere = (config.world_size > 1 or config.launcher not in (None, "local")) and config.strategy != "dp"
    check_monitor(config, recipe)  # before DDP workers start, too
    check_folder(config)
    if config.world_size > 1 and recipe.fixed_loader is not None:
        raise ConfigError([Problem("devices", config.devices, "1: " + fixed_reason(recipe.fixed_loader)
                                   + " (it cannot be shared out across ranks)")])
    if elsewhere:
        target = _checked_target(config, launcher_options)  # where the ranks run checks it, once
        from .distributed.launch import fit_distributed
        try:
            engine, first = kernel_side(recipe, config)
        except BaseException:
            target.release()
            raise
        before = time.perf_counter() - called
        result = fit_distributed(recipe, config, log=log, stop=stop, engine=engine, first=first, target=target)
        began = result.extras.pop("run_began", None)
        if began is not None and result.summary.time_split is not None:
            # Starting the ranks (processes, imports, rendezvous, each rank's engine) is start-up, not "other":
            # the call until rank 0's run began, less the start-up rank 0's own split already holds.
            before = began - called - result.summary.time_split.get("start-up", 0.0)
    else:  # this machine runs it: its settings adopted above, the machine checked here, once
        if launcher_options:
            from .distributed.launchers.base import LauncherOptionError
            raise LauncherOptionError(f"launcher_options={launcher_options!r}: allowed: None when the run trains in "
                                      "this process (devices=1, num_nodes=1, no launcher named)")
        check_runnable(config)
        engine = engine_for(recipe, config, settled=True)
        engine.note("start-up", imports.first_call_note(imported_s))  # this call's summary only
        try:
            engine.check_schedule()
            before = time.perf_counter() - called
            result = engine.run(log=log, stop=stop)
        finally:
            engine.note("start-up", None)
    result.name = name
    if result.summary.time_split is not None:
        call_s = time.perf_counter() - called
        result.summary = result.summary.replace(call_s=call_s,
                                                time_split=with_call(result.summary.time_split, before, call_s))
    return result

