"""Execute a tutorial notebook the way a user does: a fresh kernel, every cell in order."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHECKS_PASSED = "all checks passed"
QUICK_START = "00-quick-start.ipynb"  # run by the Binder test (tests/test_binder.py), in a fresh environment


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


WIDGET = "application/vnd.jupyter.widget-view+json"
# What a stored output and a fresh one may differ by without the code having changed: the numbers measured,
# which way a head to head went (faster, slower, no measurable difference, too noisy to tell), whether this
# execution's timing was too noisy to trust (said in words, a mark or a footnote), how busy the machine was, the warm-up found, a
# duration's unit, where the run store lies, column widths. What stays is the code's own text: its labels,
# tables, what each verdict is about, and the words around it.
_MEASURED = [
    # A comparison withheld because the machine was busier in one run is a verdict too (runs/compare.py).
    (re.compile(r"the machine was (busier|full) during .*?: the difference may be the machine's"), "VERDICT (N-N)"),
    # ... and one withheld because a run was too short to read the machine's load beside it
    (re.compile(r"too short to compare \(.*? of steady steps\)"), "VERDICT (N-N)"),
    (re.compile(r"^too short to compare: runs taken at different times.*$", re.M), ""),
    # ... one within how far repeats of one settings read apart; and the mark of a verdict no repeat qualifies
    (re.compile(r"within the machine's own spread \(.*?apart\)"), "VERDICT (N-N)"),
    (re.compile(r"^within the machine's own spread: .*$", re.M), ""),
    (re.compile(r"(?<=\))†"), ""),
    (re.compile(r"^† no run of either's settings.*$", re.M), ""),
    # Which side reached the worse final held-out loss first: ab's rounds (measure/learned.py) and compare's runs
    # (runs/held_out_time.py), with the brackets and ratios that say it
    # ("B at least 6x sooner (in 3 rounds: ... (by 0.5 s))" where a side was there by its first evaluation)
    (re.compile(r"; (\w+ (at least )?[\d.e+]+x (sooner|later)|no measurable difference in that time)"
                r" \((?:[^()]|\([^()]*\))*\)"), "; REACHED"),
    (re.compile(r"(learns (faster|slower)|no measurable difference) in wall time \((?:[^()]|\([^()]*\))*\)"),
     "REACHED IN WALL TIME"),
    # Which way nbtrain.ab's race of what is learned in equal time went (measure/learned.py), or that it was not run
    (re.compile(r"learns (worse|better|as well) in the same time( \(no measurable difference in loss\))?"
                r"|what it learns was not measured: [^(;]*"), "LEARNED"),
    # Which way a verdict went, with its interval in the words that way gives it ("(95% interval 1.2-1.4)" or "(0.9-1.1)")
    (re.compile(r"([\d.]+x (faster|slower)|[\d.]+x(?= \([\d.]+-)|no measurable difference|not measurably"
                r"|too (noisy|few \w+) to tell)( \((95% interval )?[\d.]+-[\d.]+\))?"), "VERDICT (N-N)"),
    # Pairs of ab's blocks set aside where another process took more of the machine during one (measure/load.py)
    (re.compile(r"; \d+ of \d+ pairs set aside: other processes took more of the machine during one of their blocks"),
     ""),
    (re.compile(r"; spread \d+% between blocks: too noisy to trust"), ""),
    # How busy the machine was (measure/load.py): said beside a rate only where other processes took a share.
    (re.compile(r"; other processes took [^;\]\n]*?cores(, and its threads waited [^;\]\n]*?CPU)?"), ""),
    (re.compile(r"^\* too noisy to trust.*$", re.M), ""),
    # A speed claim a busy machine kept from showing (nbtrain/notebook/claims.py): how busy it was, not the code
    (re.compile(r"^this machine is too busy to show the claim now \(.*$", re.M), ""),
    (re.compile(r"^the other checks passed; this machine is too busy to show the claim now: .*$", re.M),
     "all checks passed"),
    (re.compile(r"(?<=\))\*|(?<=\)) noisy\b"), ""),
    (re.compile(r", warm-up [\d.,]+ (ms|s)\b"), ""),  # in the call's time split only where a warm-up was found
    (re.compile(r"warm-up \d+ steps?, [\d.,]+ (ms|s)|no warm-up"), "WARM-UP"),
    (re.compile(r"\S*runs\.sqlite"), "runs.sqlite"),
    (re.compile(r"\d+ min \d+ s|[\d.,]+ (ms|s)\b"), "N s"),
    (re.compile(r"\d[\d,]*(\.\d+)?(e[-+]?\d+)?"), "N"),
    (re.compile(r"[ \t]+"), " "),
]


def output_words(cell) -> list[str]:
    """A code cell's text output with what a measurement varies left out (_MEASURED), its lines sorted: two
    executions of the same code give the same words, an output stored before the code changed gives others."""
    parts = []
    for out in cell.get("outputs", []):
        if WIDGET in out.get("data", {}):
            parts.append("[widget]")  # stored as a placeholder by notebooks/build.py
        elif out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out and "text/plain" in out.data:
            parts.append(out.data["text/plain"])
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    text = "\n".join(parts).replace("[interactive widget: shown live when the notebook runs]", "[widget]")
    for pattern, instead in _MEASURED:
        text = pattern.sub(instead, text)
    return sorted(line.strip() for line in text.splitlines() if line.strip())  # a table's rows: in measured order


def stale_cells(stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """The code cells whose stored output is not what the current code prints, each with both versions."""
    out = []
    code = [(a, b) for a, b in zip(stored.cells, fresh.cells) if a.cell_type == "code"]
    for number, (old, new) in enumerate(code, 1):
        if output_words(old) != output_words(new):
            out.append(f"code cell {number} ({old.source.splitlines()[0][:60]!r}):\n  stored: "
                       f"{output_words(old)}\n  fresh:  {output_words(new)}")
    return out


if __name__ == "__main__":  # used by the Binder test inside a fresh virtual environment
    # argv: the notebook, the kernel's folder, the cell timeout and, optionally, where to write the executed
    # notebook (without the harness's cell), so the caller can compare its outputs with the stored ones.
    target, workdir, timeout = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    nb = without_outputs(target)
    # One cell of the harness's own after the notebook's: which interpreter the kernel ran.
    nb.cells.append(nbformat.v4.new_code_cell("import sys, nbtrain\nprint('kernel:', sys.executable, nbtrain.__file__)"))
    ran = execute(nb, workdir, timeout, this_checkout=False)
    print(text_of(ran.cells[-2]))
    print(text_of(ran.cells[-1]))
    if len(sys.argv) > 4:
        harness = ran.cells.pop()
        nbformat.write(ran, sys.argv[4])
        ran.cells.append(harness)
