"""Every headline number is a measurement: one config is never faster than itself (an A/A check),
a bottleneck verdict names only a ceiling that explains the rate, and the walk's headline is its final
head-to-head."""

import pytest
import torch
from torch import nn

import nbtrain
from nbtrain.measure.verdict import Verdict

from helpers import regression_data, same_weights, weights

SPEED_WORDS = ("faster", "slower")


@pytest.mark.parametrize("ratio,low,high", [(1.29, 1.00, 1.65), (1.3, 1.2, 1.4), (0.7, 0.6, 0.8), (1.0, 0.98, 1.02),
                                            (1.4, float("nan"), float("nan"))])
def test_an_a_a_verdict_never_says_faster_or_slower_whatever_its_blocks_read(ratio, low, high):
    v = Verdict(ratio, low, high, 6, one_config=True)
    words = v.text("x") + " " + v.short()
    assert not v.measurable and not v.faster and not v.above(0.0)
    assert "A/A check" in words and not any(w in words for w in SPEED_WORDS), words


def test_ab_of_one_resolved_config_is_an_a_a_check_naming_what_a_inherits_from_the_live_config():
    # After fit(precision='bf16-mixed'), a={'batch_size': 16} inherits the live bf16: both sides are one config.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    data = regression_data()
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=2, batch_size=32, precision="bf16-mixed")
    before = weights(model)
    result = nbtrain.ab(model, data, loss_fn=nn.MSELoss(), a={"batch_size": 16},
                        b={"batch_size": 16, "precision": "bf16-mixed"}, block_steps=3, min_pairs=2, max_pairs=3)
    assert same_weights(before, weights(model))
    text = result.text()
    assert result.same and result.verdict.one_config and not result.verdict.faster
    assert "A/A check" in text and not any(w in text for w in SPEED_WORDS), text
    assert "a and b are both the live config with batch_size=16" in text, text
    assert "a inherits precision=bf16-mixed from the live config" in text, text


def test_ab_of_two_configs_names_each_side_as_changes_from_the_live_config():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    data = regression_data()
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=2, batch_size=32)
    result = nbtrain.ab(model, data, loss_fn=nn.MSELoss(), a={"batch_size": 16}, b={"batch_size": 64},
                        block_steps=3, min_pairs=2, max_pairs=2)
    assert not result.same and not result.verdict.one_config
    assert ("A: the live config with batch_size=16; B: the live config with batch_size=64") in result.text()
