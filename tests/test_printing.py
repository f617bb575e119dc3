"""Every result a tool returns prints as its table: print(), str() and a notebook's display (IPython's own
formatter) show `table()`, one name across them; the repr stays one short line (a result in a list)."""
import re
import html
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import TrainConfig
from nbtrain.format import number
from nbtrain.measure.ab import ABResult
from nbtrain.measure.verdict import Verdict


def _recipe():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 3, (96,)))
    return dict(model=nn.Linear(8, 3), train_data=data, loss_fn=nn.CrossEntropyLoss())


def _walk():
    from landscapes import LANDSCAPES
    from nbtrain.walk.walker import run_walk
    from simulated_machine import SimulatedMachine
    machine = SimulatedMachine(LANDSCAPES[0], seed=1)
    return run_walk(machine, budget_s=20, clock=machine.clock)


MADE = {  # each result as a user gets it, on a tiny model (the checklist walk on the simulated machine)
    "RunResult": lambda: nbtrain.fit(**_recipe(), max_epochs=2, batch_size=32, accelerator="cpu"),
    "ABResult": lambda: ABResult(TrainConfig(), TrainConfig(batch_size=64), Verdict(1.31, 1.24, 1.38, 8), seconds=4),
    "Ceilings": lambda: nbtrain.ceilings(**_recipe(), config=TrainConfig(batch_size=16, accelerator="cpu"), steps=10,
                                         seconds=0.1),
    "Diagnosis": lambda: nbtrain.profile(**_recipe(), config=TrainConfig(batch_size=16, accelerator="cpu"), steps=4,
                                         warmup_steps=1, ceilings=False),
    "ChecklistResult": _walk,
}


def _readme_ceilings() -> str:
    """The output under the README's nbtrain.ceilings example."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.index("print(nbtrain.ceilings(")
    opening = readme.index("```\n", readme.index("```\n", example) + 4)  # past the example's closing fence
    start = opening + 4
    return textwrap.dedent(readme[start:readme.index("```", start)])


def _first_words(table: str) -> list[str]:
    return sorted({line.split()[0] for line in table.splitlines()})  # nbtrain, host, memory, ..., verdict:, try:


@pytest.mark.parametrize("kind", MADE)
def test_print_and_the_notebooks_display_show_the_results_table(kind, shell, capsys):
    result = MADE[kind]()
    assert type(result).__name__ == kind
    table = result.table()
    print(result)
    assert capsys.readouterr().out == table + "\n" and "\n" in table or kind == "ABResult"
    shown, _ = shell.display_formatter.format(result)  # what a notebook cell ending in `result` shows
    assert shown["text/plain"] == table
    assert "\n" not in repr(result) and repr(result).startswith(kind + "(")
    if kind == "Ceilings":  # the README shows it beside profile, with the output it printed: the same lines
        # Every table has the readings' lines; which remedy lines follow (raced and faster, raced and not, an
        # idea not raced, the critical batch where the noise scale resolved) is what this run measured.
        readings = {"nbtrain", "host", "data", "compute", "memory", "model", "verdict:"}
        remedies = {"try:", "raced,", "idea,", "batch:"}
        readme, printed = set(_first_words(_readme_ceilings())), set(_first_words(table))
        assert readings <= readme and readings <= printed, (readme, printed)
        assert readme - readings <= remedies and printed - readings <= remedies, (readme, printed)
    if kind == "RunResult":  # its table as HTML too, row by row
        assert all(html.escape(label) in shown["text/html"] for label, _ in result.rows()) and "<table>" in shown["text/html"]


def test_a_runs_summary_carries_its_epochs_as_its_table_shows_them():
    result = MADE["RunResult"]()
    assert result.summary.epochs == result.summary.epochs_trained == 2
    shown = f"steps / epochs +{result.summary.steps} steps / {re.escape(number(result.summary.epochs))} epochs\n"
    assert re.search(shown, result.table())  # the label column is as wide as the longest label
