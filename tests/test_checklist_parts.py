"""The walk's parts fit together: each bench is the Bench the walk is declared against (walk/bench.py), and each
item's `answers` are remedies the bottleneck names (measure/bottleneck.py), every such remedy answered by an item
or said to be none."""
import inspect
import typing

import pytest

from nbtrain import TrainConfig
from nbtrain.api import engine_for
from nbtrain.demo import digits_recipe
from nbtrain.measure.bottleneck import bottleneck
from nbtrain.walk.bench import Bench, EngineBench, Here
from nbtrain.walk.items import NOT_AN_ITEM, REGISTRY

from landscapes import LANDSCAPES
from simulated_machine import SimulatedMachine


def _members(protocol) -> tuple[set, dict]:
    """(the attributes a Protocol declares, its methods by name)."""
    methods = {name: value for name, value in vars(protocol).items()
               if inspect.isfunction(value) and not name.startswith("_")}  # Protocol's own hooks left out
    return set(typing.get_type_hints(protocol)), methods


def _unmet(obj, protocol) -> list[str]:
    """What `obj` lacks of `protocol`: each attribute missing, each method missing or taking other parameters."""
    attributes, methods = _members(protocol)
    out = [f"no attribute {name}" for name in sorted(attributes) if not hasattr(obj, name)]
    for name, declared in sorted(methods.items()):
        own = getattr(obj, name, None)
        if not callable(own):
            out.append(f"no method {name}")
            continue
        wanted = list(inspect.signature(declared).parameters)[1:]  # without self
        if list(inspect.signature(own).parameters) != wanted:
            out.append(f"{name}{inspect.signature(own)} is not {name}({', '.join(wanted)})")
    return out


def test_the_live_bench_and_the_simulated_machine_are_each_the_bench_the_walk_is_declared_against():
    attributes, methods = _members(Bench)
    assert {"here", "start", "device"} <= attributes and {"block", "trial", "bottleneck", "apart"} <= set(methods)
    machine = SimulatedMachine(LANDSCAPES[0])
    assert _unmet(machine, Bench) == [] and _unmet(machine.here, Here) == []
    live = engine_for(digits_recipe(), TrainConfig(batch_size=32, accelerator="cpu"))
    lent = live.trial()
    try:
        bench = EngineBench(lent)
        assert _unmet(bench, Bench) == [] and _unmet(bench.here, Here) == []
    finally:
        lent.close()

    class Partial:  # the check itself sees a missing method and one that takes other parameters
        here, start, device = machine.here, machine.start, "cpu"

        def block(self, config, seconds):
            return None
    unmet = _unmet(Partial(), Bench)
    assert "block(config, seconds) is not block(config, seconds, current)" in unmet and "no method trial" in unmet


def _remedies_named() -> set:
    """Every remedy the bottleneck names for the simulated machines' ceilings: each landscape at its start and
    at the configs that open the remaining remedies (the data loaded by a DataLoader without pinned memory)."""
    named = set()
    for land in LANDSCAPES:
        machine = SimulatedMachine(land)
        for config in (land.start, land.start.replace(preload_data=False, pin_memory=False, num_workers=0)):
            named |= {r.item for r in bottleneck(machine.ceilings(config, 0.1)).remedies}
    return named


def test_each_items_answers_are_remedies_the_bottleneck_names_and_each_remedy_is_an_items_answer_or_said_not_to_be():
    named = _remedies_named()
    answered = {answer: item.name for item in REGISTRY.values() for answer in item.answers}
    assert set(answered) <= named, "an item answers a remedy the bottleneck never names: the walk never reaches it"
    assert named - set(answered) == set(NOT_AN_ITEM), "a remedy no item races: add an item, or say why in NOT_AN_ITEM"
    assert all(item.answers for item in REGISTRY.values() if item.stage == "bottleneck"), \
        "an item tried along the bottleneck answers at least one remedy"
    assert {"batch_size", "num_workers", "preload_data", "precision", "compile"} <= named  # the machines were read


@pytest.mark.parametrize("stage", ["first", "last"])
def test_items_tried_off_the_bottleneck_answer_no_remedy(stage):
    # "first" (the GPU) and "last" (accumulation, DDP, checkpointing) run once, whatever binds: an answer there
    # would be read as one the path follows.
    assert all(not item.answers for item in REGISTRY.values() if item.stage == stage)
