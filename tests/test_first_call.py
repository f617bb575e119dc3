"""The first call of a process (issue 51 item 3): torch's imports for the first optimizer (torch._dynamo, sympy;
seconds) are made once, the interrupt held, and the call that made them says so in its summary; a later call
says nothing of them. And the look for an import an interrupt cut short stays exact when it is skipped."""
import json
import subprocess
import sys

import pytest

from nbtrain.engine import imports

_TWO_CALLS = r'''
import json, sys
import torch
from torch import nn
import nbtrain

assert "torch._dynamo" not in sys.modules, "importing nbtrain already made the heavy imports"
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
model = nn.Linear(4, 2)
said = []
for _ in range(2):
    result = nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), max_steps=2, batch_size=8, accelerator="cpu")
    said.append({"notes": [n for n in result.summary.notes if n.startswith("start-up")],
                 "start_up_s": result.summary.time_split["start-up"]})
print(json.dumps(said))
'''


def _said_in_a_fresh_process(script: str) -> list:
    """What `script` printed last, as JSON, run in a process of its own (torch's heavy imports not yet made)."""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_first_call_of_a_process_says_its_start_up_was_torchs_first_imports():
    first, second = _said_in_a_fresh_process(_TWO_CALLS)
    assert len(first["notes"]) == 1 and "torch._dynamo" in first["notes"][0], first
    said_s = float(first["notes"][0].split()[1])
    assert 0 < said_s <= first["start_up_s"] + 0.05  # a part of the call's start-up, as measured
    assert second["notes"] == []  # made once per process: the next call pays nothing and says nothing


_TOOL_FIRST = r'''
import json, sys, warnings
import torch
from torch import nn
import nbtrain
from nbtrain.engine.imports import StartUpNote
from nbtrain.tools import trial

data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
model = nn.Linear(4, 2)
said = []
for _ in range(2):  # a tool's trial, as every checklist tool opens one, is the process's first call
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trial.borrow(model, data, loss_fn=nn.CrossEntropyLoss(), batch_size=8) as lent:
            trial.measure(lent.engine, lent.engine.config, steps=2)
    said.append([str(w.message) for w in caught if issubclass(w.category, StartUpNote)])
result = nbtrain.fit(model, data, loss_fn=nn.CrossEntropyLoss(), max_steps=2, batch_size=8, accelerator="cpu")
said.append([n for n in result.summary.notes if n.startswith("start-up")])
print(json.dumps(said))
'''


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tool_that_is_the_first_call_of_a_process_says_its_start_up():
    tool, tool_again, fit_after = _said_in_a_fresh_process(_TOOL_FIRST)
    assert len(tool) == 1 and "torch._dynamo" in tool[0] and tool[0].startswith("nbtrain: start-up "), tool
    assert tool_again == [] and fit_after == []  # once per process, wherever the first call was


def test_a_package_dropped_after_a_clean_look_is_still_found():
    import xml.dom.minidom  # noqa: F401  (a package with a finished submodule)
    assert imports.half_imported() == []  # the clean names are kept for the next look
    package = sys.modules.pop("xml.dom")  # what an interrupt inside the package's import leaves
    try:
        assert imports.half_imported() == ["xml.dom"]
    finally:
        sys.modules["xml.dom"] = package
    assert imports.half_imported() == []
