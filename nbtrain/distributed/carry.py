"""What a DDP call carries across calls: the kernel's live engine goes to the ranks and comes back.

A second `fit(..., devices=2)` (or `%%nbtrain --devices 2` cell) continues the first as one longer
call would, and a DDP call continues a call trained in the kernel (and the other way round): the
kernel's live engine is the one place its training lives between calls, whichever process trained.

    kernel_config(config, model, live)  the config of the kernel's engine for a DDP call: one
                              process, the same global batch, where the live engine or the model is
    sent(engine)              the kernel's engine state (optimizer, schedule, scaler, position, random
                              numbers), the weights left out (they travel in the recipe)
    FirstCall(config, make)   a call on a model the kernel holds no engine of: none is built before the
                              ranks start; they get one seed and the kernel's random numbers (.state), and
                              the kernel's engine is made (.make) once they completed, to continue theirs
    take_up(engine, state)    a rank's Engine continues from it (before its run)
    gathered(engine)          after the run, on every rank (a collective): the state each node's first
                              rank writes back
    bring_back(engine, state) the kernel's engine continues from the ranks' run (and what to say of it)

What each piece means across a rank count, with no guess:
- optimizer, schedule and gradient scaler: DDP keeps them equal on every rank; rank 0's come back.
- the data position is counted in samples of the epoch's global order (the sampler deals that order
  round-robin to the ranks, a stream its items too): N ranks at their sample k stand at sample N*k.
  A run on M ranks continues at sample g as g/M each; where g is not a multiple of M, it starts at the
  multiple below, and its summary says how many samples are read again.
- random numbers are each process's own. Every rank of a run continues its own stream where the last
  run had as many ranks and the kernel still stands where they left it (the same step, and its random
  numbers still rank 0's: nothing trained, drew or was put back since); otherwise every rank starts from
  the kernel's (as every rank of a fresh run starts from one seed), and where the last run had other ranks
  than this one the summary says so. The kernel continues from rank 0's.
- strategy=fsdp shards the optimizer state over the ranks: nothing but the weights carries over, and
  the summary says so.
"""
from __future__ import annotations

import random
import weakref

import torch
import torch.distributed as torch_dist

from ..engine.state import rng_kept, rng_state, set_rng_state
from ..engine.support import seed_torch
from ..slots import ENGINE, held

# The kernel's engine -> what only the ranks of the DDP run it last continued from hold: {"step": the
# engine's step when they came back, "rngs": each rank's random-number state (rank 0's is the kernel's
# then), "scaler": their gradient scaler's (a kernel engine off CUDA has none)}.
_RANK_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

FSDP_NOTE = ("strategy=fsdp: only the weights carry over to the next call (the sharded optimizer state, "
             "schedule and data position start afresh in each fsdp call)")


def live_engine(model):
    """The kernel's live engine of `model` (the one its next call continues), or None; one that is
    running now (another thread's call) is not continued."""
    engine = held(model, ENGINE)
    return engine if engine is not None and not engine.running else None


def kernel_config(config, model, live=None):
    """The config of the kernel's engine for a DDP call of `config` on `model`: one process training the
    same global batch, so the LR rule gives it the ranks' rates and its position counts the same samples.

    A live engine `live` stays as it is, where it is. A new one holds the call's state where the model
    already is, without holding the data: a DDP call must not move the model, copy it onto a GPU its
    ranks train on, or read the whole data set into the kernel (16-mixed, a CUDA-only precision, is
    kept in 32 bits off CUDA; the ranks' gradient scaler is then kept for them)."""
    if live is not None:
        held = {"accelerator": live.config.accelerator, "preload_data": live.config.preload_data}
    else:
        held = {"accelerator": next((p.device.type for p in model.parameters()), "cpu"), "preload_data": False}
    # resume: the ranks resume from the checkpoint; the kernel's engine then continues from them.
    kernel = config.replace(devices=1, num_nodes=1, node_rank=None, strategy="auto", resume=None,
                            batch_size=config.batch_size * config.world_size, **held)
    if kernel.precision == "16-mixed" and kernel.device_type != "cuda":
        kernel = kernel.replace(precision="32-true")
    return kernel


