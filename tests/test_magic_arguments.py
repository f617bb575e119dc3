"""Every nbtrain magic reads its line as a terminal would: quoted values with spaces are one value."""
import pytest
from IPython.core.error import UsageError

DIGITS = """
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
model = DigitsMLP(hidden=16)
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""
QUIET = "--no-plot --no-progress"




def runs_ok(ip, capsys, cell: str) -> str:
    result = ip.run_cell(cell)
    out = capsys.readouterr()
    assert result.success, out.out + out.err
    return out.out


def no_quote_in_any_name(root):
    assert not [p for p in root.rglob("*") if '"' in p.name or "'" in p.name]


@pytest.mark.slow
def test_paths_with_spaces_reach_every_line_magic_without_their_quotes(ip, capsys, tmp_path):
    folder = tmp_path / "my runs"
    store = folder / "runs.sqlite"
    runs_ok(ip, capsys, f'%%nbtrain --max-steps 2 {QUIET} --name first --store "{store}"' + DIGITS)

    # %nbtrain sets defaults: a store and a checkpoint folder, both with spaces, used by the next cell
    runs_ok(ip, capsys, f'%nbtrain --store "{store}" --checkpoint-dir "{folder}/check points" --checkpoint-every 2')
    runs_ok(ip, capsys, f"%%nbtrain --max-steps 4 {QUIET} --name second\nx = 1")
    assert ip.user_ns["second"].extras["store"] == str(store)
    assert list((folder / "check points").rglob("*.pt")), "no checkpoint written in the quoted folder"
    runs_ok(ip, capsys, "%nbtrain --reset")  # from here on only the flags name the store

    listing = runs_ok(ip, capsys, f'%nbtrain_runs --store "{store}"')
    assert "first" in listing and "second" in listing and "no runs stored" not in listing, listing
    del ip.user_ns["first"], ip.user_ns["second"]  # read back from the store by name
    runs_ok(ip, capsys, f'%nbtrain_compare "first" second --store "{store}" --save "{folder}/side by side.png"')
    assert ip.user_ns["_nbtrain_compare"].labels == ["first", "second"]
    assert (folder / "side by side.png").stat().st_size > 1000

    # a tool as a line magic: its trace path
    runs_ok(ip, capsys, f'%nbtrain --profile --steps 4 --trace "{folder}/step trace.json"')
    assert (folder / "step trace.json").stat().st_size > 0
    no_quote_in_any_name(tmp_path)


def test_quoted_text_is_one_value_in_the_checklist_magic(ip, capsys):
    # The walk refuses an unknown item before it measures anything; its message shows the list it got.
    runs_ok(ip, capsys, DIGITS)
    result = ip.run_cell('%nbtrain_checklist --items "batch_size, nope"' + "\n")
    text = "".join(capsys.readouterr())
    assert isinstance(result.error_in_exec, UsageError), text
    assert "--items batch_size, nope: allowed: each one of preload_data" in text, text


@pytest.mark.parametrize("magic, line", [
    ("%nbtrain", '--store "/tmp/a b'),
    ("%nbtrain_checklist", "--items 'batch_size"),
    ("%nbtrain_runs", '--store "/tmp/a b'),
    ("%nbtrain_compare", 'one two --save "/tmp/a b.png'),
    ("%%nbtrain", '--store "/tmp/a b'),
])
def test_unbalanced_quotes_are_one_line_naming_the_magic(ip, capsys, tmp_path, magic, line):
    cell = f"{magic} {line}" + ("\nran = True" if magic.startswith("%%") else "")
    result = ip.run_cell(cell)
    out = capsys.readouterr()
    text = out.out + out.err
    assert isinstance(result.error_in_exec, UsageError), text
    assert f"UsageError: {magic}: cannot read the flags (No closing quotation): " in text, text
    assert "Traceback" not in text and text.count("UsageError") == 1, text
    assert "ran" not in ip.user_ns
    no_quote_in_any_name(tmp_path)


def test_argparse_errors_of_the_line_magics_name_the_magic(ip, capsys):
    result = ip.run_cell("%nbtrain_runs --last many")
    text = "".join(capsys.readouterr())
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: %nbtrain_runs: argument --last: invalid int value: 'many'" in text, text
