"""`python -m nbtrain doctor`: whether the installed torch and torchvision load together, and what to run if not.

pip can end with a torch and a torchvision that were not built for each other (a mirror that holds torch's CPU
build but not the torchvision built beside it): `import torchvision` then fails with "operator torchvision::nms
does not exist", first seen deep in a notebook. This is the one place that reads the pair; scripts/test.sh runs
the doctor after every install, and nbtrain's own import of torchvision (import_torchvision) says the same.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import sys

import torch

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _remedy() -> str:
    cpu = torch.version.cuda is None  # a +cpu build: the pair from the CPU index
    index = f" --index-url {CPU_INDEX}" if cpu else ""
    return (f"pip install --force-reinstall torch torchvision{index}  (both from one index, so they are built for "
            "each other)")


def torchvision_problem() -> str | None:
    """Why torchvision cannot be imported beside this torch (one line naming both and what to run), or None;
    None too where torchvision is not installed (nbtrain needs it only for its image examples)."""
    if _installed("torchvision") is None and "torchvision" not in sys.modules:
        return None
    try:
        importlib.import_module("torchvision")
    except Exception as error:  # a RuntimeError for a missing operator, an ImportError for a missing library
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"torch {torch.__version__} and torchvision {_installed('torchvision')} do not load together "
                f"({cause}); run: {_remedy()}")
    return None


def import_torchvision():
    """torchvision, or an ImportError saying which pair does not load and what to run."""
    problem = torchvision_problem()
    if problem is not None:
        raise ImportError(f"nbtrain: {problem}")
    return importlib.import_module("torchvision")


def report() -> tuple[list[str], bool]:
    """(lines to print, whether everything nbtrain decides about torch is usable)."""
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    lines = [f"torch {torch.__version__} ({build} build)"]
    vision = _installed("torchvision")
    problem = torchvision_problem()
    if problem is not None:
        lines.append("torchvision: " + problem)
    else:
        lines.append(f"torchvision {vision}: loads with this torch" if vision else
                     "torchvision: not installed (only the image examples and notebooks 01 and 06 need it)")
    return lines, problem is None


def main() -> int:
    lines, ok = report()
    print("\n".join(lines))
    print("nbtrain doctor: ok" if ok else "nbtrain doctor: the pair above does not load; run the line it names")
    return 0 if ok else 1
