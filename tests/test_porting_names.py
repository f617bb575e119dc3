"""What a porter reads in the README is what nbtrain reads (issue 53, item 10): every name a `%%nbtrain` cell is
read by, the options a training script ported from nanoGPT or pytorch/examples needs, and the README's own example
name for the data, `data`, which a cell may use for its training data."""
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nbtrain.adapters import recipe_from_namespace
from nbtrain.recipe import NAMES, RecipeError

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def readme_paragraph(start: str) -> str:
    return README[README.index(start):].split("\n\n", 1)[0]


def test_the_readme_names_every_name_a_cell_is_read_by():
    said = set(re.findall(r"`(\w+)", readme_paragraph("The cell body runs in the notebook's namespace")))
    assert {name for names in NAMES.values() for name in names} <= said


def test_the_readme_names_the_options_a_porter_needs():
    said = set(re.findall(r"`(\w+)", readme_paragraph("`TrainConfig` uses Lightning's names")))
    assert {"gradient_clip_val", "shuffle", "drop_last", "preload_data"} <= said


def parts(**namespace):
    return {"model": torch.nn.Linear(4, 2), "loss_fn": torch.nn.CrossEntropyLoss(), **namespace}


@pytest.mark.parametrize("make", [lambda d: d, lambda d: DataLoader(d, batch_size=8)], ids=["dataset", "loader"])
def test_a_cell_that_calls_its_data_data_trains_on_it(make):
    data = make(TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long)))
    recipe = recipe_from_namespace(parts(data=data))
    assert recipe.train_data is getattr(data, "dataset", data)  # a DataLoader is read as its data set and settings


def test_data_that_is_not_a_data_set_is_passed_over_not_refused():
    from torch.utils import data  # the name often holds this module
    with pytest.raises(RecipeError, match="the namespace defines no train_data"):
        recipe_from_namespace(parts(data=data))
    named = TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))
    assert recipe_from_namespace(parts(data=data, train_data=named)).train_data is named
    other = TensorDataset(torch.randn(8, 4), torch.zeros(8, dtype=torch.long))
    assert recipe_from_namespace(parts(data=other, train_data=named)).train_data is named  # train_data first


def test_the_readmes_cell_with_data_trains_in_a_cell(ip, capsys):
    ip.run_cell("import torch\nfrom torch.utils.data import TensorDataset")
    result = ip.run_cell("%%nbtrain --max-steps 2 --batch-size 8 --no-plot --no-progress --name ported\n"
                         "model = torch.nn.Linear(4, 2)\n"
                         "data = TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))\n"
                         "loss_fn = torch.nn.CrossEntropyLoss()\n")
    out = capsys.readouterr()
    assert result.success and "defines no train_data" not in out.out + out.err, out.out + out.err
    assert ip.user_ns["ported"].summary.steps == 2
