"""What a newcomer reads is what was measured, in words that do not mislead (issue 53, item 12): counts take their
plural, slow rates keep the figures that show their spread, a steps / epochs cell does not read as a division, and
every switch option takes the `--no-` form as argparse's BooleanOptionalAction does; a comparison lists no
difference in an option a run's data could not use."""
import argparse

import pytest
import torch

from nbtrain.config import TrainConfig, options
from nbtrain.flags import add_config_flags, config_from_flags
from nbtrain.format import rate_with_interval
from nbtrain.measure.steady import SteadyRate

SWITCHES = [name for name, (option, _) in options().items() if option.kind == "switch"]


def test_one_warm_up_step_is_one_step():
    assert SteadyRate(10.0, 9.0, 11.0, 0.02, 1, 0.25, 40, 5.0).warmup_text() == "warm-up 1 step, 250 ms"
    assert SteadyRate(10.0, 9.0, 11.0, 0.02, 3, 0.25, 40, 5.0).warmup_text() == "warm-up 3 steps, 250 ms"


def test_a_slow_rate_keeps_the_figures_that_show_its_interval_and_spread():
    slow = SteadyRate(1.234, 0.9123, 1.613, 0.70, 0, 0.0, 40, 30.0)
    assert slow.text() == ("1.234 samples/s (95% interval 0.9123-1.613); spread 70% between blocks: "
                           "too noisy to trust")
    assert rate_with_interval(1.234, 0.9123, 1.613) == "1.234 (0.9123–1.613)"
    fast = SteadyRate(41_419.4, 40_100.2, 42_700.9, 0.02, 0, 0.0, 40, 30.0)  # large rates stay whole numbers
    assert fast.text() == "41,419 samples/s (95% interval 40,100-42,701)"


def test_steps_and_epochs_are_counted_in_words(run_result):
    result = run_result(steps=5, epochs=0.625)
    assert dict(result.rows())["steps / epochs"] == "5 steps / 0.625 epochs"
    assert dict(run_result(steps=1, epochs=1.0).rows())["steps / epochs"] == "1 step / 1 epoch"


@pytest.fixture
def run_result():
    from nbtrain.metrics import MetricsLog
    from nbtrain.records import Summary
    from nbtrain.runs.result import RunResult

    def made(steps, epochs):
        return RunResult(TrainConfig(), MetricsLog(), Summary(steps=steps, epochs_trained=epochs, epochs=epochs))
    return made


def parsed(words: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return parser.parse_args(words)


@pytest.mark.parametrize("name", SWITCHES)
def test_every_switch_takes_its_no_form_for_false(name):
    flag = "--" + name.replace("_", "-")
    assert vars(parsed(["--no-" + flag[2:]])) == {name: "false"} == vars(parsed([flag, "false"]))
    assert vars(parsed([flag])) == {name: "true"}
    assert config_from_flags(parsed(["--no-shuffle"])).shuffle is False  # the text TrainConfig reads, as ever


def test_the_cell_magic_reads_no_shuffle_and_says_nothing_of_did_you_mean(ip, capsys):
    from nbtrain.notebook.magic import build_parser
    args, unknown = build_parser().parse_known_args(["--no-shuffle", "--no-drop-last", "--max-steps", "2"])
    assert unknown == [] and (args.shuffle, args.drop_last) == ("false", "false")
    ip.run_line_magic("nbtrain", "--no-shuffle")  # as defaults for the next cells
    out = capsys.readouterr()
    assert "did you mean" not in out.out + out.err
    assert ip.find_magic("nbtrain").__self__.defaults.get("shuffle") in ("false", False)


class Stream(torch.utils.data.IterableDataset):
    """A stream of 64 (x, y) pairs, read in its own order whatever `shuffle` says."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(64):
            yield torch.randn(4, generator=g), torch.tensor(1)


def trained(data, **options):
    import nbtrain
    torch.manual_seed(0)
    return nbtrain.fit(torch.nn.Linear(4, 2), data, loss_fn=torch.nn.CrossEntropyLoss(),
                       config=TrainConfig(max_steps=2, batch_size=8, accelerator="cpu", **options))


@pytest.mark.slow
def test_a_comparison_does_not_call_shuffle_a_difference_where_a_runs_data_is_a_stream():
    from nbtrain.runs.compare import compare
    from nbtrain.runs.table import Row
    listed = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.ones(64, dtype=torch.long))
    stream_kept, stream_shuffled = trained(Stream(), shuffle=False), trained(Stream())
    assert stream_shuffled.summary.inert == ("shuffle",) and trained(listed).summary.inert == ()
    rows = compare(stream_kept, stream_shuffled).rows
    assert rows[1]["changed from first"] == "-", rows[1]
    table_rows = [Row(i, None, "completed", r.config.to_dict(), r.summary) for i, r in
                  enumerate((stream_kept, stream_shuffled))]
    assert table_rows[1].differs_from(table_rows[0]) == "the same config"
    # where both runs' order is nbtrain's, shuffle is a difference and is said
    assert compare(trained(listed, shuffle=False), trained(listed)).rows[1]["changed from first"] == "shuffle=True"


def test_the_readme_says_a_switch_takes_its_no_form():
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "`--no-shuffle` is `--shuffle false`" in readme
