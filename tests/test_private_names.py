"""A private name (`_name`) stays in the module that defines it: no module of nbtrain imports another's
private name (`from .x import _name`) or reads or sets one on an object (`obj._name`, `self._name` of a
mixin) when that name is defined only in other modules of nbtrain. What a module needs from another is
public, so reading one file tells what it shares.

Read from the source (ast), not by running it. A name counts as defined in a module where the module
binds it: `def _x` / `class _X`, an assignment to `_x`, `self._x = ...` / `cls._x = ...`, a parameter.
Limit, by design of a static check: a module that defines `_x` itself is not checked on its reads of
another object's `_x`. Private names of other packages (torch's `_orig_mod`, a DataLoader iterator's
`_shutdown_workers`) are not nbtrain's and are not checked."""
from __future__ import annotations

import ast
from pathlib import Path

import nbtrain

ROOT = Path(nbtrain.__file__).parent

# Names another package's protocol gives a leading underscore: IPython calls them on our objects.
PROTOCOL = {"_render_traceback_", "_repr_html_", "_repr_pretty_", "_repr_mimebundle_", "_ipython_display_"}

# (module, name): crossings left on purpose, each with why and what removes it (none today).
ALLOWED: set[tuple[str, str]] = set()


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name not in PROTOCOL


def modules() -> dict[str, ast.Module]:
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(), str(path))
            for path in sorted(ROOT.rglob("*.py"))}


def defined(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            names.add(node.args[1].value)  # a frozen dataclass sets its own fields this way
    return {name for name in names if private(name)}


def crossings(trees: dict[str, ast.Module]) -> list[str]:
    """Every private name a module uses that another module of nbtrain defines, as 'module:line text'."""
    own = {module: defined(tree) for module, tree in trees.items()}
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("nbtrain")):
                found += [f"{module}:{node.lineno} imports {a.name} from {node.module or '.'}"
                          for a in node.names if private(a.name) and (module, a.name) not in ALLOWED]
            elif isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in own[module] \
                    and (module, node.attr) not in ALLOWED:
                owners = sorted(other for other, names in own.items() if node.attr in names)
                if owners:
                    found.append(f"{module}:{node.lineno} uses .{node.attr}, defined in {', '.join(owners)}")
    return found


def test_no_private_name_crosses_a_module_boundary():
    assert crossings(modules()) == []


def test_the_check_sees_a_mixin_an_import_and_a_reach_into_another_object():
    """The check itself, on three small modules that break the rule the three ways it looks for."""
    trees = {
        "a.py": ast.parse("class Part:\n    def _flush(self):\n        self._rows = []\n"),
        "b.py": ast.parse("from .a import Part\nclass Whole(Part):\n    def run(self):\n        self._flush()\n"),
        "c.py": ast.parse("from .a import _helper\ndef read(whole):\n    return whole._rows\n"),
        "d.py": ast.parse("def own(x):\n    x._cache = 1\n    return x._cache, x._shutdown_workers\n"),
    }
    assert crossings(trees) == ["b.py:4 uses ._flush, defined in a.py",
                                "c.py:1 imports _helper from a",
                                "c.py:3 uses ._rows, defined in a.py"]


def test_each_allowed_crossing_still_happens():
    """An exception that no longer happens is dropped from the list, so the list only shrinks."""
    trees = modules()
    used = set()
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                used |= {(module, a.name) for a in node.names}
            elif isinstance(node, ast.Attribute):
                used.add((module, node.attr))
    assert ALLOWED <= used, ALLOWED - used


def test_the_engine_holds_its_parts_and_a_run_holds_what_it_resets():
    """No mixins: the Engine and its Run are classes of their own; what a run resets is the Run's."""
    from nbtrain.engine.engine import Engine
    from nbtrain.engine.loop import Run
    assert Engine.__mro__ == (Engine, object) and Run.__mro__ == (Run, object)
    run_state = defined(modules()["engine/engine.py"])
    assert not run_state & {"_rows", "_losses", "_monitor", "_logged", "_clock", "_stop", "_caller_stop"}
