"""One module says when a verdict is withheld (measure/withheld.py): every kind comes from real readings as a
record (kind, the numbers read, the words), its words are those users read before the record existed, the
table, the panel and the plot read the record, and no other module of nbtrain decides a withholding."""
import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import nbtrain
from nbtrain import TrainConfig
from nbtrain.measure.ab import ABResult
from nbtrain.measure.device_rates import Rate
from nbtrain.measure.load import Load
from nbtrain.measure.verdict import UNMEASURED, Verdict, paired
from nbtrain.measure.withheld import KINDS, Withheld
from nbtrain.metrics import MetricsLog
from nbtrain.runs.apart import against, footnotes
from nbtrain.runs.result import RunResult, summarize

from architecture import import_graph, modules
from test_headlines import reading

PACKAGE = Path(nbtrain.__file__).parent
HOME = "nbtrain.measure.withheld"


# --- the record ------------------------------------------------------------------------------------------

def test_a_record_is_frozen_and_its_kind_is_one_of_a_closed_vocabulary():
    held = Withheld("noisy", "too noisy to tell (95% interval 0.60-1.40)", (("low", 0.6), ("high", 1.4)))
    assert held.number("low") == 0.6 and str(held) == held.words == held.short()
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.kind = "few_pairs"
    with pytest.raises(ValueError, match=r"Withheld kind='loud': allowed are unmeasured, few_measurements, .*"):
        Withheld("loud", "a reason")


# --- each kind, from readings, in the words users read before the record existed -----------------------------
# (every string below is what the code before withheld.py printed for the same readings)

def _aa(rates_a, rates_b) -> Verdict:
    """ab's verdict for one config against itself, from its paired blocks' rates."""
    return ABResult(TrainConfig(), TrainConfig(), UNMEASURED, rates_a=rates_a, rates_b=rates_b).judged()


VERDICTS = [  # (kind, verdict from block rates, its line, its table cell, a number the rule read)
    ("unmeasured", lambda: paired([], []), "not measured", "-", None),
    ("few_measurements", lambda: paired([100.0], [110.0]), "1.10x, too few measurements to tell",
     "1.10x, too few steps to tell", ("ratio", 1.1)),
    ("few_pairs", lambda: paired([100, 101, 99], [100, 110, 95]),
     "too few pairs to tell (3 pairs of blocks; an interval needs 4)", "too few pairs to tell (3 of 4)", ("pairs", 3)),
    ("noisy", lambda: paired([100] * 5, [60, 150, 90, 140, 80]), "too noisy to tell (95% interval 0.61-1.58)",
     "too noisy to tell (0.61-1.58)", ("pairs", 5)),
    ("one_config", lambda: _aa([100, 101, 99, 100, 102], [101, 100, 100, 99, 101]),
     "A/A check, one config against itself: no speed verdict; its paired blocks read 0.98-1.01 of each other (95% "
     "interval), this machine's noise between blocks",
     "A/A check: its paired blocks read 0.98-1.01 of each other (95% interval), this machine's noise between blocks",
     ("pairs", 5)),
    ("one_config", lambda: _aa([100], [101]), "A/A check, one config against itself: no speed verdict; too few pairs "
     "to show the machine's noise", "A/A check: too few pairs to show the machine's noise", ("pairs", 1)),
]


@pytest.mark.parametrize("kind,verdict,line,cell,number", VERDICTS, ids=[v[0] for v in VERDICTS])
def test_a_verdicts_interval_withholds_it_in_one_record_with_the_words_it_always_had(kind, verdict, line, cell, number):
    v = verdict()
    held = v.withheld
    assert held.kind == kind and held.words == line and held.short() == cell
    assert v.text() == line and v.text("b") == f"b: {line}" and v.short() == cell
    if number is not None:
        assert held.number(number[0]) == pytest.approx(number[1], rel=1e-3)


def test_a_verdict_that_says_faster_slower_or_no_measurable_difference_is_not_withheld():
    for a, b, words in [([100, 101, 99, 100], [130, 131, 129, 130], "1.30x faster (95% interval 1.30-1.30)"),
                        ([130, 131, 129, 130], [100, 101, 99, 100], "1.30x slower (95% interval 1.30-1.30)"),
                        ([100, 101, 99, 100], [100, 100.5, 99.5, 101], "no measurable difference (0.99-1.01)")]:
        v = paired(a, b)
        assert v.withheld is None and v.text() == words


