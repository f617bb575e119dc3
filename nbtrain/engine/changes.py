"""Config changes on an engine: checked when asked (check_request), applied between optimizer steps by the
Engine itself (Engine.switch_to, which sets its own fields), rebuilding only what they touch; what each
option touches, and the parts it is rebuilt with, are here."""
from __future__ import annotations


import torch
from torch.utils.data import IterableDataset

from . import fsdp, toggles
from ..config import TrainConfig, check_runnable
from ..options import ConfigError, Problem
from ..user_loader import FIXED_OPTIONS, fixed_reason
from ..records import ChangeEvent
from .epoch_order import EpochSampler
from .split import device_map
from .support import plain

# Which parts of the live session each option touches.
LOADER_OPTIONS = {"batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
                  "shuffle", "drop_last", "accelerator", "preload_data"}
LR_OPTIONS = {"lr", "scale_lr", "base_batch_size", "batch_size", "accumulate_grad_batches", "devices", "num_nodes"}
OUT_OF_PROCESS = {"devices", "num_nodes", "strategy"}
TOGGLE_OPTIONS = {"compile", "channels_last", "matmul_precision", "cudnn_benchmark", "optimizer_impl",
                  "activation_checkpointing", "accelerator"}


def wrap(engine, model):
    """The module the loop calls for `model`: itself, or its FSDP / DDP / DataParallel form."""
    config, world, device = engine.config, engine.world, engine.device
    if config.strategy == "fsdp" and world.distributed and torch.distributed.is_initialized():
        fsdp.shard(model, device.type, world.size)  # FSDP reduces gradients itself: no DDP
        return model
    if world.distributed and torch.distributed.is_initialized():
        one_device = device.type == "cuda" and device_map(model) is None
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if one_device else None,
            find_unused_parameters=config.find_unused_parameters)
    if config.strategy == "dp" and device.type == "cuda":
        return torch.nn.DataParallel(model, device_ids=list(range(config.devices)))
    return model


def matmul_notes(engine) -> dict:
    """{option: why it does not apply here} of the process-wide matmul settings, applied now."""
    c = engine.config
    return {note.split("=")[0]: note for note in toggles.matmul_settings(c.matmul_precision, c.cudnn_benchmark,
                                                                          engine.device.type)}


def compiled(engine, wrapped):
    """The module the loop calls under the config's compile mode: `wrapped` itself, or compiled."""
    mode = engine.config.compile
    return wrapped if mode == "none" else torch.compile(wrapped, mode=mode)


def check_request(engine, new: TrainConfig, recipe=None, *, machine_checked: bool = False) -> None:
    """A config this process can switch to, asked for mid-run or given between runs (ValueError / ConfigError
    when not); `recipe`: the parts it will train (default: the live ones), checked before any is adopted.
    `machine_checked`: the caller has checked in this call that this machine runs `new`."""
    if not machine_checked:
        check_runnable(new)
    check_batches(engine, new, recipe)
    out_of_process = set(new.changed_from(engine.config)) & OUT_OF_PROCESS
    if out_of_process:
        raise ValueError(f"{', '.join(sorted(out_of_process))} cannot change inside a running process; "
                         "start a new run with them instead")


def follow_lr_rule(engine, previous: TrainConfig) -> None:
    """After a change of what the LR rule reads: the rule rescales the user's schedule (and the summary says
    so), and every group takes its rate at the current step."""
    new = engine.config
    if engine.schedule is not None:
        old = engine.target_lrs(previous)
        engine.schedule.rescale([n / o if o else 1.0 for n, o in zip(engine.target_lrs(), old)],
                                f"step {engine.step}: global batch {previous.global_batch_size} -> "
                                f"{new.global_batch_size}, {new.scale_lr} rule")
    engine.set_lr(engine.step)


def change_event(engine, changes: dict) -> ChangeEvent:
    return ChangeEvent(type="change", step=engine.step,
                       changes={k: [plain(a), plain(b)] for k, (a, b) in changes.items()})


def check_batches(engine, config: TrainConfig, recipe=None) -> None:
    """Refuse a config whose epoch of `recipe`'s data (default: the live recipe's) holds no batch (it would loop
    over empty epochs forever), and a batching change on a DataLoader whose own sampler decides the batches."""
    recipe = recipe or engine.recipe
    fixed = recipe.fixed_loader
    if fixed is not None:
        changed = [o for o in FIXED_OPTIONS if getattr(config, o) != getattr(engine.config, o)]
        if changed:
            raise ConfigError([Problem(o, getattr(config, o), fixed_reason(fixed)) for o in changed])
        return
    if isinstance(recipe.train_data, IterableDataset):  # a stream: its length is known only when it ends
        return
    # This rank's samples of an epoch as the loaders order them (data.py), read from the data itself: the data a
    # call gives is checked before the engine builds a loader of it.
    per_rank = EpochSampler(recipe.train_data, engine.world, False, 0).per_epoch
    batch = config.batch_size * (config.devices if config.strategy == "dp" else 1)
    if config.drop_last and per_rank < batch:
        shown = f"{per_rank} samples per rank" if engine.world.size > 1 else f"{per_rank} samples"
        raise ConfigError([Problem("batch_size", config.batch_size,
                                   f"with drop_last=True an epoch of {shown} holds no full batch; allowed: "
                                   f"batch_size <= {per_rank}, or drop_last=False")])
