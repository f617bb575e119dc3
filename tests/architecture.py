"""Read the package's source as syntax trees (never a text search) for the architecture rules that
test_boundaries.py holds: the import graph, module lengths, private names of the engine used elsewhere."""
import ast
import re
from pathlib import Path

# About 500 lines: past that a module says in its first line why it is one idea (split along a seam, never to
# meet a count: a cap at 400 kept a per-step saving out of the loop "for its line budget").
MAX_LINES = 500
ONE_IDEA = "one idea"


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module of the package at `root` (a package's own name for its __init__)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, node, known) -> list[str]:
    """The package's modules an import statement loads (a name imported from a package that is a
    submodule of it counts as that submodule)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = package[:len(package) - node.level + 1] if node.level else []
        target = ".".join(base + ([node.module] if node.module else []))
        targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target for alias in node.names]
    out = []
    for target in targets:
        while target and target not in known:  # `import a.b.c` of a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != module:
            out.append(target)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere: at the top, inside functions, under `if`, in `try`."""
    known = modules(root)
    return {name: {t for node in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   for t in _imported(name, path, node, known)}
            for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of two or more modules, as one path around it."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(start):  # Tarjan's algorithm, iteratively (the graph may be deep)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(_loop(sorted(group), graph))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


def _loop(group: list[str], graph) -> list[str]:
    """A path from the group's first module back to it, through the group (what to read to break it)."""
    members, start = set(group), group[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for step in sorted(graph[path[-1]] & members):
            if step == start:
                return path + [start]
            if step not in seen:
                seen.add(step)
                paths.append(path + [step])
    return group


def long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    """Modules past `limit` lines whose first line does not say why they are one idea."""
    return [f"{path} has {n} lines" for path in sorted(root.rglob("*.py"))
            if (n := len((text := path.read_text()).splitlines())) > limit
            and ONE_IDEA not in text.lstrip('"').splitlines()[0]]


def one_idea_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    """The exceptions: modules past `limit` lines whose first line says why they are one idea."""
    return [str(path.relative_to(root.parent)) for path in sorted(root.rglob("*.py"))
            if len((text := path.read_text()).splitlines()) > limit and ONE_IDEA in text.lstrip('"').splitlines()[0]]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def engine_private_names(engine_dir: Path) -> set[str]:
    """Every private name the engine's own code defines: its classes' `_methods` and `self._attributes`,
    and its modules' `_functions`, `_classes` and `_CONSTANTS`."""
    names = set()
    for path in engine_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
                names.add(node.name)
            for target in getattr(node, "targets", [getattr(node, "target", None)]):
                if isinstance(target, ast.Name) and _private(target.id):
                    names.add(target.id)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                    names.add(node.name)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                        and _private(node.attr):
                    names.add(node.attr)
    return names


def _mentions_engine(node) -> bool:
    """`engine`, `self.engine`, `panel.engine`, `engine_for(...)`, `walk.engine.optimizer`...: an expression
    that names an engine."""
    for part in ast.walk(node):
        if isinstance(part, ast.Name) and "engine" in part.id.lower():
            return True
        if isinstance(part, ast.Attribute) and "engine" in part.attr.lower():
            return True
    return False


def reaches_into_engine(path: Path, engine_names: set[str], package: str = "nbtrain") -> list[str]:
    """Where the module at `path` (outside the engine) uses a private name of the engine's:
    - `x._name` on an expression naming an engine, whatever the name;
    - `x._name` for a private name the engine defines, on anything but the module's own `self`
      (so an alias, `e = panel.engine; e._stop`, is caught too), unless the module defines that name itself;
    - `getattr(x, "_name")` / `setattr` / `hasattr` with such a name;
    - `from <package>.engine... import _name`, and `module._name` on an engine module imported whole."""
    tree = ast.parse(path.read_text(), str(path))
    own = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
           and node.value.id in ("self", "cls") and isinstance(node.ctx, ast.Store)}
    own |= {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    theirs = engine_names - own
    engine_modules, found = set(), []

    def is_engine_module(name: str | None, level: int) -> bool:
        return bool(name) and (name.split(".")[0] == "engine" and level > 0
                               or name.startswith(f"{package}.engine"))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            from_engine = is_engine_module(node.module, node.level)
            for alias in node.names:
                if from_engine and _private(alias.name):
                    found.append(f"line {node.lineno}: imports {alias.name} from {node.module}")
                if from_engine or (node.module in (None, package) or node.module == "") and alias.name == "engine":
                    engine_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(f"{package}.engine"):
                    engine_modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if _mentions_engine(node.value) or node.attr in theirs \
                    or ast.unparse(node.value) in engine_modules:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value) and (node.args[1].value in theirs or _mentions_engine(node.args[0])):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda where: int(where.split()[1].rstrip(":")))


def sets_engine_fields(path: Path, owner: str = "engine") -> list[str]:
    """Where the module at `path` assigns an Engine's field: `engine.x = ...`, `self.engine.x += ...`,
    `panel.engine.x[...] = ...` (an attribute of an engine, assigned or changed in place by subscript; a part's
    own attributes, `engine.optimizer.param_groups`, are the part's): only the Engine sets its own fields.
    `owner`: the word that names the object whose fields are looked for (a walk's: "walk")."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            target_owner = target.value if isinstance(target, ast.Attribute) else None
            if isinstance(target_owner, ast.Name) and owner in target_owner.id.lower() or \
                    isinstance(target_owner, ast.Attribute) and owner in target_owner.attr.lower():
                found.append(f"line {node.lineno}: {ast.unparse(target)}")
    return found


def floor_of(module: str, floors: list[tuple[str, tuple[str, ...]]], package: str = "nbtrain") -> int | None:
    """The index of the floor (lowest first) whose longest prefix names `module` (a prefix is a module or a
    package, with all its modules); the package's own __init__ only where named itself. None: on no floor."""
    best, length = None, -1
    for index, (_, members) in enumerate(floors):
        for prefix in members:
            inside = module == prefix or (prefix != package and module.startswith(prefix + "."))
            if inside and len(prefix) > length:
                best, length = index, len(prefix)
    return best


def upward_imports(graph: dict[str, set[str]], floors, package: str = "nbtrain") -> list[str]:
    """Each import from a floor to a floor above it ('a -> b (measure imports tools)'), and each module on no
    floor ('a: on no floor'): a module placed nowhere would escape the rule."""
    found = []
    for module in sorted(graph):
        floor = floor_of(module, floors, package)
        if floor is None:
            found.append(f"{module}: on no floor")
            continue
        for target in sorted(graph[module]):
            above = floor_of(target, floors, package)
            if above is not None and above > floor:
                found.append(f"{module} -> {target} ({floors[floor][0]} imports {floors[above][0]})")
    return found


def _top_level_names(tree) -> tuple[set[str], set[str]]:
    """(names a module defines, names it imports) at its top level, inside `if` and `try` blocks too."""
    defined, imported = set(), set()
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [n for handler in getattr(node, "handlers", []) for n in handler.body]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
    return defined, imported


def relayed_imports(root: Path, paths: list[Path], faces: tuple[str, ...] = ()) -> list[str]:
    """Each `from <module of root's package> import name` in `paths` that takes a name the module only imported
    from elsewhere (a relay: the reader is sent to a second home): 'tests/t.py:3: ConfigError from pkg.config'.
    A package's own __init__ is its face and may be read from; so may the modules under the prefixes `faces`."""
    known = modules(root)
    names = {module: _top_level_names(ast.parse(path.read_text(), str(path))) for module, path in known.items()}
    found = []
    for path in paths:
        inside = root in path.parents
        module = next((m for m, p in known.items() if p == path), path.stem) if inside else path.stem
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                source = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module
            if source not in known or known[source].name == "__init__.py" or source.startswith(faces):
                continue
            defined, imported = names[source]
            for alias in node.names:
                if alias.name in imported and alias.name not in defined and f"{source}.{alias.name}" not in known:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {alias.name} from {source}")
    return found


def unused_import_waivers(repo: Path, paths: list[Path]) -> list[tuple[str, str]]:
    """(file from `repo`, the statement) for each line that waives the unused-import check (`noqa: F401`)."""
    return [(str(path.relative_to(repo)), line.split("#")[0].strip())
            for path in paths for line in path.read_text().splitlines() if _WAIVED_IMPORT.match(line)]


_WAIVED_IMPORT = re.compile(r"\s*(from\s+\S+\s+)?import\b[^#]*#\s*noqa:[^#]*\bF401")
