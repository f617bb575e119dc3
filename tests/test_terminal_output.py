"""%%nbtrain in a plain terminal IPython, read off a real pseudo-terminal as a person would see it."""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

SESSION = r'''
import warnings
from IPython.terminal.interactiveshell import TerminalInteractiveShell
ip = TerminalInteractiveShell.instance()
ip.run_cell("""
%load_ext nbtrain
import warnings, torch
from torch import nn
from nbtrain.demo import DigitsDataset
train_data, loss_fn = DigitsDataset(), nn.CrossEntropyLoss()
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.calls = nn.Linear(64, 10), 0
    def forward(self, x):
        self.calls += 1
        if self.calls == 6:
            warnings.warn("a warning from the user's model")
        return self.layer(x)
""")
ip.run_cell("%%nbtrain --max-steps 40 --log-every-n-steps 2\nmodel = Net()")
print("=== the failing run")
ip.run_cell("""%%nbtrain --max-steps 32 --log-every-n-steps 2
def training_step(model, batch):
    warnings.warn("a warning just before the failure")
    raise ValueError("boom in the user's step")
""")
'''


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`: a carriage return goes back to the line's start, and what follows
    overwrites it (escape sequences, which only set colours and the title here, left out)."""
    raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", raw)
    lines, line, column = [], [], 0
    for char in raw:
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append("".join(line).rstrip())
            line, column = [], 0
        else:
            line[column:column + 1] = [char]
            column += 1
    return lines + ["".join(line).rstrip()]


def _run_in_a_terminal(tmp_path, code: str) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 110, 0, 0))  # 40 rows, 110 columns
    env = {**os.environ, "NBTRAIN_STORE": str(tmp_path / "runs.sqlite"), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path,
                               env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end closed: the session is over
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_a_terminal_shows_one_bar_a_run_with_warnings_on_lines_of_their_own_and_no_plot_text(tmp_path):
    lines = _screen(_run_in_a_terminal(tmp_path, SESSION))
    shown = "\n".join(lines)
    # No live plot in a terminal (it shows no pictures): each frame was a line of text inside the bar.
    assert "live plot" not in shown, shown
    for warning in ("a warning from the user's model", "a warning just before the failure"):
        where = [line for line in lines if f"UserWarning: {warning}" in line]
        assert len(where) == 1 and "step/s" not in where[0] and "%|" not in where[0], shown
    # Each run's bar is one line on the screen, the failing one too (a warning inside it drew it again below).
    assert len([line for line in lines if "/40 [" in line]) == 1, shown
    assert len([line for line in lines if "/32 [" in line]) == 1, shown
    assert "ValueError: boom in the user's step" in shown and "nbtrain run" in shown
