"""A tutorial's speed claim, checked where it can be shown.

A notebook's checks cell asserts what the notebook claims. A speed claim rests on a reading (an `nbtrain.ab`
head to head), and a reading beside other work can fail to show a claim that is true: a reader's busy laptop
must not end a tutorial in a red AssertionError for that. The reading's own load (measure/load.py: the cores
other processes took while it ran, and its threads' waits for a free CPU) says whether the machine was quiet:

- the claim holds: nothing to say;
- it fails on a quiet reading, or anywhere under CI (CI=true): AssertionError, the claim is false;
- it fails on a busy reading outside CI: "this machine is too busy to show the claim now: rerun when quieter
  (other processes took 1.6 of 2 cores)". Never another claim in its place.

An unknown load (a reading without one) is not a busy one: the claim is asserted.
"""
from __future__ import annotations

import os

from ..measure.load import Load

TOO_BUSY = "this machine is too busy to show the claim now"
CHECKS_PASSED = "all checks passed"
_not_shown: list[str] = []  # this kernel's claims a busy machine kept from being shown, for checks_done()


def in_ci() -> bool:
    """Whether a CI service runs this (they set CI=true): there every claim is proven, busy or not."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def load_of(reading) -> Load | None:
    """The load a reading ran under: a Load itself, a result's `.load` (nbtrain.ab's), or else its blocks' loads
    over their wall time (a tool's head to head keeps only those); None where unknown."""
    if isinstance(reading, Load):
        return reading
    if getattr(reading, "load", None) is not None:
        return reading.load
    blocks = [x for x in list(getattr(reading, "loads_a", ())) + list(getattr(reading, "loads_b", ()))
              if x is not None and x.wall_s > 0]
    if not blocks:
        return None
    wall = sum(x.wall_s for x in blocks)
    per_wall = lambda name: sum(getattr(x, name) * x.wall_s for x in blocks) / wall  # noqa: E731
    return Load(per_wall("other_cores"), blocks[0].cores, wall, own_cores=per_wall("own_cores"),
                waited_cores=per_wall("waited_cores"))


def claim(holds: bool, reading, what: str) -> bool:
    """Check the claim `what` that `reading` (a result with a `.load`) shows; see the module doc.

    Returns whether it was shown; raises AssertionError (with the reading's words) where it must hold."""
    if holds:
        return True
    load = load_of(reading)
    if in_ci() or load is None or load.small:
        raise AssertionError(f"{what}: {reading}")
    _not_shown.append(what)
    print(f"{TOO_BUSY} ({what}): rerun when quieter ({load.text()})")
    return False


def checks_done() -> str:
    """What a checks cell ends with: 'all checks passed', or which claims the machine was too busy to show."""
    if not _not_shown:
        return CHECKS_PASSED
    shown = "; ".join(_not_shown)
    _not_shown.clear()
    return (f"the other checks passed; {TOO_BUSY}: {shown} (rerun the notebook when the machine is quieter)")
