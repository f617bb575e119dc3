"""nbtrain.ab judges a change that alters what is learned by held-out loss at equal wall time (issue 48, rule 11)."""
import pytest
import torch
from torch import nn
from torch.utils.data import Subset

import nbtrain

from helpers import regression_data, same_weights, weights


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 1))


@pytest.mark.slow
def test_ab_says_a_rate_that_learns_worse_in_the_same_time_learns_worse_beside_its_samples_per_s():
    model = _model()
    before = weights(model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    data = regression_data(n=384)
    train, val = Subset(data, range(256)), Subset(data, range(256, 384))
    # lr 1e-4 steps as fast as lr 0.05 (samples/s: no difference) but hardly moves the weights in the same time.
    result = nbtrain.ab(model, train, loss_fn=nn.MSELoss(), optimizer=sgd, val_data=val,
                        b={"lr": 1e-4}, block_steps=5, min_pairs=2, max_pairs=2, learn_s=0.2)
    assert same_weights(before, weights(model))  # the user's model is given back as it was
    learned = result.learned
    assert learned is not None and learned.measured and learned.worse, learned.text()
    assert len(learned.current) == len(learned.candidate) == 3
    text = result.text()
    assert text.startswith("lr=0.0001: learns worse in the same time (held-out (val_data) ")
    assert "0.2 s of training each from the same weights, 3 times; learn_s= lengthens it" in text
    assert "; in samples/s " in text


def test_ab_of_a_change_that_learns_the_same_math_reads_samples_per_s_alone():
    model = _model()
    result = nbtrain.ab(model, regression_data(), loss_fn=nn.MSELoss(), b={"num_threads": 1}, block_steps=5,
                        min_pairs=2, max_pairs=2)
    assert result.learned is None and "learns" not in result.text()
