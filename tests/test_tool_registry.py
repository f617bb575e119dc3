"""The tool registry: each tool's options declared once; flags, panel fields and refusals follow from it."""
import dataclasses
import inspect
import os

import pytest
from IPython.core.error import UsageError

import nbtrain
from nbtrain.demo import digits_recipe
from nbtrain.notebook import panel_tools
from nbtrain.notebook.magic import build_parser
from nbtrain.options import ConfigError
from nbtrain.tools.registry import TOOLS
from nbtrain.tools.tool_options import ToolOptionError, ToolRefusal
from test_magic_tools import DIGITS  # the magic's demo cell

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def digits_ip(ip):
    ip.run_cell(DIGITS)
    return ip


@pytest.fixture
def panel(tmp_path, monkeypatch):
    monkeypatch.setenv("NBTRAIN_STORE", str(tmp_path / "runs.sqlite"))
    made = nbtrain.panel(digits_recipe(hidden=16), nbtrain.TrainConfig(accelerator="cpu"), display=False)
    yield made
    made.close()


def usage_error(shell, capsys, cell) -> str:
    result = shell.run_cell(cell)
    out = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError), (out.out, out.err)
    text = (out.out + out.err).strip()
    assert "Traceback" not in text
    return text.splitlines()[-1]


def test_the_public_tools_are_the_registered_ones_with_their_signatures_kept():
    public = {"profile": nbtrain.profile, "ceilings": nbtrain.ceilings, "forecast": nbtrain.forecast,
              "find_batch_size": nbtrain.tune.find_batch_size,
              "find_workers": nbtrain.tune.find_workers, "find_lr": nbtrain.tune.find_lr,
              "find_leaks": nbtrain.leaks.find_graph_leaks, "find_sync": nbtrain.leaks.find_sync_points,
              "checklist": nbtrain.checklist, "ab": nbtrain.ab, "cache": nbtrain.cache}
    assert {name: tool.function for name, tool in TOOLS.items()} == public
    for tool in TOOLS.values():
        parameters = inspect.signature(tool.function).parameters
        for option in tool.options:  # every declared option is a keyword with its default in the signature
            assert parameters[option.keyword].default == tool.defaults[option.keyword]
            assert option.reader(tool.defaults[option.keyword]) == tool.defaults[option.keyword]


def test_every_registered_tool_and_option_with_a_flag_is_a_magic_flag_with_the_registrys_help():
    actions = {a.dest: a for a in build_parser()._actions}
    for name, tool in TOOLS.items():
        if not tool.magic:
            assert name not in actions
            continue
        assert actions[name].option_strings == ["--" + name.replace("_", "-")]
        assert actions[name].help == tool.help.replace("%", "%%")
        for option in tool.options:
            if option.flag:
                flag = actions[option.flag]
                assert flag.option_strings == ["--" + option.flag.replace("_", "-")]
                assert option.help.replace("%", "%%") in flag.help and f"--{name.replace('_', '-')}" in flag.help


def test_a_tool_declared_with_another_option_gets_its_flag_without_touching_the_magic(monkeypatch):
    find_leaks = TOOLS["find_leaks"]
    extra = dataclasses.replace(find_leaks.options[0], keyword="warmup", flag="leak_warmup", help="steps before watching")
    monkeypatch.setitem(TOOLS, "find_leaks", dataclasses.replace(
        find_leaks, options=find_leaks.options + (extra,), defaults={**find_leaks.defaults, "warmup": 4}))
    flag = {a.dest: a for a in build_parser()._actions}["leak_warmup"]
    assert flag.option_strings == ["--leak-warmup"]
    assert flag.help == "--find-leaks: steps before watching (default 4)"


def test_every_panel_tool_has_a_button_and_every_panel_option_a_field_starting_at_its_default(panel):
    labelled = {name: tool for name, tool in TOOLS.items() if tool.label}
    assert {name: b.description for name, b in panel.tools.buttons.items()} == \
        {name: tool.label for name, tool in labelled.items()}
    declared = {o.keyword: (tool, o) for tool in labelled.values() for o in tool.options if o.panel}
    assert set(panel.tools.fields) == set(declared)
    for keyword, (tool, option) in declared.items():
        field = panel.tools.fields[keyword]
        start = tool.defaults[keyword] if option.panel_value is panel_tools.NO_VALUE else option.panel_value
        assert field.description == option.panel and field.value == start and option.help in field.tooltip


