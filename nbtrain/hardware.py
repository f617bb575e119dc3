"""What this machine can run: CUDA devices, MPS, bf16 support, CPU cores.

Config validation asks this module instead of probing torch itself, so a front-end
that prepares a run for *another* machine (a SLURM node with GPUs) can state that
machine's inventory with `assume(...)`.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Inventory:
    cuda_devices: int
    cuda_bf16: bool
    mps: bool
    cpu_cores: int

    def accelerators(self) -> tuple[str, ...]:
        found = ["cpu"]
        if self.cuda_devices:
            found.append("cuda")
        if self.mps:
            found.append("mps")
        return tuple(found)

    def resolve(self, accelerator: str) -> str:
        """The concrete device type that `accelerator` means on this inventory."""
        if accelerator != "auto":
            return accelerator
        if self.cuda_devices:
            return "cuda"
        if self.mps:
            return "mps"
        return "cpu"


@functools.lru_cache(maxsize=1)
def _probe() -> Inventory:
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps_backend = getattr(torch.backends, "mps", None)
    return Inventory(
        cuda_devices=cuda,
        cuda_bf16=bool(cuda) and torch.cuda.is_bf16_supported(),
        mps=bool(mps_backend and mps_backend.is_available()),
        cpu_cores=os.cpu_count() or 1,
    )


_assumed: contextvars.ContextVar[Inventory | None] = contextvars.ContextVar("nbtrain_inventory", default=None)


def inventory() -> Inventory:
    """The inventory configs are validated against: the assumed one, else this machine's."""
    return _assumed.get() or _probe()


@contextlib.contextmanager
def assume(inv: Inventory):
    """Validate configs against `inv` inside this block (a remote target's hardware)."""
    token = _assumed.set(inv)
    try:
        yield inv
    finally:
        _assumed.reset(token)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
