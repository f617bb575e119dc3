"""One option vocabulary (nbtrain/options.py) for TrainConfig's fields and the tools' options: the same kinds
read values the same way, and what is allowed is written from the bounds in one place."""
import ast
from pathlib import Path

import pytest

import nbtrain
from nbtrain import TrainConfig
from nbtrain.config import options
from nbtrain.options import KINDS, ConfigError, Reject, allowed_text
from nbtrain.tools.registry import TOOLS

PACKAGE = Path(nbtrain.__file__).resolve().parent


def every_option():
    yield from (("config", name, option) for name, (option, _) in options().items())
    yield from ((tool.name, o.keyword, o) for tool in TOOLS.values() for o in tool.options)


def test_config_and_tools_speak_one_vocabulary():
    kinds = {(where, name): option.kind for where, name, option in every_option()}
    assert set(kinds.values()) <= set(KINDS), set(kinds.values()) - set(KINDS)
    # the same kind reads the same text the same way, in a config and in a tool
    config_whole, tool_whole = options()["batch_size"][0], TOOLS["find_lr"].option("steps")
    assert config_whole.kind == tool_whole.kind == "whole"
    assert config_whole.read("1_000") == tool_whole.reader("1_000") == 1000
    for bad in ("1.5", True, "ten"):
        with pytest.raises(Reject):
            config_whole.read(bad)
        with pytest.raises(Reject):
            tool_whole.reader(bad)
    # `names` means one thing: several of a fixed set (a config's submodule paths are `modules`)
    assert options()["activation_checkpointing"][0].kind == "modules"
    assert TOOLS["checklist"].option("items").kind == "names"


@pytest.mark.parametrize("kind, bounds, text", [
    ("whole", dict(low=1), "a whole number >= 1"),
    ("whole", dict(low=0, high=256), "a whole number from 0 to 256"),
    ("whole", dict(low=5, note="rates to try"), "a whole number >= 5 (rates to try)"),
    ("whole", dict(low=1, nullable=True, none="no early stopping"), "a whole number >= 1, or None (no early stopping)"),
    ("number", dict(above=0), "a number > 0"),
    ("number", dict(low=0, below=1, note="loss smoothing"), "a number in [0, 1) (loss smoothing)"),
    ("number", dict(above=0, high=0.1), "a number in (0, 0.1]"),
    ("number", dict(above=0, noun="a number of seconds", nullable=True), "a number of seconds > 0, or None"),
    ("whole_list", dict(low=0), "a list of whole numbers >= 0"),
    ("switch", dict(note="true needs num_workers >= 1"), "true or false (true needs num_workers >= 1)"),
    ("choice", dict(choices=("a", "b"), nullable=True), "one of a, b, or None"),
    ("names", dict(choices=("a", "b")), "each one of a, b"),
])
def test_what_is_allowed_is_written_from_the_bounds(kind, bounds, text):
    assert allowed_text(kind, **bounds) == text


def test_every_bounded_config_option_states_each_bound_refuses_past_it_and_takes_it():
    checked = 0
    for name, (option, _) in options().items():
        for bound, past in ((option.low, -1), (option.high, +1)):
            if option.kind not in ("whole", "number") or bound is None:
                continue
            assert str(int(bound)) in option.allowed, (name, option.allowed)
            assert option.read(bound) == bound
            with pytest.raises(Reject):
                option.read(bound + past)
            checked += 1
    assert checked >= 15


def test_a_config_value_past_a_bound_the_text_did_not_state_is_refused_with_the_bound():
    # prefetch_factor=2000 was refused with "a whole number >= 1": true of 2000, so no reason at all
    with pytest.raises(ConfigError) as error:
        TrainConfig(prefetch_factor=2000, num_workers=2)
    assert "prefetch_factor=2000: a whole number from 1 to 1024, or None" in str(error.value)
    with pytest.raises(ConfigError) as error:
        TrainConfig(base_batch_size=0)
    assert "base_batch_size=0: a whole number >= 1, or None" in str(error.value)  # None is allowed, and said


def test_no_module_imports_another_modules_private_name():
    crossings, modules = [], sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                crossings += [f"{path.relative_to(PACKAGE)}:{node.lineno} {alias.name}" for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not crossings, crossings
