"""The engine side never imports Jupyter; the demo runs from the command line; the architecture rules hold:
no import cycles, no module over 500 lines unless its first line says why it is one idea, nothing outside the engine uses its private names."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from architecture import (MAX_LINES, ONE_IDEA, cycles, one_idea_modules, engine_private_names, floor_of, import_graph, long_modules,
                          reaches_into_engine, sets_engine_fields, upward_imports)


def test_engine_modules_import_neither_ipython_nor_ipywidgets():
    code = ("import sys, nbtrain, nbtrain.engine.loop, nbtrain.config, nbtrain.recipe, nbtrain.engine.data, nbtrain.engine.dist, "
            "nbtrain.engine.precision, nbtrain.demo, nbtrain.api, nbtrain.progress, nbtrain.plotting\n"
            "import importlib.util\n"
            "for name in ('nbtrain.distributed.launch', 'nbtrain.distributed.worker', 'nbtrain.slurm', 'nbtrain.tools.diagnose', 'nbtrain.tools.tune',"
            " 'nbtrain.walk.tool', 'nbtrain.runs.store'):\n"
            "    if importlib.util.find_spec(name): __import__(name)\n"
            "if importlib.util.find_spec('ray'): __import__('nbtrain.distributed.launchers.ray')  # the extra, where installed\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'ipykernel')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_nbtrain_leaves_scipy_stats_unimported_and_its_t_quantile_is_scipy_stats_own():
    # Every kernel, DDP zygote and rank imports nbtrain: scipy.stats took ~0.4 s of each start for one quantile,
    # which scipy.special.stdtrit gives (scipy.stats' t.ppf calls it).
    code = ("import sys, nbtrain, nbtrain.measure.race, nbtrain.measure.forecast, nbtrain.distributed.worker\n"
            "assert 'scipy.stats' not in sys.modules, 'importing nbtrain imported scipy.stats'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    from scipy import stats
    from scipy.special import stdtrit
    assert [float(stdtrit(df, 0.975)) for df in range(1, 200)] == [float(stats.t.ppf(0.975, df)) for df in range(1, 200)]


@pytest.mark.slow
def test_the_demo_trains_prints_a_summary_and_writes_a_loss_plot(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nbtrain", "demo", "--max-epochs", "3", "--quiet",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for label in ("samples/s", "total time", "peak memory", "loss first -> last", "held-out loss / accuracy"):
        assert label in done.stdout
    png = tmp_path / "nbtrain-demo-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_bad_demo_flag_is_one_line_naming_flag_value_and_allowed():
    done = subprocess.run([sys.executable, "-m", "nbtrain", "demo", "--batch-size", "0", "--precision", "fp8"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--precision=fp8: one of 32-true" in done.stderr
    assert "--batch-size=0: a whole number from 1" in done.stderr
    assert "Traceback" not in done.stderr


# --- the architecture rules (ARCHITECTURE.md), read from the source's syntax trees: architecture.py ---

PACKAGE = Path(__file__).resolve().parent.parent / "nbtrain"


def test_no_import_cycles_not_even_through_imports_inside_functions():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and sum(map(len, graph.values())) > 200  # the whole package was read
    assert cycles(graph) == [], "import cycles (each a path back to its start)"


# The house's floors, lowest first (ARCHITECTURE.md's picture): a module imports only from its own floor and
# the floors below it, never from one above. A prefix names a module or a package with all its modules; the
# longest prefix wins (tools.trial sits below the other tools, the registry above them).
FLOORS = [
    ("config", ("nbtrain.options", "nbtrain.hardware", "nbtrain.monitored", "nbtrain.config", "nbtrain.format",
                "nbtrain.metrics", "nbtrain.places", "nbtrain.slots", "nbtrain.user_loader", "nbtrain.recipe",
                "nbtrain.flags", "nbtrain.doctor", "nbtrain.demo", "nbtrain.version")),
    # A record of a run carries its measured numbers (a steady rate, the machine's load), and the figures of
    # both are drawn by plotting: the records share the numbers' floor.
    ("measure and records", ("nbtrain.measure", "nbtrain.records", "nbtrain.plotting", "nbtrain.progress")),
    ("run records", ("nbtrain.runs",)),
    ("engine", ("nbtrain.engine", "nbtrain.adapters")),
    ("launchers", ("nbtrain.distributed",)),
    ("session", ("nbtrain.api", "nbtrain.session", "nbtrain.slurm")),
    ("trial", ("nbtrain.tools.trial", "nbtrain.tools.tool_options", "nbtrain.tools.failure_causes")),
    ("tools and the walk", ("nbtrain.tools", "nbtrain.walk")),
    ("registry", ("nbtrain.tools.registry",)),
    ("front-ends", ("nbtrain.notebook", "nbtrain", "nbtrain.__main__")),
]


def test_no_floor_imports_from_a_floor_above_it():
    assert upward_imports(import_graph(PACKAGE), FLOORS) == [], "move the code to the floor it belongs on"


def test_measure_is_numbers_only_and_imports_no_tool_front_end_or_engine():
    """measure/ holds numbers (steady rates, verdicts, races, the ceilings' and bottleneck's arithmetic): what
    it imports of nbtrain is its own floor (the numbers, their records, plotting) and the config floor below; a
    tool, a trial, the engine, a launcher or a front-end measures through a trial and hands measure/ its
    readings."""
    graph = import_graph(PACKAGE)
    allowed = {0, 1}  # config; measure and records (with plotting and the progress bar's window rate)
    found = {module: sorted(t for t in targets if floor_of(t, FLOORS) not in allowed)
             for module, targets in graph.items() if module.startswith("nbtrain.measure")}
    assert {m: t for m, t in found.items() if t} == {}


def test_the_walk_is_a_wing_of_its_own_reached_only_through_the_registry_and_the_front_ends():
    """The checklist walk (walk/: its items, bench, result, waterfall) is one package; the tools beside it never
    import it, only the registry one floor up (which lists nbtrain.checklist) and the front-ends."""
    graph = import_graph(PACKAGE)
    walk = {m for m in graph if m == "nbtrain.walk" or m.startswith("nbtrain.walk.")}
    assert {"nbtrain.walk.walker", "nbtrain.walk.items", "nbtrain.walk.bench", "nbtrain.walk.result"} <= walk
    assert floor_of("nbtrain.tools.registry", FLOORS) > floor_of("nbtrain.walk.walker", FLOORS)
    reaching = {m for m, targets in graph.items() if m not in walk and targets & walk}
    assert {m for m in reaching if floor_of(m, FLOORS) <= floor_of("nbtrain.walk", FLOORS)} == set()


def test_the_floor_check_sees_an_import_upward_and_a_module_on_no_floor():
    floors = [("low", ("pkg.low",)), ("high", ("pkg.high", "pkg")), ("top", ("pkg.high.top",))]
    graph = {"pkg": {"pkg.high"}, "pkg.low": {"pkg.high.top"}, "pkg.high": {"pkg.low"}, "pkg.high.top": {"pkg.high"},
             "pkg.stray": set()}
    assert floor_of("pkg.high.top", floors, "pkg") == 2 and floor_of("pkg.stray", floors, "pkg") is None
    assert upward_imports(graph, floors, "pkg") == ["pkg.low -> pkg.high.top (low imports top)",
                                                    "pkg.stray: on no floor"]


def test_a_module_past_500_lines_says_in_its_first_line_why_it_is_one_idea(tmp_path):
    assert long_modules(PACKAGE) == [], (f"past {MAX_LINES} lines: split along a seam, or say in the first line why "
                                         f"the module is {ONE_IDEA!r}")
    print("modules past", MAX_LINES, "lines, each one idea:", one_idea_modules(PACKAGE) or "none")
    # the rule itself: a long module passes only with its reason on its first line
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text('"""A loop."""\n' + "x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "said.py").write_text(f'"""A loop: {ONE_IDEA}, its parts share every local."""\n' + "x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n")
    assert [row.split(" has ")[0] for row in long_modules(tmp_path / "pkg")] == [str(tmp_path / "pkg" / "long.py")]
    assert one_idea_modules(tmp_path / "pkg") == ["pkg/said.py"]


def test_nothing_outside_the_engine_uses_the_engines_private_names():
    names = engine_private_names(PACKAGE / "engine")
    assert {"_stop", "_flush", "_monitor"} <= names  # the engine's own private state was found
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if (PACKAGE / "engine") not in path.parents]
    outside += sorted((PACKAGE.parent / "benchmarks").rglob("*.py"))
    found = {str(path.relative_to(PACKAGE.parent)): uses for path in outside
             if (uses := reaches_into_engine(path, names))}
    assert found == {}, "use the engine's public methods (state_dict, trial(), stop(), set_lr, ...) instead"


# The Engine's run (loop.Run: one run of the Engine, its counters moved step by step in the hot loop) sets the
# position as it trains; a call given again goes through Engine.adopt (api.engine_for sets nothing itself).
SETS_ENGINE_FIELDS = {"nbtrain/engine/engine.py", "nbtrain/engine/loop.py"}


def test_only_the_engine_sets_its_own_fields():
    found = {str(path.relative_to(PACKAGE.parent)): where for path in sorted(PACKAGE.rglob("*.py"))
             if str(path.relative_to(PACKAGE.parent)) not in SETS_ENGINE_FIELDS and (where := sets_engine_fields(path))}
    assert found == {}, "call an Engine method (request, reconfigure, fork, trial, ...) instead of setting its fields"


def test_only_the_walker_sets_a_walks_fields():
    """The walk's parts (its headline, its quality races, its items) return what they compute; run_walk and the
    Walk's own methods (walker.py) set the walk's fields from it."""
    found = {str(path.relative_to(PACKAGE.parent)): where for path in sorted((PACKAGE / "walk").glob("*.py"))
             if path.name != "walker.py" and (where := sets_engine_fields(path, owner="walk"))}
    assert found == {}, "return what the part computes and let walker.py set the walk's fields"


def test_the_field_check_sees_each_way_of_setting_a_field(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(engine, panel, self):\n    engine.recipe = 1\n    panel.engine.step += 1\n"
                      "    self.engine.notes['x'] = 'y'\n    engine.optimizer.param_groups[0]['lr'] = 0\n"
                      "    other.x = 1\n")
    assert sets_engine_fields(module) == ["line 2: engine.recipe", "line 3: panel.engine.step",
                                          "line 4: self.engine.notes"]


def _package(root: Path, files: dict) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root / "pkg"


def test_the_checks_see_a_cycle_through_a_function_an_overlong_module_and_each_way_into_the_engine(tmp_path):
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def later():\n    from pkg.c import x\n",
        "pkg/c.py": "if True:\n    from .a import y\n" + "\n" * (MAX_LINES - 1),
        "pkg/d.py": "from .a import y\n",  # imports into the cycle, is not part of it
        "pkg/engine/__init__.py": "",
        "pkg/engine/loop.py": """
            _NEVER = object()
            class Engine:
                def __init__(self):
                    self._stop = None
                def _flush(self):
                    pass
            """,
        "pkg/tools/__init__.py": "",
        "pkg/tools/fine.py": """
            from ..engine.loop import Engine
            class Panel:
                def __init__(self):
                    self._thread = None
                    self._stop = None
                def other(self, panel):
                    return panel._thread, self._stop, Engine().stop
            """,
        "pkg/tools/bad.py": """
            from ..engine.loop import Engine, _NEVER
            from ..engine import loop
            def use(panel, walk):
                panel.engine._stop.set()
                e = walk.engine
                e._flush()
                getattr(e, "_stop")
                return loop._NEVER, Engine._flush
            """,
    })
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert long_modules(pkg) == [f"{pkg / 'c.py'} has {MAX_LINES + 1} lines"]
    names = engine_private_names(pkg / "engine")
    assert names == {"_NEVER", "_stop", "_flush"}
    assert reaches_into_engine(pkg / "tools" / "fine.py", names, "pkg") == []
    assert reaches_into_engine(pkg / "tools" / "bad.py", names, "pkg") == [
        "line 2: imports _NEVER from engine.loop", "line 5: panel.engine._stop", "line 7: e._flush",
        "line 8: getattr(e, '_stop')", "line 9: loop._NEVER", "line 9: Engine._flush"]
