"""strategy="fsdp": shard a model's parameters, gradients and optimizer state across ranks.

For the checklist's "the model does not fit on one device" case. FSDP2 (`fully_shard`)
turns each parameter into a DTensor sharded over a one-dimensional device mesh of all
ranks; a sharded block gathers its full parameters just before its forward and backward
and frees them after, so the peak holds one block in full, not the whole model.

Each top-level block that has parameters becomes its own unit (the same blocks
activation checkpointing's "auto" picks), then the root takes what is left. The engine
does not wrap a sharded model in DDP: FSDP reduces gradients itself, and on accumulation
micro-steps it is told not to (`set_requires_gradient_sync(False)`), as DDP's no_sync.
"""
from __future__ import annotations

from torch import nn

from ..options import ConfigError, Problem
from .split import device_map


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def check_shardable(model: nn.Module) -> None:
    """A ConfigError when FSDP cannot take this model (before any process starts)."""
    if device_map(model) is not None:
        raise ConfigError([Problem("strategy", "fsdp",
                                   "cannot shard a model split across devices (nbtrain.split); FSDP shards one "
                                   "whole model over the ranks: undo the split, or use strategy=ddp")])


def shard(model: nn.Module, device_type: str, world_size: int) -> list[str]:
    """Shard `model` in place over all ranks (once); returns the blocks sharded as units."""
    if is_sharded(model):
        return []
    check_shardable(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from .toggles import checkpoint_targets

    mesh = init_device_mesh(device_type, (world_size,))
    blocks = checkpoint_targets(model, "auto")
    for name in blocks:
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    return blocks


def full_state_dict(model: nn.Module, everyone: bool = False) -> dict:
    """The whole model's weights on the CPU, gathered from the shards (a collective: every rank calls it).

    Only rank 0 receives them unless `everyone` (e.g. the first rank of every node).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=not everyone))
    return {k: v.detach().cpu() for k, v in state.items()}
