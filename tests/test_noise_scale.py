"""The gradient noise scale (McCandlish et al. 2018, appendix A) read on a live model in a trial (issue 48)."""
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from nbtrain.measure.noise_scale import estimates, noise_scale
from nbtrain.tools.gradient_noise import noise_scale_of

from checklist_recipes import same_state, state


def regression(n=20000, d=4, sigma=2.0, seed=0):
    """y = x.w* + sigma * noise, x ~ N(0, I), and a model at w0 = w* + delta with |delta| = 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w_star = torch.randn(d, generator=g)
    y = (x @ w_star + sigma * torch.randn(n, generator=g)).unsqueeze(1)
    model = nn.Linear(d, 1, bias=False)
    delta = torch.randn(d, generator=g)
    with torch.no_grad():
        model.weight.copy_((w_star + delta / delta.norm()).unsqueeze(0))
    return model, TensorDataset(x, y)


def closed_form(model, data):
    """B_simple of the mean-squared-error gradient over exactly this data: per-sample gradients 2 (x.w - y) x,
    their mean G and covariance's trace (in expectation: (d + 1) + d sigma^2 / |delta|^2)."""
    x, y = data.tensors
    w = model.weight.detach().squeeze(0).double()
    per_sample = 2 * (x.double() @ w - y.double().squeeze(1)).unsqueeze(1) * x.double()
    mean = per_sample.mean(0)
    trace = ((per_sample - mean) ** 2).sum(1).mean()
    return float(trace / (mean @ mean))


@pytest.mark.slow
def test_the_noise_scale_matches_its_closed_form_on_a_linear_regression_with_known_gradient_noise():
    model, data = regression()
    truth = closed_form(model, data)
    assert 18 < truth < 24  # (d + 1) + d sigma^2 / |delta|^2 = 5 + 16, up to the sample
    before = state(model)
    measured = noise_scale_of(model, data, loss_fn=nn.MSELoss(), batch_size=4, accelerator="cpu", repeats=150)
    assert same_state(before, state(model))  # the trial gave the model back bit for bit, gradients included
    assert measured.measured and measured.low <= truth <= measured.high, (truth, measured)
    assert measured.b_simple == pytest.approx(truth, rel=0.2) and measured.high < 2 * truth
    assert (measured.small, measured.big, measured.repeats) == (4, 32, 150)
    assert "critical batch size ~" in measured.text()


def test_the_estimates_are_unbiased_for_norms_drawn_as_the_model_says():
    # E|G_B|^2 = |G|^2 + tr(Sigma) / B: the two-batch estimates recover both from their expectations exactly
    g2, tr = 3.0, 60.0
    grad_sq, trace = estimates([g2 + tr / 8], [g2 + tr / 64], 8, 64)
    assert grad_sq[0] == pytest.approx(g2) and trace[0] == pytest.approx(tr)
    # and where |G|^2 is lost in the noise, no number is given, with the reason
    unresolved = noise_scale([10.0, 11.0, 9.0], [1.0, 1.2, 0.9], 8, 64)
    assert not unresolved.measured and "not resolved" in unresolved.note and math.isnan(unresolved.b_simple)
    with pytest.raises(ValueError, match="0 < small < big"):
        estimates([1.0], [1.0], 64, 8)
    few = noise_scale([g2 + tr / 8] * 3, [g2 + tr / 64] * 3, 8, 64)  # 3 repeats: an estimate, no interval
    assert few.b_simple == pytest.approx(20) and math.isnan(few.low) and "too few repeats for an interval" in few.text()
    rng = np.random.default_rng(0)
    assert noise_scale(g2 + tr / 8 + rng.normal(0, 1, 50), g2 + tr / 64 + rng.normal(0, 0.1, 50), 8, 64).measured


@pytest.mark.slow
def test_ceilings_show_the_critical_batch_size_beside_the_batch():
    import nbtrain
    model, data = regression(n=4096)
    before = state(model)
    reading = nbtrain.ceilings(model, data, loss_fn=nn.MSELoss(), batch_size=64, accelerator="cpu", steps=10,
                               seconds=0.3)
    assert same_state(before, state(model))
    assert reading.noise_scale is not None and reading.noise_scale.small == 64
    line = reading.table().splitlines()[-1]
    assert line.startswith("batch: critical batch size ~") and "this run's global batch 64 is" in line, line
