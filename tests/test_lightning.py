"""A LightningModule trains as it is: the same weights as lightning.Trainer, without a Trainer."""
import subprocess
import sys

import cloudpickle
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nbtrain

L = pytest.importorskip("lightning", reason="needs lightning (pip install -e '.[test]')")
# The LightningModule below lives in a test module the DDP workers cannot import: sent by value,
# as a notebook's classes are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def data(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())


class LitRegressor(L.LightningModule):
    def __init__(self, schedule=None, logs=False):
        super().__init__()
        torch.manual_seed(2)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.schedule, self.logs = schedule, logs

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self(x), y)
        if self.logs:
            self.log("train_loss", loss)
            self.log("batch_idx", float(batch_idx))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self(x), y)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)
        if self.schedule is None:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.schedule}}

    def train_dataloader(self):
        return DataLoader(data(), batch_size=8, shuffle=False)


def lightning_weights(module, steps):
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0)
    trainer.fit(module)
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize("schedule", [None, "step", "epoch"])
def test_nbtrain_trains_a_lightningmodule_to_the_same_weights_as_lightnings_trainer(schedule):
    steps = 30  # 12 steps an epoch: the epoch schedule steps twice
    expected = lightning_weights(LitRegressor(schedule), steps)
    module = LitRegressor(schedule)
    result = nbtrain.fit(module, max_steps=steps, accelerator="cpu")
    assert result.status == "completed" and result.config.batch_size == 8 and result.config.shuffle is False
    for a, b in zip(module.parameters(), expected):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()


def test_self_log_values_reach_nbtrains_metrics():
    module = LitRegressor(logs=True)
    result = nbtrain.fit(module, max_steps=12, log_every_n_steps=4, accelerator="cpu")
    logged = result.log.of_type("logged")
    assert [event["step"] for event in logged] == [4, 8, 12]
    assert logged[-1]["values"]["batch_idx"] == 11.0 and logged[-1]["values"]["train_loss"] > 0
    assert result.summary.logged["batch_idx"] == 11.0


def test_the_magic_trains_a_lightningmodule_named_model(ip):
    # An earlier cell's optimizer and loss_fn are not the module's: it trains with its own.
    ip.user_ns.update(LitRegressor=LitRegressor, optimizer=lambda p: torch.optim.Adam(p), loss_fn=nn.MSELoss())
    try:
        ip.run_cell("%%nbtrain --max-steps 5 --no-plot --no-progress --name lit\nmodel = LitRegressor()")
    finally:
        del ip.user_ns["optimizer"], ip.user_ns["loss_fn"]
    assert ip.user_ns["lit"].status == "completed"
    assert isinstance(nbtrain.api.live_engine(ip.user_ns["model"].__dict__["_nbtrain_training"].value).optimizer,
                      torch.optim.SGD)


def test_parts_a_lightningmodule_defines_itself_are_refused_by_fit_with_one_line():
    with pytest.raises(nbtrain.recipe.RecipeError, match="optimizer, scheduler: given with a LightningModule, which "
                                                         "defines its own"):
        nbtrain.fit(LitRegressor(), optimizer=lambda p: torch.optim.Adam(p), max_steps=1,
                    scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1))


def test_a_logged_held_out_loss_is_counted_once():
    module = LitRegressor()
    result = nbtrain.fit(module, val_data=data(32), max_steps=6, accelerator="cpu")
    x, y = data(32).tensors
    with torch.no_grad():
        expected = nn.functional.binary_cross_entropy_with_logits(module(x), y).item()
    assert result.summary.val_loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_lightningmodule_trains_on_two_devices_to_the_weights_of_one_with_the_global_batch():
    module, reference = LitRegressor(logs=True), LitRegressor(logs=True)
    result = nbtrain.fit(module, val_data=data(32), max_steps=6, devices=2, accelerator="cpu")
    nbtrain.fit(reference, val_data=data(32), max_steps=6, batch_size=16, accelerator="cpu")
    assert result.status == "completed" and result.summary.world_size == 2 and result.summary.global_batch == 16
    for a, b in zip(module.parameters(), reference.parameters()):  # the weights came back into the kernel's module
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()
    assert result.summary.logged["train_loss"] > 0 and result.log.of_type("logged")  # self.log from rank 0
    x, y = data(32).tensors
    with torch.no_grad():
        expected = nn.functional.binary_cross_entropy_with_logits(module(x), y).item()
    assert result.summary.val_loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_magic_trains_a_lightningmodule_named_model_with_devices_2(ip):
    ip.user_ns.update(LitRegressor=LitRegressor)
    ip.run_cell("%%nbtrain --devices 2 --accelerator cpu --max-steps 5 --no-plot --no-progress --name lit_ddp\n"
                "model = LitRegressor()\nbefore = [p.detach().clone() for p in model.parameters()]")
    result = ip.user_ns["lit_ddp"]
    assert result.status == "completed" and result.summary.world_size == 2
    assert all(not torch.equal(a, b) for a, b in zip(ip.user_ns["before"], ip.user_ns["model"].parameters()))


def test_two_runs_continue_the_same_optimizer_state():
    module = LitRegressor()
    nbtrain.fit(module, max_steps=5, accelerator="cpu")
    engine = nbtrain.api.live_engine(module.__dict__["_nbtrain_training"].value)
    nbtrain.fit(module, max_steps=5, accelerator="cpu")
    assert nbtrain.api.live_engine(module.__dict__["_nbtrain_training"].value) is engine and engine.step == 10


@pytest.mark.slow
def test_lightning_is_imported_only_for_a_lightningmodule():
    code = ("import sys, torch, nbtrain\nfrom torch.utils.data import TensorDataset\n"
            "nbtrain.fit(torch.nn.Linear(4, 1), TensorDataset(torch.randn(8, 4), torch.randn(8, 1)),"
            " loss_fn=torch.nn.MSELoss(), max_steps=1)\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
