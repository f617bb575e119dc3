"""scripts/test.sh installs torch as the README says: the CPU builds first on a machine without an NVIDIA GPU.

PyPI's torch for Linux is the CUDA build, with ~15 nvidia-* wheels (several GB) a laptop cannot use. The
decision is scripts/torch_index.sh's, run here without network: a Python without torch (a fresh venv) or
with it (this one), a PATH that has or lacks `nvidia-smi` (a stand-in script saying what nvidia-smi says),
and NBTRAIN_TORCH_INDEX. The pip line it leads to is the README's own line.
"""
import os
import re
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
    """The words of the one command among `lines` that installs from the CPU index, its continued lines joined
    (comments dropped)."""
    commands, current = [], ""
    for line in lines:
        current += line.split(" #")[0].rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        commands.append(current)
        current = ""
    found = [command for command in commands if CPU_INDEX in command]
    assert len(found) == 1, found
    return shlex.split(found[0], comments=True)


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
    assert without_network_options(ours) == without_network_options(theirs)  # the same command, the same index
    cpu = next(i for i, line in enumerate(script) if CPU_INDEX in line)
    decided = next(i for i, line in enumerate(script) if "scripts/torch_index.sh python" in line)
    activated = script.index(". .venv/bin/activate")
    package = next(i for i, line in enumerate(script) if line.startswith("pip install") and "-e" in line.split())
    assert activated < decided < cpu < package  # the venv's own python is asked; the CPU builds go in first


# --- a torch and torchvision that do not load together: found where nbtrain decides about torch ---------------

BROKEN_PAIR = "raise RuntimeError('operator torchvision::nms does not exist')\n"  # what a mismatched pair raises
UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: nothing listens, the connection is refused at once
REGISTRY_PAIR = "run: pip uninstall -y torch torchvision && pip install torch torchvision  (the CPU index "


def stand_in(tmp_path) -> Path:
    """A folder holding a torchvision that fails at import as one built for another torch does."""
    (tmp_path / "torchvision").mkdir(exist_ok=True)
    (tmp_path / "torchvision" / "__init__.py").write_text(BROKEN_PAIR)
    return tmp_path


@pytest.fixture
def broken_pair(tmp_path, monkeypatch):
    """This process, its torchvision the stand-in (first on the path, not yet imported), its torch a CPU build,
    the CPU index one that does not answer."""
    import torch
    monkeypatch.syspath_prepend(str(stand_in(tmp_path)))
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setenv("NBTRAIN_CPU_INDEX", UNREACHABLE)


