"""`python -m nbtrain doctor`: whether the installed torch and torchvision load together, and what to run if not.

pip can end with a torch and a torchvision that were not built for each other: told `--index-url` of the CPU index
when that index does not answer, pip retries it and then takes both from whatever else is configured (a mirror given
as extra index, a folder of wheels), e.g. torch 2.13.0+cpu beside PyPI's torchvision 0.28.0. `import torchvision`
then fails with "operator torchvision::nms does not exist", first seen deep in a notebook. Installing again from
the same index gives the same pair, so the line printed here depends on whether the CPU index answers now: both
removed, then the CPU index's pair where it answers, the registry's pair (the CUDA build, ~6 GB) where it does not.
This is the one place that reads the pair; scripts/test.sh runs the doctor after every install, and nbtrain's own
import of torchvision (import_torchvision) says the same.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import ssl
import sys
import urllib.request

import torch

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
UNINSTALL = "pip uninstall -y torch torchvision && "  # `pip install` alone keeps a pair already there


def cpu_index() -> str:
    """The CPU index; NBTRAIN_CPU_INDEX replaces it (a mirror of it, or an address that does not answer)."""
    return os.environ.get("NBTRAIN_CPU_INDEX") or CPU_INDEX


def index_answers(index: str, timeout_s: float = 5.0) -> bool:
    """Whether `index` lists torch (HTTP 200 for its torch page) within timeout_s, with pip's certificate file
    (PIP_CERT) where one is set, as pip would."""
    url = index.rstrip("/") + "/torch/"
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            return response.status == 200
    except (OSError, ValueError):  # refused, no route, DNS, timeout, TLS, HTTP errors (URLError is an OSError)
        return False


def remedy(cpu_build: bool, index: str, index_answered: bool) -> str:
    """The line that installs a torch and torchvision built for each other here: both removed first, then one
    index's pair: the CPU index's where torch is a CPU build and that index answered, else the registry's."""
    if cpu_build and index_answered:
        return f"{UNINSTALL}pip install torch torchvision --index-url {index}  (the CPU index's pair; it answered)"
    why = f"the CPU index {index} did not answer, so " if cpu_build else ""
    return (f"{UNINSTALL}pip install torch torchvision  ({why}the registry's pair: on Linux the CUDA build, ~6 GB, "
            "which runs on a CPU too)")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _origin(version: str | None) -> str:
    """Which index built this version, read from its local label: the CPU index's builds end in +cpu."""
    return "the CPU index's build" if version and version.endswith("+cpu") else "the registry's build"


def _remedy() -> str:
    cpu = torch.version.cuda is None  # a +cpu build: its pair is the CPU index's, if that index answers
    index = cpu_index()
    return remedy(cpu, index, cpu and index_answers(index))


def torchvision_problem() -> str | None:
    """Why torchvision cannot be imported beside this torch (one line naming both and what to run), or None;
    None too where torchvision is not installed (nbtrain needs it only for its image examples)."""
    if _installed("torchvision") is None and "torchvision" not in sys.modules:
        return None
    try:
        importlib.import_module("torchvision")
    except Exception as error:  # a RuntimeError for a missing operator, an ImportError for a missing library
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        vision = _installed("torchvision")
        return (f"torch {torch.__version__} ({_origin(torch.__version__)}) and torchvision {vision} "
                f"({_origin(vision)}) do not load together ({cause}); run: {_remedy()}")
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
