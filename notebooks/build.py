"""Build the tutorial notebooks from their sources in notebooks/src/, optionally executed.

Each source is a plain text file in the "percent" layout, so a notebook is reviewed and
diffed as code, not as JSON:

    # %% [markdown]
    # # A title
    # Prose, each line starting with "# ".
    # %%
    result = nbtrain.fit(...)

A line `# requires: nbtrain.tools.leaks` before the first cell names the modules the notebook
teaches; the notebook tests skip it, saying so, where they are missing.

    python notebooks/build.py              # write notebooks/NN-*.ipynb without outputs
    python notebooks/build.py --execute    # ... executed in a real kernel, outputs kept
    python notebooks/build.py 03 --execute # only the notebooks whose name starts with 03

Executed notebooks keep their outputs (small text, figures at 120 dpi) so that they read well
on GitHub; nbclient records no timings, so a rebuild changes only what changed. The kernel runs
as the notebook tests run it (one intra-op thread), with the run store named relative to its
folder, so no output shows a path of the machine that built it.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
WIDGET = "application/vnd.jupyter.widget-view+json"
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def read_requires(text: str) -> list[str]:
    """Modules named on a `# requires: a, b` line before the first cell (features a notebook teaches)."""
    for line in text.splitlines():
        if line.startswith("# %%"):
            break
        if line.startswith("# requires:"):
            return [name.strip() for name in line.split(":", 1)[1].split(",") if name.strip()]
    return []


def read_cells(text: str) -> list[tuple[str, str]]:
    """(kind, source) pairs from a percent-layout text; kind is 'markdown' or 'code'."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            cells.append(("markdown" if "[markdown]" in line else "code", []))
            continue
        if not cells:
            if line.strip() and not line.startswith("# requires:"):
                raise ValueError(f"text before the first '# %%' marker: {line!r}")
            continue
        kind, lines = cells[-1]
        if kind == "markdown":
            if line and not line.startswith("#"):
                raise ValueError(f"a markdown line must start with '#': {line!r}")
            line = line[2:] if line.startswith("# ") else line[1:]
        lines.append(line)
    return [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells if "".join(lines).strip()]


def build(source: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata["language_info"] = {"name": "python"}
    text = source.read_text()
    requires = read_requires(text)
    if requires:
        nb.metadata["nbtrain"] = {"requires": requires}
    for kind, text in read_cells(text):
        maker = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(maker(text))
    # Stable cell ids, so a rebuild of an unchanged source is byte-identical.
    for index, cell in enumerate(nb.cells):
        cell["id"] = f"{source.stem[:2]}-{index:02d}"
    return nb


def execute(nb: nbformat.NotebookNode, workdir: Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel started in `workdir`, as a user would."""
    from nbclient import NotebookClient
    # Widget state (a panel's live plot frames) is not kept: it is large and GitHub does not render it.
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False, store_widget_state=False,
                            resources={"metadata": {"path": str(workdir)}})
    saved = dict(os.environ)
    # As the notebook tests run them (tests/notebook_runner.py): one intra-op thread on a shared machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The run store named relative to the kernel's (temporary) folder, so stored outputs show no machine path.
    os.environ["NBTRAIN_STORE"] = os.path.join(".nbtrain", "runs.sqlite")
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if WIDGET in output.get("data", {}):
                # Without its state a widget's stored text is its first frame ("0%|  | 0/135");
                # say what it is instead.
                output["data"] = {"text/plain": "[interactive widget: shown live when the notebook runs]"}
    return nb


def sources(prefixes: list[str]) -> list[Path]:
    found = sorted(SOURCES.glob("[0-9][0-9]-*.py"))
    return [s for s in found if not prefixes or any(s.name.startswith(p) for p in prefixes)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("only", nargs="*", help="name prefixes (e.g. 03) of the notebooks to build")
    parser.add_argument("--execute", action="store_true", help="run each notebook and keep its outputs")
    parser.add_argument("--nbtrain-from", metavar="DIR", default=str(HERE.parent),
                        help="the checkout whose nbtrain the kernel imports (default: this one)")
    args = parser.parse_args(argv)
    chosen = sources(args.only)
    if not chosen:
        parser.error(f"no source in {SOURCES} starts with {' or '.join(args.only)}")
    import tempfile
    for source in chosen:
        nb = build(source)
        target = HERE / (source.stem + ".ipynb")
        if args.execute:
            with tempfile.TemporaryDirectory(prefix="nbtrain-build-") as work:
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [args.nbtrain_from, os.environ.get("PYTHONPATH")]))
                execute(nb, Path(work))
        nbformat.validate(nb)
        nbformat.write(nb, target)
        print(f"wrote {target.relative_to(HERE.parent)}{' (executed)' if args.execute else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
