"""The engine side never imports Jupyter; the demo runs from the command line."""
import subprocess
import sys


def test_engine_modules_import_neither_ipython_nor_ipywidgets():
    code = ("import sys, nbtrain, nbtrain.engine.loop, nbtrain.config, nbtrain.recipe, nbtrain.engine.data, nbtrain.engine.dist, "
            "nbtrain.engine.precision, nbtrain.demo, nbtrain.api, nbtrain.progress, nbtrain.plotting\n"
            "import importlib.util\n"
            "for name in ('nbtrain.distributed.launch', 'nbtrain.distributed.worker', 'nbtrain.slurm', 'nbtrain.tools.diagnose', 'nbtrain.tools.tune',"
            " 'nbtrain.tools.checklist', 'nbtrain.runs.store'):\n"
            "    if importlib.util.find_spec(name): __import__(name)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'ipykernel')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_demo_trains_prints_a_summary_and_writes_a_loss_plot(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nbtrain", "demo", "--max-epochs", "3", "--quiet",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for label in ("samples/s", "total time", "peak memory", "loss first -> last", "held-out loss / accuracy"):
        assert label in done.stdout
    png = tmp_path / "nbtrain-demo-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_demo_flag_is_one_line_naming_flag_value_and_allowed():
    done = subprocess.run([sys.executable, "-m", "nbtrain", "demo", "--batch-size", "0", "--precision", "fp8"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--precision=fp8: one of 32-true" in done.stderr
    assert "--batch-size=0: a whole number from 1" in done.stderr
    assert "Traceback" not in done.stderr
