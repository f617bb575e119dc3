"""How a checklist tool declares its options once, and how they are read, refused and spelled.

    @declare("find_lr", "nbtrain.tune.find_lr", "LR finder: ...", (
        option("steps", "whole", "rates to try", note="rates to try", low=5, flag="steps"),
        ...))
    def find_lr(model=None, ..., steps: int = 100, ...):

The defaults stay in the function's signature (the public API); the declaration says how each
value is read (a kind of options.py's vocabulary with its bounds, as TrainConfig's fields are; what is
allowed is written from them), the help, and
where the option shows: its `%%nbtrain` flag and its panel field. Calling the tool reads every
declared option first and raises one ToolOptionError listing every problem, so Python, the magic
and the panel refuse the same values in the same words, each naming the option its own way
(a speller). A tool that measured and cannot answer (nothing fits, the loss diverged) raises
ToolRefusal: a verdict, not a bad value and not a bug, and front-ends tell them apart by type.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from ..options import METAVARS, ConfigError, Problem, Reject, allowed_text, reader

NO_VALUE = object()  # a speller called without a value names the option alone ("lower --start-lr")
Speller = Callable[..., str]  # (keyword, value=NO_VALUE) -> how a front-end writes the option


def keyword_spelling(keyword: str, value=NO_VALUE) -> str:
    """Python's spelling: `steps=2`."""
    return keyword if value is NO_VALUE else f"{keyword}={value!r}"


@dataclass(frozen=True)
class ToolOption:
    """One keyword of a tool: how it is read, what is allowed, and where it shows."""
    keyword: str                  # the tool function's keyword argument
    kind: str                     # one of options.KINDS; the panel's widget and the flag's metavar follow it
    allowed: str                  # what a refusal says is allowed
    help: str
    reader: Callable = field(repr=False, compare=False)
    flag: str | None = None       # the %%nbtrain flag's name (`budget` is --budget); None: Python only
    metavar: str | None = None
    panel: str | None = None      # the panel field's label; None: not in the panel
    panel_value: Any = NO_VALUE   # the field's first value, where the default (None) cannot be shown


def option(keyword: str, kind: str, help: str, *, allowed: str = "", flag: str | None = None,
           metavar: str | None = None, panel: str | None = None, panel_value=NO_VALUE, noun: str | None = None,
           note: str = "", none: str = "", **reading) -> ToolOption:
    """A tool option; `reading` are the reader's bounds or choices (low=5, choices=(...), nullable=True).
    What is allowed is written from them (options.allowed_text, with `noun`, `note`, `none`) unless given."""
    allowed = allowed or allowed_text(kind, noun=noun, note=note, none=none, **reading)
    return ToolOption(keyword, kind, allowed, help, reader(kind, **reading), flag,
                      metavar or METAVARS.get(kind, kind.upper()), panel, panel_value)


@dataclass(frozen=True)
class JointProblem(Problem):
    """A problem between options (0 < start_lr < end_lr): each of them is named with its value."""
    others: tuple = ()  # (option, value) pairs after the first

    def pairs(self) -> tuple:
        return ((self.option, self.value),) + self.others


def _pairs(problem: Problem) -> tuple:
    return problem.pairs() if isinstance(problem, JointProblem) else ((problem.option, problem.value),)


class ToolOptionError(ConfigError):
    """Every bad option given to one tool, each naming the option, the value and what is allowed."""

    def __init__(self, problems: list[Problem], tool: "Tool | None" = None):
        self.tool = tool  # set by the declared tool's wrapper when a tool's body raises it
        super().__init__(problems)

    def text(self, spell: Speller = keyword_spelling) -> str:
        """The problems on one line, options spelled by `spell` (a flag, a panel field, a keyword)."""
        return "; ".join(", ".join(spell(o, v) for o, v in _pairs(p)) + f": allowed: {p.allowed}"
                         for p in self.problems)

    def render(self, name: Callable[[str], str] | None = None, quote: bool = True) -> str:
        # ConfigError's signature, for code that renders any ConfigError: `name` spells the option.
        if name is None:
            return self.text()
        return self.text(lambda o, v=NO_VALUE: name(o) + ("" if v is NO_VALUE else f"={v!r}" if quote else f" {v}"))

    def __str__(self) -> str:
        return f"{self.tool.public}: {self.text()}" if self.tool else self.text()


