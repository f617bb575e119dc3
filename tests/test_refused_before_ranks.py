"""What the ranks would refuse is refused in the kernel, before any rank starts (issue 49, item 8)."""
import time

import pytest
import torch
from torch import nn

import nbtrain
from nbtrain.recipe import RecipeError


def _data(n=64):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))


@pytest.mark.parametrize("given", ["factory", "instance"])
def test_reduce_lr_on_plateau_on_two_processes_is_refused_in_the_kernel_with_one_message(given):
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = (lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o)) if given == "factory" else \
        torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    with pytest.raises(RecipeError) as refused:
        nbtrain.fit(model, _data(), loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, val_data=_data(16),
                    monitor="val_loss", scheduler=plateau, max_steps=3, devices=2, accelerator="cpu")
    text = str(refused.value)
    assert text.startswith("scheduler: ReduceLROnPlateau steps on a held-out number that only the first of 2 "
                           "processes computes; allowed: devices=1"), text
    assert "rank" not in text and time.perf_counter() - t0 < 2.0  # no rank started: a rank's start takes seconds
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