def test_ab_pairs_a_burst_hit_are_set_aside_in_a_record_and_its_line_says_so_as_before():
    quiet, burst = Load(0.05, 2, 0.25, own_cores=1.8), Load(1.0, 2, 0.25, own_cores=1.0)
    result = ABResult(TrainConfig(), TrainConfig(batch_size=64), UNMEASURED, rates_a=[100, 101, 99, 100],
                      rates_b=[120, 121, 119, 60], loads_a=[quiet] * 4, loads_b=[quiet] * 3 + [burst], seconds=3.0)
    result.verdict = result.judged()
    from nbtrain.measure.withheld import set_aside
    held = set_aside(result.comparable())
    assert held.kind == "set_aside" and (held.number("set_aside"), held.number("pairs")) == (1, 4)
    assert result.text() == ("batch_size=64: 1.20x faster (95% interval 1.20-1.20) [3 pairs of blocks, 3 s; 1 of 4 "
                             "pairs set aside: other processes took more of the machine during one of their blocks]")


CEILINGS = [  # (kind, the simulated reading's changes, the words its verdict said before)
    ("noisy", dict(spread=0.4), "the model alone read 14,400-33,600 samples/s (95% interval)"),
    ("unsteady_machine", dict(peaks=(Rate(5e10, 4.9e10, 5.1e10), Rate(2e10, 1.9e10, 2.1e10))),
     "the matmul peak read 50 GFLOP/s before the model and 20 GFLOP/s after it: the machine's load changed while it "
     "was read"),
    ("noisy", dict(host_share=Rate(3.0, 0.64, float("inf"))),
     "the ratio that chose the host ceiling reads 0.64-inf (95% interval)"),
    ("busy_machine", dict(model_load=Load(1.5, 2, 1.0, own_cores=1.0)),
     "while the model alone was read, other processes took 1.5 of 2 cores"),
    ("busy_machine", dict(model_load=Load(0.1, 2, 1.0, own_cores=1.0, waited_cores=0.5)),
     "while the model alone was read, other processes took 0.1 of 2 cores, and its threads waited 0.5 s a second "
     "for a free CPU"),
]


@pytest.mark.parametrize("kind,changes,words", CEILINGS, ids=[c[0] for c in CEILINGS])
def test_ceilings_the_load_moved_name_no_ceiling_and_say_why_in_one_record(kind, changes, words):
    load = changes.pop("model_load", None)
    c = dataclasses.replace(reading(model=24_000.0, compute=25_864.0, memory=60_000.0, **changes), model_load=load)
    b = c.bottleneck()
    assert b.state == "noisy" and b.withheld.kind == kind and b.withheld.words == words
    assert c.verdict == f"too noisy to tell: {words}; read the ceilings again on a quieter machine"


def _run(seconds, name, workload=None, seed=0, steps=300, load=None) -> RunResult:
    """A run of `steps` steps lasting about `seconds` each (its summary made the way a real run's is)."""
    durations = seconds * (1 + 0.01 * np.random.default_rng(seed).standard_normal(steps))
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 1}, "info": {"samples_start": 0}})
    rows = list(range(1, steps + 1))
    log.emit({"type": "steps", "rows": {"step": rows, "samples": [64 * s for s in rows], "loss": [1.0] * steps,
                                        "time": np.cumsum(durations).tolist(), "lr": [0.1] * steps}})
    summary = summarize(log, {}).replace(workload=workload, **({"load": load} if load else {}))
    return RunResult(TrainConfig(batch_size=64), log, summary, name=name)