@pytest.fixture
def answering_index(tmp_path, monkeypatch):
    """A real index on this machine that lists torch (a folder served over HTTP), named as the CPU index."""
    import functools
    import http.server
    import threading
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<a href='torch-2.4.0+cpu.whl'>torch</a>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index"))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/"
    monkeypatch.setenv("NBTRAIN_CPU_INDEX", index)
    yield index
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_the_doctor_command_names_a_pair_that_does_not_load_and_the_line_that_installs_one_that_does(tmp_path):
    sitecustomize = stand_in(tmp_path) / "sitecustomize.py"
    sitecustomize.write_text("import torch\ntorch.version.cuda = None\n")  # this torch reads as a +cpu build
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "NBTRAIN_CPU_INDEX": UNREACHABLE}
    done = subprocess.run([sys.executable, "-m", "nbtrain", "doctor"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "do not load together (operator torchvision::nms does not exist); " + REGISTRY_PAIR in done.stdout


def test_the_doctor_says_whether_the_pair_loads(broken_pair, capsys):
    from nbtrain import doctor
    assert doctor.main() == 1
    out = capsys.readouterr().out
    assert "torch " in out and "(CPU build)" in out and "operator torchvision::nms does not exist" in out, out
    assert REGISTRY_PAIR in out and out.rstrip().endswith("the pair above does not load; run the line it names")


def test_where_the_cpu_index_does_not_answer_the_doctor_names_the_registrys_pair_not_the_index_that_gave_this_one(
        broken_pair, capsys):
    """Installing again from the CPU index that did not answer gives the same mismatched pair: a circle."""
    from nbtrain import doctor
    doctor.main()
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("torchvision: "))
    run = line.split("; run: ", 1)[1]
    assert run.startswith("pip uninstall -y torch torchvision && pip install torch torchvision  (")
    assert "--index-url" not in run and f"the CPU index {UNREACHABLE} did not answer" in run and "~6 GB" in run
    assert "(the registry's build) and torchvision" in line or "(the CPU index's build) and torchvision" in line


def test_where_the_cpu_index_answers_the_doctor_names_its_pair_after_removing_both(broken_pair, answering_index,
                                                                                     capsys):
    from nbtrain import doctor
    doctor.main()
    out = capsys.readouterr().out
    assert (f"run: pip uninstall -y torch torchvision && pip install torch torchvision --index-url {answering_index}"
            "  (the CPU index's pair; it answered)") in out, out


def test_a_cuda_torch_whose_torchvision_does_not_load_is_sent_to_the_registrys_pair():
    from nbtrain.doctor import remedy
    for answered in (True, False):  # the CPU index is not asked about a CUDA build's pair
        line = remedy(cpu_build=False, index=UNREACHABLE, index_answered=answered)
        assert line.startswith("pip uninstall -y torch torchvision && pip install torch torchvision  (the registry")


def test_the_doctor_says_ok_for_the_pair_installed_here(capsys):
    from nbtrain import doctor
    assert doctor.main() == 0 and capsys.readouterr().out.rstrip().endswith("nbtrain doctor: ok")


def test_nbtrains_own_import_of_torchvision_says_the_same(broken_pair):
    from nbtrain.doctor import import_torchvision
    from toggle_recipes import image_recipe  # the image recipe the tests train imports torchvision through it
    for importing in (import_torchvision, image_recipe):
        with pytest.raises(ImportError, match=r"^nbtrain: torch .* do not load together \(operator torchvision::nms "
                                              r"does not exist\); run: pip uninstall -y torch torchvision && "):
            importing()


def test_the_readmes_install_removes_a_pair_that_does_not_load_before_the_package_brings_the_registrys():
    """The README's CPU line, then: import torchvision, and where that fails remove both (the one-pass install
    where the CPU index does not answer); scripts/test.sh runs the same command."""
    readme = (ROOT / "README.md").read_text().split("```\n", 2)[1].splitlines()
    words = pip_line(readme)
    check = words.index("&&")
    assert words[check + 1:check + 4] == ["python", "-c", "import torchvision"]
    assert words[words.index("||") + 1:] == ["pip", "uninstall", "-y", "torch", "torchvision"]
    assert "--retries" in words  # the index that does not answer is given up after one retry, not five


def test_the_readme_runs_the_doctor_before_the_fast_subset_and_states_its_time_with_the_load():
    readme = (ROOT / "README.md").read_text()
    work = readme[readme.index("While you work"):]
    assert -1 < work.find("python -m nbtrain doctor") < work.find('python -m pytest -m "not slow"')
    assert "operator torchvision::nms does not exist" in work.split("## ")[0]  # why it goes first
    assert "under 5 minutes" not in readme
    assert re.search(r"The fast subset .{0,300}? [\d.]+ minutes on 2 cores, measured at load [\d-]+", work, re.S), work


def test_the_script_checks_the_pair_after_every_install_and_the_readme_says_how():
    script = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    package = next(i for i, line in enumerate(script) if line.startswith("pip install") and "-e" in line.split())
    doctor = [i for i, line in enumerate(script) if line.startswith("python -m nbtrain doctor")]  # not under an `if`
    tests = next(i for i, line in enumerate(script) if line.startswith("python -m pytest"))
    assert doctor and package < doctor[0] < tests
    assert "python -m nbtrain doctor" in (ROOT / "README.md").read_text()


def test_the_readmes_block_says_jupyter_lab_needs_allow_root_as_root_and_notebook_checkpoints_are_ignored():
    block = (ROOT / "README.md").read_text().split("```\n", 2)[1].splitlines()
    jupyter = next(line for line in block if line.startswith("jupyter lab"))
    assert "--allow-root" in jupyter and "root" in jupyter.split("#", 1)[1]  # said beside the line, not run by it
    # the fast subset needs pytest: the README says to install the test extras before it, in that venv
    readme = (ROOT / "README.md").read_text()
    assert -1 < readme.find('pip install -e ".[test]"') < readme.find('python -m pytest -m "not slow"')
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".ipynb_checkpoints/" in ignored or "notebooks/.ipynb_checkpoints/" in ignored
