"""scripts/test.sh installs torch as the README says: the CPU builds first on a machine without an NVIDIA GPU.

PyPI's torch for Linux is the CUDA build, with ~15 nvidia-* wheels (several GB) a laptop cannot use. The
decision is scripts/torch_index.sh's, run here without network: a Python without torch (a fresh venv) or
with it (this one), a PATH that has or lacks `nvidia-smi` (a stand-in script saying what nvidia-smi says),
and NBTRAIN_TORCH_INDEX. The pip line it leads to is the README's own line.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DECIDE = ROOT / "scripts" / "torch_index.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ONE_GPU = "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n"
NO_DRIVER = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> str:
    """A real Python whose environment has no torch: a fresh venv (no pip, no system site-packages)."""
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    return str(env / "bin" / "python")


def decide(tmp_path, python: str, nvidia_smi: str | None = None, system: str = "Linux", choice: str | None = None):
    """(exit code, the word printed, stderr) of torch_index.sh with a PATH of only what it uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("grep", "env", "sh"):
        (bin_dir / tool).unlink(missing_ok=True)
        (bin_dir / tool).symlink_to(shutil.which(tool))
    fakes = {"nvidia-smi": nvidia_smi, "uname": f"#!/bin/sh\necho {system}\n"}
    for name, text in fakes.items():
        (bin_dir / name).unlink(missing_ok=True)
        if text is not None:
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), **({"NBTRAIN_TORCH_INDEX": choice} if choice is not None else {})}
    done = subprocess.run([shutil.which("bash"), str(DECIDE), python], env=env, capture_output=True, text=True)
    return done.returncode, done.stdout.strip(), done.stderr.strip()


@pytest.mark.parametrize("nvidia_smi, system, choice, expected", [
    (None, "Linux", None, "cpu"),            # a laptop: no nvidia-smi at all
    (NO_DRIVER, "Linux", None, "cpu"),       # nvidia-smi without a driver: no GPU to use
    (ONE_GPU, "Linux", None, "pypi"),        # a GPU: PyPI's CUDA build
    (None, "Darwin", None, "pypi"),          # macOS: PyPI's build is the CPU one
    (ONE_GPU, "Linux", "cpu", "cpu"),        # the variable decides either way
    (None, "Linux", "pypi", "pypi"),
])
def test_without_torch_the_cpu_builds_are_chosen_where_no_nvidia_gpu_is_listed(tmp_path, no_torch, nvidia_smi,
                                                                               system, choice, expected):
    assert decide(tmp_path, no_torch, nvidia_smi, system, choice) == (0, expected, "")


@pytest.mark.parametrize("choice", [None, "cpu", "pypi"])
def test_a_torch_already_installed_is_kept_and_nothing_is_fetched(tmp_path, choice):
    assert decide(tmp_path, sys.executable, None, "Linux", choice) == (0, "installed", "")


def test_a_bad_choice_is_one_line_naming_the_variable_the_value_and_what_is_allowed(tmp_path, no_torch):
    code, out, err = decide(tmp_path, no_torch, choice="cuda; touch hacked")
    assert code == 2 and out == "" and not (tmp_path / "hacked").exists()
    assert err.startswith("scripts/test.sh: NBTRAIN_TORCH_INDEX=cuda\\;\\ touch\\ hacked: allowed: cpu") and "\n" not in err


def pip_line(lines: list[str]) -> list[str]:
    """The words of the one line among `lines` that installs from the CPU index (comments dropped)."""
    found = [line for line in lines if CPU_INDEX in line.split("#")[0]]
    assert len(found) == 1, found
    return shlex.split(found[0].rstrip(" \\"), comments=True)  # a line continued (|| a fallback) ends in "\\"


def without_network_options(words: list[str]) -> list[str]:
    """pip's words less -q and the network options (--retries N, --timeout S) a script may add."""
    out, skip = [], False
    for word in words:
        if skip or word == "-q":
            skip = False
            continue
        skip = word in ("--retries", "--timeout")
        if not skip:
            out.append(word)
    return out


def test_the_scripts_cpu_line_is_the_readmes_and_comes_before_the_package():
    readme = (ROOT / "README.md").read_text().split("```\n", 2)[1].splitlines()  # the install block
    script = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    ours, theirs = pip_line(script), pip_line(readme)
    assert without_network_options(ours) == theirs  # the same packages, from the same index
    cpu = next(i for i, line in enumerate(script) if CPU_INDEX in line)
    decided = next(i for i, line in enumerate(script) if "scripts/torch_index.sh python" in line)
    activated = script.index(". .venv/bin/activate")
    package = next(i for i, line in enumerate(script) if line.startswith("pip install") and "-e" in line.split())
    assert activated < decided < cpu < package  # the venv's own python is asked; the CPU builds go in first