RUNS = [  # (kind, the runs, the "vs first" cell as it read before; each a real comparison's own reading)
    ("short", lambda: [_run(0.001, "a", steps=30), _run(0.00135, "b", seed=1, steps=30)],
     "too short to compare (a: 30 ms of steady steps)"),
    ("same_settings", lambda: [_run(0.01, "a", "w1"), _run(0.012, "b", "w1", seed=1)],
     "same settings (A/A): 0.83x (0.83-0.84)"),
    ("apart", lambda: [_run(0.01, "a", "w1"), _run(0.07, "b", "w1", seed=1)],
     "the same settings as far as nbtrain can read, yet 7.0x apart: something it cannot read differs"),
    ("within_spread", lambda: [_run(0.010, "a", "w1"), _run(0.0115, "b", "w2", seed=1),
                               _run(0.010 / 1.2, "a again", "w1", seed=2)],
     "within the machine's own spread (2 runs of one's settings read up to 1.20x apart)"),
    ("busy_machine", lambda: [_run(0.010, "a", load=Load(0.05, 2, 3.0, own_cores=1.8)),
                              _run(0.015, "b", seed=1, load=Load(1.0, 2, 4.5, own_cores=1.0))],
     "the machine was busier during b (other processes took 1.0 of 2 cores): the difference may be the machine's"),
    ("busy_machine", lambda: [_run(0.010, "a", load=Load(0.05, 2, 3.0, own_cores=1.8)),
                              _run(0.015, "b", seed=1, load=Load(0.05, 2, 4.5, own_cores=1.0, waited_cores=0.9))],
     "the machine was full during b (other processes took 0.1 of 2 cores, and its threads waited 0.9 s a second for "
     "a free CPU): the difference may be the machine's"),
]


@pytest.mark.parametrize("kind,runs,cell", RUNS, ids=[r[0] for r in RUNS])
def test_runs_taken_apart_get_one_record_of_why_their_verdict_is_withheld(kind, runs, cell):
    runs = runs()
    from nbtrain.runs.repeats import evidence
    labelled = [(run.name, run) for run in runs]
    reading_ = against(labelled[0], labelled[1], evidence(runs))
    assert reading_.held.kind == kind and reading_.withheld is reading_.held and reading_.cell == cell
    # a table says once below it what the kind means (a load needs no note: its cell says whose load)
    assert footnotes([reading_]) == ([reading_.held.note] if kind != "busy_machine" else [])


def test_the_table_notes_and_plot_read_the_records_and_the_words_are_as_before(tmp_path):
    import matplotlib.colors as colors
    from nbtrain.runs.compare import WITHHELD_COLOR
    runs = [_run(0.010, "a", "w1"), _run(0.0115, "b", "w2", seed=1), _run(0.010 / 1.2, "a again", "w1", seed=2),
            _run(0.02, "slow", "w3", seed=3)]
    comparison = nbtrain.compare(*runs, store=tmp_path / "runs.sqlite")
    cells = [row["vs first"] for row in comparison.rows]
    assert cells[1:3] == ["within the machine's own spread (2 runs of one's settings read up to 1.20x apart)",
                          "same settings (A/A): 1.20x (1.20-1.20)"]
    assert cells[3].endswith(")") and "x (" in cells[3]  # a verdict given: the spread of a's repeats is known
    assert comparison.notes == [
        "same settings (A/A): both runs trained the same code and data with the same config, so how far apart their "
        "speeds read is how much the machine moved between them, not a difference of settings",
        "within the machine's own spread: runs of the same settings have read that far apart on this machine, so the "
        "difference may be the machine's; nbtrain.ab alternates the two"]
    # under each bar its cell; a withheld one in grey, a verdict in the figure's own colour
    rate_ax = next(ax for ax in comparison.figure.axes if ax.get_title() == "throughput")
    shade = [colors.to_hex(text.get_color()) for text in rate_ax.get_xticklabels()]
    assert shade[1] == shade[2] == colors.to_hex(WITHHELD_COLOR) and shade[0] == shade[3] != shade[1], shade


def test_a_walks_race_whose_leader_straddles_the_bar_is_undecided_in_a_record_the_walk_reads():
    from nbtrain.walk.walker import run_walk
    from landscapes import LANDSCAPES
    from simulated_machine import SimulatedMachine
    noisy = dataclasses.replace(LANDSCAPES[5], name="noisy", noise=0.12, drift=0.06)  # a shared machine's noise
    walk = run_walk(m := SimulatedMachine(noisy, seed=0), budget_s=60, clock=m.clock)
    held = [item for item in walk.items if item.withheld is not None]
    assert held, walk.table()
    for item in held:
        w = item.withheld
        assert w.kind == "undecided" and item.note == w.words and w.words == f"too noisy to tell: {w.cell}"
        assert w.number("low") <= w.number("bar") < w.number("high") and w.number("ratio") > w.number("bar")
        assert "blocks varied most" in w.cell and item.verdict_text().count("too noisy to tell") == 1, \
            item.verdict_text()


