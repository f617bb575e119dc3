"""Rank and world from the environment torchrun sets, and the device each rank trains on.

(DDP's `no_sync` on accumulation micro-steps is applied inline in the engine's hot loop.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """This process's place in the job (rank 0 of 1 outside torchrun)."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        return World(torch_dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0)), torch_dist.get_world_size())
    return World(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                 int(os.environ.get("WORLD_SIZE", 1)))


def device_for(device_type: str, w: World) -> torch.device:
    """One accelerator per local rank; CPU ranks all share 'cpu'."""
    if device_type == "cuda":
        return torch.device("cuda", w.local_rank)
    return torch.device(device_type)
