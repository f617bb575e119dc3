"""One small object per precision: the autocast context and the gradient scaler.

The loop calls `precision.autocast()` and `precision.scaler` the same way in every
mode; in 32-true they are a null context and a disabled scaler, so the loop has no
precision branches.
"""
from __future__ import annotations

import contextlib

import torch

_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


class Precision:
    def __init__(self, precision: str, device_type: str):
        self.name = precision
        self.device_type = device_type
        self.dtype = _DTYPES.get(precision)
        self._null = contextlib.nullcontext()
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        scaler_device = device_type if device_type == "cuda" else "cpu"
        self.scaler = torch.amp.GradScaler(scaler_device, enabled=precision == "16-mixed" and device_type == "cuda")

    def autocast(self):
        if self.dtype is None:
            return self._null
        return torch.autocast(self.device_type, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"Precision({self.name!r} on {self.device_type}, scaler={'on' if self.scaler.is_enabled() else 'off'})"
