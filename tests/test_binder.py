"""Binder's files alone build an environment in which the quick-start notebook runs.

A fresh virtual environment (no system packages) gets exactly `pip install -r
binder/requirements.txt`, run from a copy of the repository's root as repo2docker does,
and the quick-start notebook is executed by a kernel of that environment. The one thing
left out is the extra index of CPU torch builds: this machine reaches only PyPI, and the
pinned torch lies on its disk (pip's find-links), so only that line is dropped.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from nbtrain.notebook.claims import TOO_BUSY, in_ci
from notebook_runner import CHECKS_PASSED, NOTEBOOKS, QUICK_START, ROOT, stale_cells

REQUIREMENTS = ROOT / "binder" / "requirements.txt"
_COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".nbtrain",
                                      ".pytest_cache", "test-artifacts")


def _offline_requirements(text: str) -> tuple[str, list[str]]:
    """The requirements without index options (which name hosts this machine cannot reach)."""
    kept, dropped = [], []
    for line in text.splitlines():
        (dropped if line.strip().startswith(("--extra-index-url", "--index-url", "-i ")) else kept).append(line)
    return "\n".join(kept) + "\n", dropped


def test_binder_requirements_install_this_package_and_a_cpu_torch():
    text = REQUIREMENTS.read_text()
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    assert "." in lines or "-e ." in lines, "binder must install this repository's package"
    assert any(line.startswith("torch==") for line in lines), "torch is pinned, so Binder builds stay reproducible"
    kept, dropped = _offline_requirements(text)
    assert all("download.pytorch.org/whl/cpu" in line for line in dropped) and len(dropped) == 1
    assert (ROOT / "binder" / "runtime.txt").read_text().strip().startswith("python-3.")


def _readme_install_lines() -> list[str]:
    """The README's first code block: the lines a newcomer pastes into a terminal."""
    text = (ROOT / "README.md").read_text()
    return text.split("```\n", 2)[1].replace("\\\n", " ").splitlines()  # a continued line is one command


def test_the_readmes_cpu_line_installs_torch_and_torchvision_together_before_the_package():
    # Torch alone from the CPU index, then `pip install -e .`: pip took the newest torchvision from PyPI,
    # which needs a newer torch, so the CPU torch was replaced by the CUDA build (~3 GB of nvidia-* wheels).
    lines = _readme_install_lines()
    cpu = [i for i, line in enumerate(lines) if "download.pytorch.org/whl/cpu" in line]
    assert len(cpu) == 1, lines
    words = shlex.split(lines[cpu[0]], comments=True)  # a commented-out line is not run by the block
    words = words[:next((i for i, w in enumerate(words) if w in ("&&", "||", ";")), len(words))]  # pip's own
    assert words[:2] == ["pip", "install"] and "--index-url" in words, lines[cpu[0]]
    options_with_values = {"--index-url", "--retries", "--timeout"}
    packages = [w for i, w in enumerate(words[2:], 2)
                if not w.startswith("-") and words[i - 1] not in options_with_values]
    assert sorted(re.split(r"[=<>!~]", p)[0] for p in packages) == ["torch", "torchvision"], lines[cpu[0]]
    package = lines.index("pip install -e .")
    assert cpu[0] < package, "the CPU builds go in first, so that `pip install -e .` keeps them"
    versions = dict(re.fullmatch(r"(torch|torchvision)==([\d.]+)", p).groups() for p in packages if "==" in p)
    if versions:  # pinned: a pair made for each other
        _a_pair(versions["torch"], versions["torchvision"])


def _a_pair(torch_version: str, torchvision_version: str) -> None:
    """torchvision 0.(N+15) is built against torch 2.N (0.15 with 2.0 ... 0.28 with 2.13)."""
    t, v = (tuple(int(x) for x in s.split(".")[:2]) for s in (torch_version, torchvision_version))
    assert t[0] == 2 and v == (0, t[1] + 15), f"torch {torch_version} with torchvision {torchvision_version}"


def test_binder_and_the_package_ask_for_a_torch_and_torchvision_made_for_each_other():
    pins = dict(re.findall(r"^(torch|torchvision)==([\d.]+)", REQUIREMENTS.read_text(), re.M))
    _a_pair(pins["torch"], pins["torchvision"])
    lowest = dict(re.findall(r'"(torch|torchvision)>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()))
    _a_pair(lowest["torch"], lowest["torchvision"])


def test_no_binder_badge_points_at_a_placeholder_account():
    # A badge to mybinder.org/v2/gh/OWNER/nbtrain opened nothing: the account that publishes this repository
    # is not known to its files, so the READMEs say how to open it on Binder instead of linking a guess.
    for readme in (ROOT / "README.md", ROOT / "notebooks" / "README.md"):
        text = readme.read_text()
        assert "OWNER" not in text and "mybinder.org/v2/gh/" not in text, readme
        assert "binder/requirements.txt" in text or "`binder/`" in text, f"{readme} says where Binder's files are"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_start_runs_in_a_fresh_environment_built_from_binder_files_alone():
    if not (NOTEBOOKS / QUICK_START).exists():
        pytest.fail(f"notebooks/{QUICK_START} is missing")
    work = Path(tempfile.mkdtemp(prefix="nbtrain-binder-"))  # mkdtemp: private (0700)
    try:
        repo = work / "repo"
        shutil.copytree(ROOT, repo, ignore=_COPY_IGNORE)
        requirements, _ = _offline_requirements(REQUIREMENTS.read_text())
        (work / "requirements.txt").write_text(requirements)
        venv = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        # --no-compile: byte-compiling all of torch at install took half of the install's 60 s here; the
        # modules the notebook imports are compiled as it imports them, and what is installed is the same.
        install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile",
                                  "-r", str(work / "requirements.txt")], cwd=repo, env=env, capture_output=True,
                                 text=True)
        assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
        # The package is installed, not imported from the copy: run from elsewhere.
        where = subprocess.run([str(python), "-c", "import nbtrain, torch; print(nbtrain.__file__, torch.__version__)"],
                               cwd=work, env=env, capture_output=True, text=True, check=True).stdout
        assert str(venv) in where, where
        run_dir = work / "run"
        run_dir.mkdir()
        executed = work / "executed.ipynb"
        ran = subprocess.run([str(python), str(ROOT / "tests" / "notebook_runner.py"), str(repo / "notebooks" / QUICK_START),
                              str(run_dir), "120", str(executed)], cwd=work, env={**env, "OMP_NUM_THREADS": "1"},
                             capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
        # the quick start's claims hold (its last cell asserts them; outside CI a busy machine may say it could not
        # show a speed claim, nbtrain/notebook/claims.py)
        assert CHECKS_PASSED in ran.stdout or (not in_ci() and TOO_BUSY in ran.stdout), ran.stdout[-3000:]
        kernel_line = next(line for line in ran.stdout.splitlines() if line.startswith("kernel:"))
        assert f"{venv}/bin/python" in kernel_line and f"{venv}/lib" in kernel_line, kernel_line
        # This run is also the quick start's run for tests/test_notebooks.py (one execution, not two): what the
        # stored notebook shows is what this code prints, only the numbers measured left out.
        stale = stale_cells(nbformat.read(NOTEBOOKS / QUICK_START, as_version=4), nbformat.read(executed, as_version=4))
        assert not stale, (f"{QUICK_START}'s stored outputs predate the code; run python notebooks/build.py 00 "
                           "--execute\n" + "\n".join(stale))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert not work.exists()
