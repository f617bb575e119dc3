"""The user's sbatch options, checked, as submitit's parameters.

`{"partition": "gpu", "time": "01:00:00", "exclusive": True}` -> submitit parameters: `time` in
minutes (submitit reasons about it when the job is signalled), every other option passed through
to the `#SBATCH` lines (submitit quotes each value). Options that the config or submitit decide
are refused with the reason.
"""
from __future__ import annotations

import re

from .launchers.base import LauncherOptionError

# The config decides the world; submitit the output files, the signal and the task command.
_FROM_CONFIG = {"nodes", "ntasks_per_node", "ntasks"}
_OWN_OPTIONS = _FROM_CONFIG | {"output", "error", "open_mode", "signal", "wrap", "parsable", "wait", "array",
                               "setup", "teardown", "srun_args", "use_srun", "additional_parameters",
                               "signal_delay_s", "stderr_to_stdout", "map_count", "array_parallelism"}
_OPTION_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z")


class SlurmOptionError(LauncherOptionError):
    """A bad sbatch option: names the option, the value and what is allowed."""


def check_options(options: dict) -> dict:
    """The options as they will be passed (flags without value as True; False/None dropped), or SlurmOptionError."""
    out = {}
    for name, value in options.items():
        if not _OPTION_NAME.match(name):
            raise SlurmOptionError(f"sbatch option {name!r}: allowed: a long option name in lowercase with _ for - "
                                   f"(partition, time, gpus_per_node, ...)")
        if name in _OWN_OPTIONS:
            hint = "set num_nodes / devices in the config" if name in _FROM_CONFIG else \
                "nbtrain sets it through submitit (signal_delay_s= changes when the requeue signal comes)"
            raise SlurmOptionError(f"sbatch option {name}={value!r}: not allowed here: {hint}")
        if value is None or value is False:
            continue
        if value is not True:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise SlurmOptionError(f"sbatch option {name}={value!r}: allowed: a string, a number, or True for a "
                                       f"flag without value")
            if not str(value) or any(c in str(value) for c in "\n\r\0"):
                raise SlurmOptionError(f"sbatch option {name}={value!r}: allowed: a non-empty value on one line")
        if name == "time":
            value = minutes(value)
        out[name] = value
    return out


def minutes(limit) -> int:
    """A SLURM time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; 0 or "infinite": none) in whole
    minutes, as submitit takes it."""
    text = str(limit).strip()
    if text in ("infinite", "UNLIMITED"):
        return 0
    found = _TIME.match(text)
    if isinstance(limit, float) or not found:
        raise SlurmOptionError(f"sbatch option time={limit!r}: allowed: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = found.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # MM[:SS]
        seconds = int(a) * 60 + int(b or 0)
    return -(-seconds // 60)
