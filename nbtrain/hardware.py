"""What this machine can run: CUDA devices, MPS, bf16 support, CPU cores.

Config validation asks this module instead of probing torch itself, so a front-end
that prepares a run for *another* machine (a SLURM node with GPUs) can state that
machine's inventory with `assume(...)`.

Reading the inventory never initialises CUDA: a process that did can no longer fork ranks
that use the GPU (the zygote reads it too). Devices are counted by NVML, and bf16 support
is the compute capability (>= 8.0; a T4 only emulates bf16) read from NVML, never from
`is_bf16_supported()` or `get_device_capability()`, which initialise CUDA.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
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


def _nvml_capability(index: int) -> tuple[int, int] | None:
    """The compute capability of visible CUDA device `index`, read from NVML (None when NVML cannot say)."""
    try:
        physical = torch.cuda._get_nvml_device_index(index)  # CUDA_VISIBLE_DEVICES' order, read without CUDA
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except (OSError, RuntimeError, AttributeError, IndexError):
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
        if nvml.nvmlDeviceGetHandleByIndex_v2(physical, ctypes.byref(handle)) != 0:
            return None
        if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
        return major.value, minor.value
    finally:
        nvml.nvmlShutdown()


def capability(index: int) -> tuple[int, int] | None:
    """Device `index`'s compute capability, without initialising CUDA where it is not yet."""
    if torch.cuda.is_initialized():
        return torch.cuda.get_device_capability(index)
    return _nvml_capability(index)


def _cuda_count() -> int:
    # device_count() asks NVML before CUDA is initialised (is_available() would initialise it unless
    # PYTORCH_NVML_BASED_CUDA_CHECK=1); only where NVML cannot answer does it ask the driver.
    return torch.cuda.device_count() if torch.cuda._is_compiled() else 0


@functools.lru_cache(maxsize=1)
def _probe() -> Inventory:
    cuda = _cuda_count()
    mps_backend = getattr(torch.backends, "mps", None)
    return Inventory(
        cuda_devices=cuda,
        cuda_bf16=bool(cuda) and all((capability(i) or (0, 0)) >= (8, 0) for i in range(cuda)),
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
