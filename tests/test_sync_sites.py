"""The sync-point finder names the user's line wherever the user's code lives.

On CUDA, torch's sync debug mode raises a warning from the line that synchronised; the finder's
handler (leaks.SyncCounter) walks out from there. These run its real handler on the CPU with the
warning raised as torch raises it (warnings.warn from the user's line), the user's code in each
kind of place: a test file inside the repository, a module beside the notebook, a package in
site-packages (inside the stdlib's folder, as conda and system Pythons keep it), a notebook cell.
The first GPU run counted a user's `loss.item()` as "nbtrain/torch internals".
"""
import importlib
import linecache
import os
import warnings

import pytest

from nbtrain.places import place
from nbtrain.tools import leaks
from nbtrain.tools.leaks import SyncCounter

SYNC = "called a synchronizing CUDA operation"  # torch's sync debug warning


def _counted(step):
    counter = SyncCounter()
    with counter.watching():
        step()
    return counter.sites()


def _step_in_this_test_file():
    warnings.warn(SYNC)  # the user's line


def _line_of(text, path=__file__):
    with open(path) as source:
        return next(i for i, line in enumerate(source, 1) if text in line)


def test_a_sync_in_a_test_file_inside_the_repository_is_the_users_line():
    assert _counted(_step_in_this_test_file) == [
        (f"{__file__}:{_line_of('# the user' + chr(39) + 's line')}", "warnings.warn(SYNC)  # the user's line", 1)]


def test_a_sync_in_a_module_beside_the_notebook_is_the_users_line(tmp_path, monkeypatch):
    (tmp_path / "my_steps.py").write_text("import warnings\n\ndef step():\n    loss_value = warnings.warn("
                                          f"{SYNC!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_steps")
    [(where, text, count)] = _counted(module.step)
    assert where == f"{tmp_path / 'my_steps.py'}:4" and text.startswith("loss_value = warnings.warn(") and count == 1


def _code_at(filename, source):
    """Functions defined by `source` as if read from `filename` (linecache holds its text)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.mark.parametrize("folder", [os.path.join(leaks._STDLIB_DIR, "site-packages"),
                                    os.path.join(leaks._STDLIB_DIR, "dist-packages")])
def test_a_sync_in_a_package_the_user_installed_in_site_packages_is_the_users_line(folder):
    filename = os.path.join(folder, "users_own_pkg", "steps.py")
    try:
        step = _code_at(filename, "import warnings\ndef step():\n    warnings.warn(%r)\n" % SYNC)["step"]
        assert _counted(step) == [(f"{filename}:3", f"warnings.warn({SYNC!r})", 1)]
    finally:
        linecache.cache.pop(filename, None)


def test_a_sync_that_nbtrain_makes_is_counted_as_internals():
    filename = os.path.join(leaks._NBTRAIN_DIR, "engine", "an_nbtrain_module.py")
    try:
        step = _code_at(filename, "import warnings\ndef read_back():\n    warnings.warn(%r)\n" % SYNC)["read_back"]
        assert _counted(step) == [(leaks._INTERNALS, "", 1)]
    finally:
        linecache.cache.pop(filename, None)


def test_a_sync_in_a_notebook_cell_is_named_as_ipython_names_the_cell(shell):
    shell.run_cell("import warnings\n\ndef cell_step():\n    warnings.warn(%r)\n" % SYNC, store_history=True)
    number = shell.execution_count - 1
    [(where, text, count)] = _counted(shell.user_ns["cell_step"])
    assert where == f"cell In[{number}], line 4" and text == f"warnings.warn({SYNC!r})" and count == 1


def test_a_kernels_temporary_cell_file_is_never_shown_as_a_path():
    # A cell of a kernel whose shell is not this process's (a DDP rank's traceback, a report read later).
    assert place("/tmp/ipykernel_4242/3571902341.py", 6) == "a notebook cell, line 6"
    assert place("/home/me/project/train.py", 12) == "/home/me/project/train.py:12"


def test_off_cuda_the_finder_says_it_needs_cuda():
    from nbtrain import TrainConfig
    from nbtrain.demo import digits_recipe
    report = leaks.find_sync_points(recipe=digits_recipe(), config=TrainConfig(batch_size=16, accelerator="cpu"))
    assert not report.available and report.message.startswith("needs CUDA: this model trains on cpu")