class ToolRefusal(RuntimeError):
    """A tool's verdict that it cannot answer (no batch fits, the loss diverged, no time to measure)."""

    def __init__(self, say: Callable[[Speller], str], tool: "Tool | None" = None):
        self.say, self.tool = say, tool
        super().__init__(say(keyword_spelling))

    def text(self, spell: Speller = keyword_spelling) -> str:
        return self.say(spell)

    def __str__(self) -> str:
        return f"{self.tool.public}: {self.text()}" if self.tool else self.text()


@dataclass(frozen=True)
class Tool:
    """One checklist tool: what it is called, its options, and how the front-ends show it."""
    name: str                     # the registry key and the %%nbtrain flag (find_lr is --find-lr)
    public: str                   # how Python calls it: nbtrain.tune.find_lr
    help: str
    options: tuple                # ToolOption, in the order flags and fields show them
    function: Callable = field(repr=False, compare=False)   # the checked function (what Python calls)
    defaults: dict = field(repr=False, compare=False)       # keyword -> default, from the signature
    label: str | None = None      # the panel button; None: no button
    figsize: tuple = (6, 3.2)     # the tool's plot, in the magic and the panel
    joint: Callable | None = field(default=None, repr=False, compare=False)  # read values -> [Problem]
    magic: bool = True            # a %%nbtrain flag (cache is Python only)

    def option(self, keyword: str) -> ToolOption | None:
        return next((o for o in self.options if o.keyword == keyword), None)

    def read(self, values: dict) -> dict:
        """`values` (only declared keywords are read) as the tool will use them; ToolOptionError lists
        every problem, and problems between options are checked with the defaults of those not given."""
        read, problems = {}, []
        for o in self.options:
            raw = values.get(o.keyword, self.defaults[o.keyword])
            try:
                read[o.keyword] = o.reader(raw)
            except Reject:
                problems.append(Problem(o.keyword, raw, o.allowed))
        if not problems and self.joint is not None:
            problems = self.joint(read)
        if problems:
            raise ToolOptionError(problems, self)
        return {k: v for k, v in read.items() if k in values}

    def spelling(self, name_of: Callable[[ToolOption], str | None]) -> Speller:
        """A front-end's speller: `name_of(option)` (None: the keyword) then the value as given (`--steps 2`)."""
        def spell(keyword: str, value=NO_VALUE) -> str:
            found = self.option(keyword)
            name = (name_of(found) if found is not None else None) or keyword
            return name if value is NO_VALUE else f"{name} {value}"
        return spell


def declare(name: str, public: str, help: str, options, *, label: str | None = None, figsize=(6, 3.2),
            joint=None, magic: bool = True):
    """Declare a tool: its options are read (and refused together) before its body runs."""
    def register(function):
        signature = inspect.signature(function)
        defaults = {k: p.default for k, p in signature.parameters.items() if p.default is not p.empty}
        missing = [o.keyword for o in options if o.keyword not in defaults]
        assert not missing, f"{function.__name__}: declared options without a default: {missing}"

        @functools.wraps(function)
        def checked(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.arguments.update(tool.read(bound.arguments))
            try:
                return function(*bound.args, **bound.kwargs)
            except (ToolOptionError, ToolRefusal) as error:
                error.tool = error.tool or tool  # its body names no tool; the message then does
                raise

        tool = Tool(name, public, help, tuple(options), checked, defaults, label, figsize, joint, magic)
        checked.tool = tool
        return checked
    return register
