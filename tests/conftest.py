import os

import pytest
import torch

# Two cores are shared by the whole suite: one intra-op thread keeps runs predictable.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shell():
    """A real IPython shell with the extension loaded (one per test session: IPython keeps a singleton)."""
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbtrain")
    ip.run_line_magic("colors", "nocolor")
    return ip
