"""How every nbtrain magic reads its line: shell words, split as a terminal splits them.

`--store "/tmp/a b/runs.sqlite"` is one value, without its quotes, in `%%nbtrain` and in each
line magic alike. IPython's own `parse_argstring` splits in shlex's non-POSIX mode (meant for
Windows paths), which keeps the quotes as part of the value, so the magics declared with
`@magic_arguments` are read through `parse` here instead.
"""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError


def split(magic: str, line: str) -> list[str]:
    """The line's words; unbalanced quotes are one line naming `magic` (e.g. '%nbtrain_runs')."""
    try:
        return shlex.split(line)
    except ValueError as error:  # "No closing quotation", "No escaped character"
        raise UsageError(f"{magic}: cannot read the flags ({error}): {line.strip()!r}; allowed: quotes in "
                         "pairs around a value with spaces, e.g. --store \"my runs/runs.sqlite\"") from None


def parse(function, line: str):
    """`line` read by the parser IPython built for a `@magic_arguments` magic, split as `split` does."""
    magic = "%" + function.__name__
    try:
        return function.parser.parse_args(split(magic, line))
    except UsageError as error:
        message = str(error)
        # argparse's messages ("argument --last: invalid int value") do not say which magic refused them.
        raise UsageError(message if message.startswith(magic + ":") else f"{magic}: {message}") from None
