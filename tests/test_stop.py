"""stop: a run ends at the next step boundary from any thread, on every DDP rank at the same step,
keeping what it trained (issue 14)."""
import threading

import pytest
import torch
from torch import nn

import nbtrain

from helpers import regression_data, same_weights, weights


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _stop_after_first_window(log, stop):
    def view(event, _log):
        if event["type"] == "steps":
            stop.set()
    log.subscribe(view)


@pytest.mark.slow
def test_a_ddp_run_stops_on_every_rank_at_one_step_and_its_weights_come_back(cpu_load):
    model, stop, log = net(), threading.Event(), nbtrain.MetricsLog()
    before = weights(model)
    _stop_after_first_window(log, stop)
    result = nbtrain.fit(model, regression_data(n=4096), loss_fn=nn.MSELoss(), batch_size=8, max_epochs=50,
                         devices=2, accelerator="cpu", log_every_n_steps=5, log=log, stop=stop)
    assert result.status == "stopped", result.message
    assert result.extras["weights_loaded"] is True and not same_weights(before, weights(model))
    steps = result.summary.run_steps
    assert steps % 5 == 0 and steps < 50 * 4096 // 16  # at a log window's boundary, long before the end
    assert result.message.startswith(f"stopped at step {steps}")


def test_an_in_process_run_stops_from_another_thread_even_when_asked_before_it_starts():
    stop = threading.Event()
    stop.set()
    result = nbtrain.fit(net(), regression_data(), loss_fn=nn.MSELoss(), batch_size=8, max_epochs=100, stop=stop)
    assert result.status == "stopped" and result.summary.run_steps < 100 * 256 // 8
