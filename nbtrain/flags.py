"""Command-line style flags for every TrainConfig option (`--batch-size 64`), for argparse users.

Flags pass their text through untouched: TrainConfig reads and checks every value, so
the command line, the cell magic and the panel report the same errors.
"""
from __future__ import annotations

import argparse

from .config import TrainConfig, options
from .options import flag_name


def negated_flag_name(option: str) -> str:
    """`--no-shuffle` for a switch: false."""
    return flag_name(option).replace("--", "--no-", 1)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training configuration (TrainConfig)")
    for name, (option, default) in options().items():
        text = f"{option.help}; {option.allowed} (default: {default})"
        if option.kind == "switch":
            # `--pin-memory` alone means true; `--pin-memory false` is accepted too, and so is `--no-pin-memory`,
            # the form argparse's BooleanOptionalAction (and most command lines) use for false.
            group.add_argument(flag_name(name), dest=name, nargs="?", const="true", default=argparse.SUPPRESS,
                               metavar="BOOL", help=text)
            group.add_argument(negated_flag_name(name), dest=name, action="store_const", const="false",
                               default=argparse.SUPPRESS, help=f"the same as {flag_name(name)} false")
        else:
            group.add_argument(flag_name(name), dest=name, default=argparse.SUPPRESS,
                               metavar=option.metavar, help=text)


def config_from_flags(namespace: argparse.Namespace, base: TrainConfig | None = None) -> TrainConfig:
    """The config the given flags describe, on top of `base` (validated by TrainConfig)."""
    names = set(options())
    given = {k: v for k, v in vars(namespace).items() if k in names}
    return (base or TrainConfig()).replace(**given) if base is not None else TrainConfig(**given)
