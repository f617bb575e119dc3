"""Execute a tutorial notebook the way a user does: a fresh kernel, every cell in order."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHECKS_PASSED = "all checks passed"


def stored_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))


def without_outputs(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


# Any x86 CPU runs as one with AVX2 and no more: PyTorch's AVX2 kernels, and oneDNN kept off AVX-512 and AMX,
# so bfloat16 is emulated by PyTorch as on a CPU without bfloat16 instructions (most laptops).
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def kernel_env() -> dict:
    """This checkout's nbtrain first on the kernel's path; one intra-op thread on a shared box."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def execute(nb: nbformat.NotebookNode, workdir: Path, cell_timeout: int, this_checkout: bool = True,
            env: dict | None = None):
    """Run every cell; raises nbclient's CellExecutionError (with the cell and traceback) on failure.

    `this_checkout=False` leaves the environment alone (the kernel imports the installed nbtrain);
    `env` adds variables to the kernel's environment (AVX2_ONLY).
    """
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(workdir)}})
    saved = dict(os.environ)
    # Built before os.environ is cleared: kernel_env starts from it (built after, the kernel had only PYTHONPATH
    # and OMP_NUM_THREADS, and no variable of the caller's reached it).
    kernel = {**(kernel_env() if this_checkout else saved), **(env or {})}
    os.environ.clear()
    os.environ.update(kernel)  # the kernel process inherits this environment
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out and "text/plain" in out.data:
            parts.append(out.data["text/plain"])
    return "".join(parts)


if __name__ == "__main__":  # used by the Binder test inside a fresh virtual environment
    target, workdir, timeout = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    nb = without_outputs(target)
    # One cell of the harness's own after the notebook's: which interpreter the kernel ran.
    nb.cells.append(nbformat.v4.new_code_cell("import sys, nbtrain\nprint('kernel:', sys.executable, nbtrain.__file__)"))
    ran = execute(nb, workdir, timeout, this_checkout=False)
    print(text_of(ran.cells[-2]))
    print(text_of(ran.cells[-1]))
