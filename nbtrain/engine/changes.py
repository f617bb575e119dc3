"""Config changes on the live engine: validated when asked, applied between optimizer steps, rebuilding only what they touch."""
from __future__ import annotations


import torch

from . import dist, fsdp, toggles
from ..config import ConfigError, Problem, TrainConfig, check_runnable
from .precision import Precision
from ..recipe import FIXED_OPTIONS, fixed_reason
from ..records import ChangeEvent
from .split import device_map
from .support import plain as _plain

# Which parts of the live session each option touches.
LOADER_OPTIONS = {"batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
                  "shuffle", "drop_last", "accelerator", "preload_data"}
LR_OPTIONS = {"lr", "scale_lr", "base_batch_size", "batch_size", "accumulate_grad_batches", "devices", "num_nodes"}
OUT_OF_PROCESS = {"devices", "num_nodes", "strategy"}
TOGGLE_OPTIONS = {"compile", "channels_last", "matmul_precision", "cudnn_benchmark", "optimizer_impl",
                  "activation_checkpointing", "accelerator"}

class LiveChanges:
    """Part of Engine (engine.py): config changes on the live engine: validated when asked, applied between optimizer steps, rebuilding only what they touch."""

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

    def request(self, **changes) -> TrainConfig:
        """Ask for a config change; it is validated now and applied at the next optimizer step."""
        new = (self._pending or self.config).replace(**changes)
        check_runnable(new)
        self._check_batches(new)
        out_of_process = set(new.changed_from(self.config)) & OUT_OF_PROCESS
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
        if TOGGLE_OPTIONS & names:
            self._apply_toggles(names)
        if {"precision", "accelerator"} & names:
            self.precision = Precision(new.precision, self.device.type)
        if LOADER_OPTIONS & names:
            self.loader = self._build_loader()
        if LR_OPTIONS & names or "warmup_steps" in names:
            if self.schedule is not None:  # the rule rescales the user's schedule, and the summary says so
                old = self._target_lrs(previous)
                self.schedule.rescale([n / o if o else 1.0 for n, o in zip(self._target_lrs(), old)],
                                      f"step {self.step}: global batch {previous.global_batch_size} -> "
                                      f"{new.global_batch_size}, {new.scale_lr} rule")
            self.set_lr(self.step)
        if self.running:  # between runs the next run's start event states the config
            self.log.emit(ChangeEvent(type="change", step=self.step,
                                      changes={k: [_plain(a), _plain(b)] for k, (a, b) in changes.items()}))

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
