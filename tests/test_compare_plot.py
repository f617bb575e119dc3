"""nbtrain.compare's figure agrees with its table, and a compare is shown as every result is: print()
gives its table, `.plot(path)` saves its figure, and a notebook shows a result's figure once (issue 53.6-7)."""
import numpy as np
import pytest

import nbtrain
from nbtrain import TrainConfig
from nbtrain.format import number


def _run_of(durations, name, batch=64):
    """A run whose steps took `durations` seconds (its summary made the way a real run's is)."""
    from nbtrain.metrics import MetricsLog
    from nbtrain.runs.result import RunResult, summarize
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 1}, "info": {"samples_start": 0}})
    times = np.cumsum(durations).tolist()
    steps = list(range(1, len(times) + 1))
    log.emit({"type": "steps", "rows": {"step": steps, "samples": [batch * s for s in steps], "time": times,
                                        "loss": [1.0 / s for s in steps], "lr": [0.1] * len(steps)}})
    return RunResult(TrainConfig(batch_size=batch), log, summarize(log, {}), name=name)


@pytest.fixture(scope="module")
def noisy_pair():
    """Two runs 24% apart in steady rate whose steps swing so widely that no verdict can be given."""
    rng = np.random.default_rng(3)
    return [_run_of(64 / rate * rng.lognormal(0, 1.2, 60), name) for rate, name in ((1081, "fp32"), (1342, "bf16"))]


def test_the_throughput_bars_carry_their_intervals_and_the_tables_verdict(noisy_pair):
    result = nbtrain.compare(*noisy_pair)
    verdict = result.rows[1]["vs first"]
    assert "tell" in verdict or "no measurable" in verdict, verdict  # the table names no winner
    rate_ax = result.figure.axes[2]
    assert rate_ax.get_title() == "throughput"
    steady = [run.steady() for run in noisy_pair]
    assert [t.get_text() for t in rate_ax.texts] == [number(s.rate) for s in steady]  # the table's rates
    (whiskers,) = [c for c in rate_ax.collections if c.get_segments()]  # the error bars: one per bar
    spans = sorted((seg[:, 1].min(), seg[:, 1].max()) for seg in whiskers.get_segments())
    assert np.allclose(spans, sorted((s.low, s.high) for s in steady))
    labels = [t.get_text() for t in rate_ax.get_xticklabels()]
    assert labels[0] == "fp32" and labels[1].startswith("bf16\n")
    assert " ".join(labels[1].split()[1:]) == " ".join(verdict.split())  # the verdict, word for word
    assert "verdict against the first" in rate_ax.get_xlabel()


def test_a_compare_prints_its_table_and_plots_to_a_file(noisy_pair, tmp_path):
    result = nbtrain.compare(*noisy_pair)
    assert str(result) == result.table() and "fp32" in str(result)
    assert repr(result) == "<Comparison of 2 runs: fp32, bf16>"
    figure = result.plot(tmp_path / "compare.png")
    assert figure is result.figure and (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


def _shown(shell, code: str) -> tuple[str, list]:
    from IPython.utils.capture import capture_output
    with capture_output() as captured:
        shell.run_cell(code)
    return captured.stdout, [o.data for o in captured.outputs]


def test_a_results_plot_is_shown_once_in_a_notebook_and_never_as_its_repr(noisy_pair, tmp_path):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.enable_gui = lambda gui=None: None  # (a bare shell: no GUI event loop to start)
    shell.enable_matplotlib("inline")  # as in JupyterLab: pyplot shows the figures it holds when a cell ends
    import matplotlib.pyplot as plt
    plt.close("all")  # figures earlier tests in this process left in pyplot (a kernel's inline backend shows and
    # closes them at the end of the cell that made them, so a notebook never holds them for a later cell)
    shell.user_ns.update(run=noisy_pair[0], path=str(tmp_path / "run.png"), runs=noisy_pair)
    for code, words in (("run.plot(path)", f"figure saved to {tmp_path / 'run.png'}"),
                        ("run.plot()", "a figure of"), ("fig = run.plot()", "a figure of"),
                        ("nbtrain.compare(*runs).plot()", "a figure of")):
        shell.user_ns["nbtrain"] = nbtrain
        stdout, shown = _shown(shell, code)
        assert "<Figure" not in stdout, (code, stdout)
        assert [sorted(data) for data in shown] == [["image/png", "text/plain"]], (code, shown)  # once
        assert shown[0]["text/plain"].startswith(words) or code.startswith("fig ="), (code, shown[0]["text/plain"])
