"""An interrupt at any moment leaves a kernel that trains (DESIGN rule 12; issue 49, item 7): a first DDP cell
interrupted at staggered points (inside torch's lazy import of torch._dynamo and sympy that the first optimizer
built sets off, the ranks' start, their training), then a DDP run in the same process completes. The kernel's
interrupt is a real SIGINT sent to the process, as Jupyter sends it."""
import json
import os
import subprocess
import sys

import pytest

from nbtrain.engine import imports

_CELLS = r'''
import json, os, signal, sys, threading
import torch
from torch import nn
import nbtrain

model = nn.Linear(4, 2)


def cell(max_steps):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    return nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), max_steps=max_steps, devices=2, accelerator="cpu",
                       batch_size=8)


seen = []
for delay in json.loads(sys.argv[1]):
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    try:
        try:
            timer.start()
            seen.append(cell(10**6).status)
        finally:
            timer.cancel()
    except KeyboardInterrupt:
        seen.append("KeyboardInterrupt")
    except Exception as error:
        seen.append(f"{type(error).__name__}: {str(error)[:300]}")
last = cell(3)
print(json.dumps({"interrupted": seen, "last": last.status, "steps": last.summary.steps}))
'''


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_first_ddp_cell_interrupted_at_ten_points_leaves_a_kernel_that_trains(tmp_path):
    # Each process's first delay lands in its first cell's imports or the ranks' start; the later ones in
    # cells after it (ranks starting, training, stopping).
    plans = [[0.2, 2.5, 6.0], [0.6, 1.5, 4.0], [1.0, 3.5, 0.1, 8.0]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    runs = [subprocess.Popen([sys.executable, "-c", _CELLS, json.dumps(p)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env) for p in plans]
    for plan, run in zip(plans, runs):
        out, err = run.communicate(timeout=360)
        assert run.returncode == 0, (plan, err[-3000:])
        found = json.loads(out.strip().splitlines()[-1])
        assert len(found["interrupted"]) == len(plan), found
        assert all(s in ("KeyboardInterrupt", "interrupted", "stopped", "completed") for s in found["interrupted"]), \
            (plan, found)
        assert found["last"] == "completed" and found["steps"] == 3, (plan, found)


_HALF = r'''
import json, os, signal, sys, threading
import torch
from torch import nn
import nbtrain
from nbtrain.engine import imports
timer = threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), signal.SIGINT))
timer.start()
try:
    torch.optim.AdamW(nn.Linear(3, 3).parameters())  # the user's own first optimizer, before %load_ext nbtrain
except KeyboardInterrupt:
    pass
finally:
    timer.cancel()  # a fast machine finished the imports first: this run is one an interrupt did not cut short
half = imports.half_imported()
data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randint(0, 2, (16,)))
try:
    said = nbtrain.fit(nn.Linear(3, 2), data, loss_fn=nn.CrossEntropyLoss(), max_steps=2, batch_size=8).status
except Exception as error:
    said = f"{type(error).__name__}: {error}"
print(json.dumps({"half": half, "said": said}))
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_import_an_interrupt_cut_short_in_the_users_code_is_one_clear_refusal():
    # Outside nbtrain nothing holds the interrupt: torch is left unable to train in that process (a repair in
    # place is not sound), and fit says so in one line instead of an AttributeError from inside sympy or dynamo.
    delays = [0.3, 0.8, 1.5]  # inside torch._dynamo's import (seconds) on a quiet machine and a loaded one
    runs = [subprocess.Popen([sys.executable, "-c", _HALF, str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for d in delays]
    found = []
    for d, run in zip(delays, runs):
        out, err = run.communicate(timeout=240)
        assert run.returncode == 0, (d, err[-3000:])
        found.append(json.loads(out.strip().splitlines()[-1]))
    assert any(f["half"] for f in found), found  # some interrupt did cut an import short
    for f in found:
        # A later import of the same package may finish what the interrupt cut short (the code that runs between
        # the interrupt and fit can import it again), and then torch trains: completed. What never happens is an
        # error from deep inside sympy or dynamo.
        if f["said"] != "completed":
            assert f["half"] and f["said"].startswith("HalfImported: an interrupt earlier in this process cut short "
                                                      "Python's import of ") and "restart the kernel" in f["said"], f
            assert any(f"import of {package}" in f["said"] for package in f["half"]), f


def test_an_interrupt_held_over_an_import_arrives_when_it_ends():
    import signal
    with pytest.raises(KeyboardInterrupt):
        with imports.interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            done = True
    assert done and signal.getsignal(signal.SIGINT) is signal.default_int_handler
