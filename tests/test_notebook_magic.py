"""A real notebook in a real kernel (nbclient): two %%nbtrain cells compared, an interrupted run,
and the comparison again from the run store in a fresh kernel."""
import os
import signal
import threading
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAILS = "# fails\n"  # cells that start with this are expected to raise

SETUP = """\
%load_ext nbtrain
import torch
from torch import nn
from nbtrain.demo import DigitsDataset, DigitsMLP
"""
RUN_A = """\
%%nbtrain --max-steps 20 --batch-size 32 --log-every-n-steps 5 --name run_a
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = nn.CrossEntropyLoss()
"""
RUN_B = """\
%%nbtrain --max-steps 20 --batch-size 128 --log-every-n-steps 5 --name run_b
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = nn.CrossEntropyLoss()
"""
BAD_FLAG = FAILS + "%%nbtrain --batch-size 0 --bath-size 3\nran = True\n"
USER_ERROR = FAILS + """\
%%nbtrain --max-steps 3
def training_step(model, batch):
    x, y = batch
    return undefined_loss(model(x), y)
"""
CHECK = "import nbtrain; print(nbtrain.__file__); print(run_a.status, run_b.status, run_a.config.batch_size, run_b.config.batch_size, len(run_b.history['step']))"

INTERRUPTED = """\
%%nbtrain --max-steps 20000 --log-every-n-steps 5 --batch-size 16 --name cut
import pathlib
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = nn.CrossEntropyLoss()
steps = [0]
def training_step(model, batch):
    steps[0] += 1
    if steps[0] == 12:  # two log windows trained: the test interrupts the kernel now
        pathlib.Path({marker!r}).touch()
    x, y = batch
    return loss_fn(model(x), y)
"""


def kernel_env():
    """The kernel imports this tree's nbtrain and keeps its run store in its own folder."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    env.pop("NBTRAIN_STORE", None)
    return env


def execute(cells, folder, interrupt_when=None):
    """Run the cells in a fresh kernel; when the file `interrupt_when` appears, interrupt the kernel once."""
    notebook = new_notebook(cells=[new_code_cell(source.removeprefix(FAILS), metadata={"tags": ["raises-exception"]})
                                   if source.startswith(FAILS) else new_code_cell(source) for source in cells])
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})

    def interrupt():
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and not interrupt_when.exists():
            time.sleep(0.05)
        # What the notebook's interrupt button does to a local kernel: SIGINT to its process.
        os.kill(client.km.provisioner.process.pid, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt, daemon=True) if interrupt_when else None
    if interrupter:
        interrupter.start()
    client.execute(env=kernel_env())
    if interrupter:
        interrupter.join(5)
    return notebook


def outputs(cell, kind):
    return [o for o in cell.outputs if kind in o.get("data", {})]


def text_of(cell):
    parts = [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
    parts += [o["data"].get("text/plain", "") + o["data"].get("text/html", "")
              for o in cell.outputs if "data" in o]
    return "\n".join(parts)


def test_two_cells_trained_compared_interrupted_and_compared_again_after_a_restart(tmp_path):
    marker = tmp_path / "training"
    nb = execute([SETUP, RUN_A, RUN_B, "%nbtrain_compare run_a run_b", "%nbtrain_runs", CHECK,
                  INTERRUPTED.format(marker=str(marker)),
                  "print(cut.status, len(cut.history['step']) > 0, cut.history['step'][-1] < 20000)",
                  BAD_FLAG, USER_ERROR],
                 tmp_path, interrupt_when=marker)
    _, cell_a, cell_b, compared, listed, check, cut, cut_check, bad_flag, user_error = nb.cells
    for cell, name in ((cell_a, "run_a"), (cell_b, "run_b")):
        assert len(outputs(cell, "image/png")) == 1  # the live plot, updated in place, is one output
        assert any("widget-view" in key for o in cell.outputs for key in o.get("data", {}))  # progress widget
        summary = text_of(cell)
        assert f"nbtrain run {name}" in summary and "samples/s" in summary and "peak memory" in summary
    assert "recorded as run #1" in text_of(cell_a) and "recorded as run #2" in text_of(cell_b)
    table = text_of(compared)
    assert "run_a" in table and "run_b" in table and "batch_size=128" in table
    assert outputs(compared, "text/html") and "data:image/png;base64," in outputs(compared, "text/html")[0]["data"]["text/html"]
    assert "run_a" in text_of(listed) and "run_b" in text_of(listed)
    where, numbers = check.outputs[0]["text"].splitlines()
    assert where.startswith(ROOT)
    assert numbers.split() == ["completed", "completed", "32", "128", "20"]
    assert (tmp_path / ".nbtrain" / "runs.sqlite").exists()

    # Interrupting the kernel mid-run stops at a step boundary; the partial run is kept.
    summary = text_of(cut)
    assert "interrupted after" in summary and "of 20000 planned steps: stopped at step" in summary
    assert "the model keeps its training so far" in summary
    assert cut_check.outputs[0]["text"].split() == ["interrupted", "True", "True"]

    # A bad flag is one line and nothing runs; a failure in user code shows the user's frames only.
    text = text_of(bad_flag)
    assert "UsageError: %%nbtrain: unknown flag --bath-size 3 (did you mean --batch-size?)" in text
    assert "Traceback" not in text
    error = [o for o in user_error.outputs if o.output_type == "error"][0]
    frames = "\n".join(error["traceback"])
    assert error["ename"] == "NameError" and "undefined_loss" in error["evalue"]
    assert "training_step" in frames and "engine.py" not in frames and "magic.py" not in frames

    # A fresh kernel in the same folder compares the same runs from the store.
    again = execute(["%load_ext nbtrain", "%nbtrain_compare run_a run_b\n_nbtrain_compare.labels"], tmp_path)
    assert "['run_a', 'run_b']" in text_of(again.cells[1])
    nbformat.validate(again)
