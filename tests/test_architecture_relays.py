"""Every name has one home, and its readers import it from there: no module re-exports another's name so that
callers may import it from a second place (a relay), and an unused import is waived only where it does work of
its own (a probe of whether something imports, a pytest fixture brought in), each waiver with its reason."""
from pathlib import Path

from architecture import relayed_imports, unused_import_waivers

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "nbtrain"
# "Where ranks run" is one folder, distributed/ (issue 52 item 1): this check reads it as every other.
MOVING = ()
MOVING_DIRS = tuple(PACKAGE / m.split(".")[1] for m in MOVING)

WAIVED = {  # (file, statement): why an import nothing reads stays
    ("nbtrain/walk/items.py", "from ..distributed import launch"): "a probe: whether the DDP launcher imports here",
    ("nbtrain/distributed/zygote.py", "from torch.nn import parallel"): "the zygote's warm-up: imported before a fork",
    ("nbtrain/distributed/zygote.py", "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"):
        "the zygote's warm-up: imported before a fork",
    ("nbtrain/notebook/panel.py", "import ipywidgets"): "the first import of ipywidgets: fails with the install command",
    ("tests/conftest.py", "from slurm_fixture import slurm_cluster"): "a pytest fixture, found by its name",
    ("tests/test_first_call.py", "import xml.dom.minidom"): "loads a package with a finished submodule",
    ("benchmarks/launch_latency.py", "import nbtrain"): "a kernel that has imported nbtrain, as a notebook has",
    ("benchmarks/launch_latency.py", "import accelerate"): "accelerate's own import cost, paid before its timing",
}


def _sources() -> list[Path]:
    return [p for folder in (PACKAGE, REPO / "tests", REPO / "benchmarks") for p in sorted(folder.rglob("*.py"))
            if not any(d in p.parents for d in MOVING_DIRS)]


def test_every_name_is_imported_from_its_own_module():
    relays = relayed_imports(PACKAGE, _sources(), faces=MOVING)
    assert relays == [], "import each name from the module that defines it (a package's __init__ is its face)"


def test_an_unused_import_is_waived_only_where_it_does_work_of_its_own():
    waived = [w for w in unused_import_waivers(REPO, _sources()) if w not in WAIVED]
    assert waived == [], "import the name where it is read, from its own module; or say here why the import stays"


def test_the_relay_check_sees_a_name_passed_on_and_not_one_defined_or_a_packages_face(tmp_path):
    files = {"pkg/__init__.py": "from .home import Thing\n",
             "pkg/home.py": "class Thing: ...\n",
             "pkg/relay.py": "from .home import Thing  # noqa: F401\nfrom . import home\nLOCAL = 1\n",
             "pkg/reader.py": "from .relay import Thing, LOCAL\nfrom .home import Thing as T\nfrom . import Thing as U\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    paths = sorted((tmp_path / "pkg").glob("*.py"))
    assert relayed_imports(tmp_path / "pkg", paths) == ["pkg/reader.py:1: Thing from pkg.relay"]
    assert unused_import_waivers(tmp_path, paths) == [("pkg/relay.py", "from .home import Thing")]
