"""ceilings' suggestions are measured or labelled (issue 48 item 5): a remedy that is one cheap setting (bf16,
channels_last, TF32) is raced on the live model against the config, and its line gives the measured ratio; every
other stays an idea with its reason."""
import dataclasses

import torch
from torch import nn

from landscapes import LANDSCAPES
from simulated_machine import SimulatedMachine
from helpers import regression_data, same_weights, weights
from nbtrain.measure.ab import ABResult
from nbtrain.measure.bottleneck import Remedy
from nbtrain.measure.verdict import paired
from nbtrain.tools import trial
from nbtrain.tools.ceilings import race_remedies


def _bf16_line(rates_a, rates_b):
    land = next(land for land in LANDSCAPES if land.name == "gpu-compute-bound-matmuls")
    reading = SimulatedMachine(land).ceilings(land.start, 0.5)
    a = reading.config
    b = a.replace(precision="bf16-mixed")
    reading = dataclasses.replace(reading, raced={"precision": ABResult(a, b, paired(rates_a, rates_b), rates_a,
                                                                        rates_b)})
    lines = reading.remedy_lines()
    return next(line for line in lines if "bf16" in line), lines


def test_a_raced_remedy_says_its_measured_ratio_and_a_slower_one_is_not_a_try():
    # nanoGPT: the bf16 matmul alone 4.3x faster, the step raced 1.09x slower: said as raced, not faster.
    slower, lines = _bf16_line([100, 101, 99, 100, 102, 100], [92, 93, 91, 92, 93, 92])
    assert slower.startswith("  raced, not faster here: precision=bf16-mixed: raced on this model: "), slower
    assert "slower" in slower and "[6 pairs of blocks]" in slower
    assert "the idea was: precision='bf16-mixed': a bf16 matmul alone" in slower
    assert not any(line.startswith("  try: precision") for line in lines)
    faster, _ = _bf16_line([100, 101, 99, 100, 102, 100], [130, 131, 129, 130, 132, 131])
    assert faster.startswith("  try: precision=bf16-mixed: raced on this model: 1.30x faster (95% interval 1.29-1.31)")


def test_a_cheap_remedy_is_raced_on_the_live_model_and_the_model_given_back():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    before = weights(model)
    remedies = [Remedy("compute", "precision", "precision='bf16-mixed': ..."),
                Remedy("host", "compile", "compile='default': ...")]  # compile: not cheap, not raced
    with trial.borrow(model, regression_data(), loss_fn=nn.MSELoss()) as lent:
        raced = race_remedies(lent, remedies, seconds=0.8)
    assert set(raced) == {"precision"}
    race = raced["precision"]
    assert race.label == "precision=bf16-mixed" and len(race.rates_a) == len(race.rates_b) >= 2
    assert same_weights(before, weights(model))