def test_a_bad_option_reads_the_same_in_python_the_magic_and_the_panel(digits_ip, capsys, panel):
    allowed = TOOLS["find_workers"].option("seconds").allowed
    with pytest.raises(ToolOptionError) as python:
        nbtrain.tune.find_workers(digits_recipe(hidden=16), seconds=0)
    assert isinstance(python.value, ConfigError) and python.value.problems[0].allowed == allowed
    assert str(python.value) == f"nbtrain.tune.find_workers: seconds=0: allowed: {allowed}"

    assert usage_error(digits_ip, capsys, "%nbtrain --find-workers --seconds 0") == \
        f"UsageError: %%nbtrain: --seconds 0: allowed: {allowed}"

    panel.tools.fields["seconds"].value = 0
    panel.tools.buttons["find_workers"].click()
    assert panel.status_text == f"Find workers: s per worker setting 0.0: allowed: {allowed}"
    assert not panel.running


def test_every_problem_with_a_tools_options_is_listed_in_one_typed_error():
    with pytest.raises(ToolOptionError) as caught:
        nbtrain.checklist(digits_recipe(hidden=16), budget_s=0, items="workers,magic", min_gain=2, clock=5.0)
    assert [p.option for p in caught.value.problems] == ["budget_s", "items", "min_gain", "clock"]
    assert "\n" not in str(caught.value) and str(caught.value).startswith("nbtrain.checklist: budget_s=0: allowed: ")


def test_flag_values_are_read_as_the_tool_reads_python_values():
    tool = TOOLS["find_batch_size"]
    assert tool.read({"memory_budget": "2GB", "max_batch": "128", "rule": "SQRT"}) == \
        {"memory_budget": 2 * 10**9, "max_batch": 128, "rule": "sqrt"}
    assert TOOLS["find_workers"].read({"candidates": "0, 1,2"}) == {"candidates": [0, 1, 2]}
    assert TOOLS["checklist"].read({"items": "preload-data,workers"}) == {"items": ("preload_data", "workers")}


def _refusing(monkeypatch, name, error):
    def tool(**_kwargs):  # a tool in this file: neither its frames nor its message say "nbtrain"
        raise error
    monkeypatch.setitem(TOOLS, name, dataclasses.replace(TOOLS[name], function=tool))


def test_a_tools_refusal_is_told_apart_by_its_type_not_its_text_or_frames(digits_ip, capsys, monkeypatch):
    refusal = ToolRefusal(lambda spell: f"nothing to sweep; raise {spell('end_lr', 100)}")
    _refusing(monkeypatch, "find_lr", refusal)
    assert usage_error(digits_ip, capsys, "%nbtrain --find-lr") == \
        "UsageError: %%nbtrain: --find-lr: nothing to sweep; raise --end-lr 100"
    # A RuntimeError whose text looks like a refusal is not one: it is shown as the error it is.
    _refusing(monkeypatch, "find_lr", RuntimeError("nbtrain.find_lr: looks like a verdict"))
    result = digits_ip.run_cell("%nbtrain --find-lr")
    capsys.readouterr()
    assert type(result.error_in_exec) is RuntimeError


def test_the_panel_tells_a_refusal_from_a_failure_by_type(panel, monkeypatch):
    _refusing(monkeypatch, "profile", ToolRefusal(lambda spell: "no step finished"))
    panel.tools.buttons["profile"].click()
    assert panel.wait(30)
    assert panel.status_text == "Bottleneck breakdown: no step finished" and panel.errors == []
    _refusing(monkeypatch, "profile", RuntimeError("nbtrain.profile: looks like a verdict"))
    panel.tools.buttons["profile"].click()
    assert panel.wait(30)
    assert panel.status_text == "Bottleneck breakdown failed: RuntimeError: nbtrain.profile: looks like a verdict"
    assert len(panel.errors) == 1  # a failure keeps its traceback


def test_a_refusal_from_python_names_the_tool_and_its_options_as_keywords():
    with pytest.raises(ToolRefusal) as caught:
        nbtrain.checklist(digits_recipe(hidden=16), budget_s=0.5, clock=iter(range(0, 10**6, 1000)).__next__)
    assert str(caught.value) == ("nbtrain.checklist: budget_s=0.5 left no time to measure the starting config "
                                 "against one candidate for 3 rounds; allow more (e.g. budget_s=30)")