def test_every_kind_of_the_vocabulary_is_produced_by_a_reading_above():
    produced = {case[0] for case in VERDICTS + CEILINGS + RUNS} | {"set_aside", "undecided"}
    assert produced == set(KINDS)


def test_the_panel_reads_the_records_words_as_before():
    pytest.importorskip("ipywidgets")
    from nbtrain.notebook.panel_runs import RunRecord
    from nbtrain.notebook.panel_views import comparison_text
    runs = [_run(0.010, "a", load=Load(0.05, 2, 3.0, own_cores=1.8)),
            _run(0.015, "b", seed=1, load=Load(1.0, 2, 4.5, own_cores=1.0))]
    text = comparison_text([RunRecord(n + 1, run.config, run.log, "completed", run) for n, run in enumerate(runs)])
    assert text == ("<div style='font-size:12px;line-height:1.4;white-space:normal'>#2 vs #1: the same config: the "
                    "machine was busier during #2 (other processes took 1.0 of 2 cores): the difference may be the "
                    "machine&#x27;s<br>runs measured at different times; nbtrain.ab(...) measures two configs in "
                    "alternation</div>")


# --- no other module decides a withholding ---------------------------------------------------------------

# The rules' names (the predicates that lived in six places: verdict.py, load.py, runs/apart.py, runs/repeats.py,
# ABResult.set_aside, Ceilings.noise) and their thresholds: defined in withheld.py and nowhere else.
RULES = {"undecided", "noise", "noise_text", "set_aside", "comparable_pairs", "could_move", "explains",
         "cores_explain", "waits_explain", "explains_by_windows", "covers", "too_short", "busier_machine",
         "within_spread", "beyond_machine", "between_runs", "of_verdict", "of_ceilings"}
THRESHOLDS = {"TOO_WIDE", "FEWEST_PAIRS", "APART_MIN_S", "BEYOND_LOADED"}
# The words a withholding says: written by withheld.py alone, so no other module writes, or reads back, a reason.
WORDS = ("too few pairs to tell", "too few measurements to tell", "too few steps to tell", "too noisy to tell (",
         "pairs set aside", "too short to compare", "the machine was", "within the machine's own spread",
         "same settings (A/A)", "the same settings as far as nbtrain can read", "A/A check: ", "A/A check, one",
         "blocks varied most")
# Who asks it: the verdict (its own interval), ab (its pairs), the bottleneck (the ceilings' readings), the
# comparison of runs taken apart (runs/apart.py; runs/repeats.py for runs alike yet apart) and the walk (a race's
# undecided leader; its result reads the record).
ASKERS = {"nbtrain.measure.verdict", "nbtrain.measure.ab", "nbtrain.measure.bottleneck", "nbtrain.runs.apart",
          "nbtrain.runs.repeats", "nbtrain.walk.walker", "nbtrain.walk.result"}


def _strings(tree) -> list[tuple[int, str]]:
    """Every string constant a module's code writes (docstrings left out: they explain, they decide nothing)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_no_module_but_withheld_defines_a_rule_names_a_threshold_or_writes_a_reason():
    found = []
    for name, path in modules(PACKAGE).items():
        if name == HOME:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in RULES:
                found.append(f"{name}:{node.lineno} defines {node.name}")
            if isinstance(node, ast.Name) and node.id in THRESHOLDS or \
                    isinstance(node, ast.alias) and node.name in THRESHOLDS:
                found.append(f"{name}:{getattr(node, 'lineno', '?')} names {getattr(node, 'id', None) or node.name}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Withheld":
                found.append(f"{name}:{node.lineno} builds a Withheld")
        found += [f"{name}:{line} writes {text!r}" for line, text in _strings(tree)
                  if any(words in text for words in WORDS)]
    assert not found, "\n".join(found)


def test_the_modules_that_ask_withheld_are_the_verdict_ab_the_bottleneck_the_comparison_of_runs_and_the_walk():
    graph = import_graph(PACKAGE)
    assert {module for module, targets in graph.items() if HOME in targets} == ASKERS
    # the table, the panel and the plot read the comparison's record (runs/apart.Against), never a rule
    assert "nbtrain.runs.apart" in graph["nbtrain.notebook.panel_views"] and "nbtrain.runs.apart" in \
        graph["nbtrain.runs.compare"]
