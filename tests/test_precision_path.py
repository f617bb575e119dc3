"""The precision a `%%nbtrain` cell asks for, followed from the flag to torch.autocast (issue 52 item 2): it passes
through at most 10 nbtrain files, this machine is checked once per call, the recipe's settings are adopted once, and
the config holding it is made once: the engine, a model's first or a live one switched to the call's config, runs
that very object (no diff and back).

The follower watches the real cell in a real IPython shell. The value's path is where it is read on its way to the
engine (every nbtrain function called with the flag's text, every read of a TrainConfig's `precision` holding it,
noted in the nbtrain file that read it), the nbtrain files on the stack when the engine's Precision is built with it,
and those on the stack when torch.autocast is entered with its dtype. What the run writes about it after the engine
holds it (its start record) is not on the way."""
import collections
import sys
from pathlib import Path

import torch
from torch.amp import autocast_mode

import nbtrain
from nbtrain.api import live_engine
from nbtrain.config import TrainConfig, check_runnable
from nbtrain.engine import imports
from nbtrain.engine.precision import Precision
from nbtrain.recipe import Recipe
from nbtrain.tools.trial import borrow
from helpers import regression_recipe

PACKAGE = Path(nbtrain.__file__).resolve().parent
MAX_FILES = 10
AUTOCAST_ENTERED = autocast_mode.autocast.__init__.__code__
PRECISION_BUILT = Precision.__init__.__code__
CONFIG_MADE = TrainConfig.__post_init__.__code__
COUNTED = {check_runnable.__code__: "check_runnable", Recipe.adopt_settings.__code__: "adopt_settings"}
FLAGS = "--max-steps 1 --batch-size 16 --no-plot --no-progress"
DIGITS = """
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""


def nbtrain_file(filename: str) -> str | None:
    """`filename` as a path inside the nbtrain package (engine/precision.py), or None outside it."""
    try:
        return Path(filename).resolve().relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def stack_files(frame) -> list[str]:
    """The nbtrain files of `frame` and its callers, innermost first, each once."""
    files = []
    while frame is not None:
        found = nbtrain_file(frame.f_code.co_filename)
        if found is not None and found not in files:
            files.append(found)
        frame = frame.f_back
    return files


def text_arguments(frame) -> list[str]:
    """The texts a function was called with, also inside its *args and **kwargs and dict arguments (only texts:
    a tensor is never compared with one)."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    values = [frame.f_locals.get(name) for name in code.co_varnames[:count]]
    values += [v for group in values if isinstance(group, (tuple, dict))
               for v in (group.values() if isinstance(group, dict) else group)]
    return [v for v in values if isinstance(v, str)]


class Follower:
    """Where the value `text` (`dtype` in autocast) goes while a cell runs."""

    def __init__(self, text: str, dtype: torch.dtype):
        self.text, self.dtype = text, dtype
        self.read_in = collections.Counter()   # nbtrain file -> reads of the value there before the engine held it
        self.held: list[str] | None = None      # the stack when the engine's Precision was built with the value
        self.on_stack: list[str] | None = None  # the stack when autocast was entered with its dtype
        self.configs_made = []                  # TrainConfigs made holding the value before the engine held it
        self.calls = collections.Counter()     # check_runnable / adopt_settings calls in the whole cell

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code in COUNTED:
            self.calls[COUNTED[code]] += 1
        if code is AUTOCAST_ENTERED and self.on_stack is None and frame.f_locals.get("dtype") is self.dtype:
            self.on_stack = stack_files(frame.f_back)
        if self.held is not None:
            return
        if code is PRECISION_BUILT and frame.f_locals.get("precision") == self.text:
            self.held = stack_files(frame)
        elif code is CONFIG_MADE and object.__getattribute__(frame.f_locals["self"], "precision") == self.text:
            self.configs_made.append(frame.f_locals["self"])
        here = nbtrain_file(code.co_filename)
        if here is not None and self.text in text_arguments(frame):
            self.read_in[here] += 1

    def read(self, frame) -> None:
        """A TrainConfig's precision holding the value was read in `frame` (or the nbtrain code that called it:
        a dataclass's generated __eq__, dataclasses.replace)."""
        if self.held is None:
            files = stack_files(frame)
            if files:
                self.read_in[files[0]] += 1

    def files(self) -> set[str]:
        return set(self.read_in) | set(self.held or ()) | set(self.on_stack or ())

    def describe(self) -> str:
        return (f"read in {dict(self.read_in)}; on the stack when the engine held it {self.held} and at autocast "
                f"{self.on_stack}; configs made {len(self.configs_made)}; calls {dict(self.calls)}")