def sent(engine) -> dict:
    """The kernel engine's state for the ranks: its own (one process), and what only the ranks hold where
    they still continue it (the engine has not trained since they came back)."""
    state = {k: v for k, v in engine.state_dict().items() if k != "model"}  # the weights are in the recipe
    ranks = _RANK_STATES.get(engine)
    if ranks is not None and ranks["step"] != engine.step:
        ranks = None  # the kernel trained since
    untouched = ranks is not None and torch.equal(torch.get_rng_state(), ranks["rngs"][0]["torch"])
    state["rank_rngs"] = ranks["rngs"] if untouched else None  # else something drew or put numbers back since
    state["from_world"] = len(ranks["rngs"]) if ranks is not None else 1
    if not state["scaler"] and ranks is not None:  # a disabled scaler saves nothing
        state["scaler"] = ranks["scaler"]
    return state


class FirstCall:
    """The kernel's side of a DDP call on a model it holds no live engine of. A kernel engine built then would only
    carry a fresh engine's state, which every rank's own engine already is, but for two things the ranks cannot
    draw alone: one data order (the config's seed, else one drawn here for all) and one stream of random numbers
    (the kernel's, seeded as an engine seeds them), so unseeded ranks agree. `state` is those two; the kernel's
    own random numbers are left as they were. `make()` makes the kernel's live engine after the ranks completed,
    which their state then continues (bring_back), as an engine built before them would."""

    def __init__(self, config, make):
        with rng_kept():
            seed = config.seed if config.seed is not None else random.randrange(2**31)
            if config.seed is not None:
                seed_torch(config.seed)  # as Engine.__init__ seeds the process that builds it
            self.state = {"first": True, "seed": seed, "rng": rng_state()}
        self.make = make


def take_up(engine, state: dict) -> None:
    """Continue `engine` (this rank's, before its run) from the kernel's `state` (see the module's rules)."""
    if state.get("first"):  # FirstCall: this rank's fresh engine, on the run's one seed and random numbers
        engine.set_position({**engine.position(), "seed": state["seed"]})
        set_rng_state(state["rng"])
        return
    world = engine.world
    position = dict(state["position"])
    total = position["epoch_offset"]  # samples of the epoch's global order already used
    position["epoch_offset"], behind = divmod(total, world.size)
    rngs, before = state["rank_rngs"], state["from_world"]
    rng = rngs[world.rank] if rngs and len(rngs) == world.size else state["rng"]
    engine.load_state_dict({**state, "model": engine.model.state_dict(), "rng": rng, "position": position})
    if behind:
        engine.note("data position", f"data position: the last call stopped at sample {total:,} of epoch "
                    f"{position['epoch']}'s order, not a multiple of {world.size} ranks: this run starts at sample "
                    f"{total - behind:,} ({behind} sample(s) read again)")
    if before > 1 and before != world.size:
        engine.note("random numbers", f"random numbers: the last call ran {before} ranks, this one {world.size}: "
                    "every rank starts from the kernel's random numbers")


def gathered(engine) -> dict:
    """The state to bring back, the same on every rank (a collective: every rank calls it; each node's
    first rank writes it for its kernel)."""
    world = engine.world
    parts = [None] * world.size
    torch_dist.all_gather_object(parts, (rng_state(), engine.epoch_offset))
    offsets = sorted({offset for _, offset in parts})
    state = {k: v for k, v in engine.state_dict().items() if k != "model"}
    state["position"]["epoch_offset"] = offsets[0] * world.size
    state["rank_rngs"] = [rng for rng, _ in parts]
    # The ranks step together, so they stand at the same sample of their share; were they ever not,
    # the next call would start at the earliest, and says so rather than choose one rank's.
    state["notes"] = [] if len(offsets) == 1 else [
        f"data position: the ranks stopped at different samples of their share of the epoch ({offsets}); the "
        f"next call starts at the earliest"]
    return state


def bring_back(engine, state: dict) -> list[str]:
    """The kernel's `engine` continues from the ranks' `state` (its weights already loaded); returns what
    the run's summary should say of it."""
    engine.load_state_dict({**state, "model": engine.model.state_dict(), "rng": state["rank_rngs"][0]})
    _RANK_STATES[engine] = {"step": engine.step, "rngs": state["rank_rngs"], "scaler": state["scaler"]}
    return state["notes"]
