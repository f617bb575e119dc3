"""A slot on a user's object that holds nbtrain's state for it and pickles or copies as empty.

nbtrain keeps per-model state (the live engine, a Lightning wrapper) on the model itself, so
it is freed with the model (a cycle the garbage collector handles), while copies of the model
and the pickles shipped to DDP workers carry none of it.
"""
from __future__ import annotations


class Slot:
    def __init__(self, value=None):
        self.value = value

    def __reduce__(self):
        return (Slot, ())

    def __deepcopy__(self, memo):
        return Slot()


# A model's live engine (api.engine_for sets it): what a later call, in this process or on ranks elsewhere, continues.
ENGINE = "_nbtrain_engine"


def held(obj, name: str):
    """What the slot `name` on `obj` holds, or None."""
    slot = obj.__dict__.get(name)
    return slot.value if slot is not None else None