def follow(ip, cell: str, text: str = "bf16-mixed", dtype: torch.dtype = torch.bfloat16) -> Follower:
    """Run `cell` in the shell, following the precision `text` to autocast."""
    imports.settle()  # torch's lazy imports (seconds), as fit's first call makes them, before the profiler is on
    follower = Follower(text, dtype)

    def read_traced(config, name):
        value = object.__getattribute__(config, name)
        if name == "precision" and value == text:
            follower.read(sys._getframe(1))
        return value

    TrainConfig.__getattribute__ = read_traced  # a dataclass defines none: deleting it below puts object's back
    earlier = sys.getprofile()
    sys.setprofile(follower.profile)
    try:
        result = ip.run_cell(cell)
    finally:
        sys.setprofile(earlier)
        del TrainConfig.__getattribute__
    assert result.error_in_exec is None, result.error_in_exec
    return follower


def assert_short_path(follower: Follower, engine) -> None:
    assert follower.on_stack is not None and follower.held is not None, \
        "autocast was never entered with the precision's dtype: " + follower.describe()
    files = follower.files()
    # Followed from the flag's text (read in options.py, validated in config.py) to autocast (precision.py).
    assert {"notebook/magic.py", "options.py", "config.py", "engine/precision.py"} <= files, follower.describe()
    assert len(files) <= MAX_FILES, f"{len(files)} files: {follower.describe()}"
    assert dict(follower.calls) == {"check_runnable": 1, "adopt_settings": 1}, follower.describe()
    # The config the cell's flags made is the engine's own: no diff of it made into another and back.
    assert len(follower.configs_made) == 1 and engine.config is follower.configs_made[0], follower.describe()


def test_the_precision_flag_reaches_autocast_of_a_new_engine_in_few_files(ip):
    ip.run_cell(f"%%nbtrain {FLAGS}" + DIGITS)  # what a process's first run imports and warms is not followed
    follower = follow(ip, f"%%nbtrain {FLAGS} --precision bf16-mixed" + DIGITS)  # a new model: its first engine
    assert_short_path(follower, live_engine(ip.user_ns["model"]))
    assert ip.user_ns["_nbtrain"].config.precision == "bf16-mixed"


def test_a_live_engine_switches_to_the_cells_precision_directly(ip):
    ip.run_cell(f"%%nbtrain {FLAGS} --lr 0.05" + DIGITS)
    engine = live_engine(ip.user_ns["model"])
    assert engine.precision.dtype is None  # 32-true: the switch below is a change
    follower = follow(ip, f"%%nbtrain {FLAGS} --precision bf16-mixed\npass")
    assert live_engine(ip.user_ns["model"]) is engine  # the same engine, switched
    assert_short_path(follower, engine)
    # The run's config is the cell's as it gave it: --lr of the cell before is neither kept nor given here.
    config = ip.user_ns["_nbtrain"].config
    assert (config.precision, config.lr) == ("bf16-mixed", None)
    assert config.given == {"max_steps", "batch_size", "precision"}, config.given


def calls_in(run) -> dict:
    """{check_runnable / adopt_settings: calls} while `run()` runs."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in COUNTED:
            calls[COUNTED[frame.f_code]] += 1
    earlier = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(earlier)
    return dict(calls)


def test_a_tools_trial_checks_this_machine_once():
    """A trial's engine is a fork of the live one, whose config was checked when it became the engine's: only the
    trial's own config is checked (and adopted), once."""
    recipe = regression_recipe()
    nbtrain.fit(recipe=recipe, max_steps=1, accelerator="cpu")

    def trial():
        with borrow(recipe.model, batch_size=8, max_steps=1) as lent:
            assert lent.engine.run(validate=False).status == "completed"
    assert calls_in(trial) == {"check_runnable": 1, "adopt_settings": 1}
