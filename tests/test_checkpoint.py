"""Checkpoints, resume after a SIGKILL, and non-finite losses."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from nbtrain import Engine, TrainConfig
from nbtrain.engine.checkpoint import CheckpointError

from helpers import regression_recipe

TRAIN_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch
    from torch import nn
    sys.path.insert(0, {tests!r})
    from helpers import regression_recipe
    from nbtrain import Engine, TrainConfig
    torch.set_num_threads(1)
    recipe = regression_recipe(n=512)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 1))  # dropout uses the RNG
    torch.manual_seed(0)
    recipe.model = model
    kill_at = int(sys.argv[3])
    def step(m, batch):
        if kill_at and engine.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch
        return nn.functional.mse_loss(m(x), y)
    recipe.training_step = step
    config = TrainConfig(batch_size=16, max_epochs=2, checkpoint_every=5, checkpoint_dir=sys.argv[1],
                         resume=sys.argv[2] if sys.argv[2] != "-" else None)
    engine = Engine(recipe, config)
    result = engine.run()
    torch.save(model.state_dict(), os.path.join(sys.argv[1], "final.pt"))
    print(result.status, engine.step)
""")


def run_script(tmp_path, folder, resume, kill_at):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT.format(tests=os.path.dirname(__file__)))
    return subprocess.run([sys.executable, str(script), str(folder), resume, str(kill_at)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_bit_identical_weights(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    done = run_script(tmp_path, straight, "-", 0)
    assert done.returncode == 0, done.stderr
    killed = run_script(tmp_path, interrupted, "-", 37)
    assert killed.returncode == -signal.SIGKILL
    assert sorted(p.name for p in interrupted.glob("step-*.pt"))[-1] == "step-00000035.pt"
    assert not list(interrupted.glob(".writing-*"))
    resumed = run_script(tmp_path, interrupted, "last", 0)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["completed", "64"]
    a = torch.load(straight / "final.pt")
    b = torch.load(interrupted / "final.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_names_a_missing_or_wrong_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="resume='last': no checkpoint in"):
        Engine(regression_recipe(), TrainConfig(resume="last", checkpoint_dir=str(tmp_path))).run()
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        Engine(regression_recipe(), TrainConfig(resume=str(tmp_path / "nope.pt"))).run()
    engine = Engine(regression_recipe(), TrainConfig(max_steps=2, checkpoint_every=1, checkpoint_dir=str(tmp_path)))
    engine.run()
    other = regression_recipe()
    other.model = nn.Linear(8, 1)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        Engine(other, TrainConfig(resume="last", checkpoint_dir=str(tmp_path))).run()


def test_a_nan_loss_stops_the_run_naming_the_step():
    recipe = regression_recipe()

    def step(model, batch):
        x, y = batch
        loss = nn.functional.mse_loss(model(x), y)
        return loss * float("nan") if engine.step >= 6 else loss

    recipe.training_step = step
    engine = Engine(recipe, TrainConfig(batch_size=8, max_epochs=5, log_every_n_steps=4))
    result = engine.run()
    assert result.status == "failed"
    assert "the loss became nan at step 7 (32-true)" in result.message
    assert engine.step == 8  # stopped at the first read-back after the bad step


def test_continue_on_nonfinite_loss_is_a_choice():
    recipe = regression_recipe()
    recipe.training_step = lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]) * float("inf")
    result = Engine(recipe, TrainConfig(batch_size=8, max_steps=6, on_nonfinite_loss="continue")).run()
    assert result.status == "completed"
