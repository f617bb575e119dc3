"""An option's flag is spelled in one place (options.flag_name, and options.option_name back): the magic, the
command line, a config's as_flags, the tools' flags and the messages that name a flag all use it."""
import ast
from pathlib import Path

from nbtrain.config import TrainConfig, options
from nbtrain.options import flag_name, option_name
from nbtrain.tools.registry import TOOLS

PACKAGE = Path(__file__).resolve().parent.parent / "nbtrain"
HOME = PACKAGE / "options.py"
# "Where ranks run" (launchers/, distributed/, slurm/) spells other programs' flags (torchrun's, sbatch's).
OTHER_PROGRAMS = tuple(PACKAGE / name for name in ("launchers", "distributed", "slurm"))
NOT_A_FLAG = {("notebook/panel_controls.py", "option.replace('_', '-')"): "a CSS class (the browser tests' hook)",
              ("notebook/panel_tools.py", "name.replace('_', '-')"): "a CSS class (the browser tests' hook)"}


def spelled(path: Path) -> list[str]:
    """Where the module converts between an option and a flag by hand: `x.replace("_", "-")` (or back),
    `"--" + x`, f"--{x}", or `x.lstrip("-")`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and all(
                isinstance(a, ast.Constant) for a in node.args) and (
                node.func.attr == "replace" and [a.value for a in node.args] in (["_", "-"], ["-", "_"])
                or node.func.attr == "lstrip" and [a.value for a in node.args] == ["-"]):
            found.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant) \
                and node.left.value == "--" and not isinstance(node.right, ast.Constant):
            found.append(node)
        elif isinstance(node, ast.JoinedStr) and len(node.values) > 1 and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).endswith("--") and isinstance(node.values[1], ast.FormattedValue):
            found.append(node)
    return [ast.unparse(n) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def test_only_options_spells_an_option_as_a_flag():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HOME or any(d in path.parents for d in OTHER_PROGRAMS):
            continue
        where = str(path.relative_to(PACKAGE))
        hand = [s for s in spelled(path) if (where, s) not in NOT_A_FLAG]
        if hand:
            found[where] = hand
    assert found == {}, "spell flags with options.flag_name and read them back with options.option_name"


def test_the_spelling_check_sees_each_hand_spelling(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('a = "--" + name.replace("_", "-")\nb = f"--{key}"\nc = flag.lstrip("-")\nd = "--x"\n'
                      'e = word.replace("-", "_")\n')
    assert spelled(module) == ["'--' + name.replace('_', '-')", "name.replace('_', '-')", "f'--{key}'",
                               "flag.lstrip('-')", "word.replace('-', '_')"]


def test_every_option_and_tool_flag_reads_back_as_its_option():
    names = list(options()) + [t.name for t in TOOLS.values()] + [
        o.flag for t in TOOLS.values() for o in t.options if o.flag]
    for name in names:
        assert option_name(flag_name(name)) == name and flag_name(name).startswith("--") and "_" not in flag_name(name)
    assert TrainConfig(batch_size=64, accumulate_grad_batches=2).as_flags() == \
        "%%nbtrain --batch-size 64 --accumulate-grad-batches 2"
