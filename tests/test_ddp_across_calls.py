"""A DDP call continues the live engine as a call in the kernel does (issue 37, items 3 and 13).

Two `devices=2` calls train as one longer call: momentum, schedule, data position and every rank's
random numbers go to the ranks and come back, as the weights do; a DDP call continues a kernel call
and a kernel call a DDP one, counting the data position in samples of the epoch's global order.
A scheduler shipped to the ranks with its optimizer steps there without torch's warning.
"""
from __future__ import annotations

import sys
import warnings

import cloudpickle
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain.distributed import carry
from nbtrain.distributed.rundir import RunDir
from nbtrain.recipe import Recipe

L = pytest.importorskip("lightning", reason="needs lightning (pip install -e '.[test]')")

# Workers cannot import this test module: its functions travel by value, as a notebook's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 100  # samples: 50 per rank, so an epoch is 4 steps (the last of 2 samples a rank) and needs no padding


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, 8, generator=g), torch.randint(0, 3, (N,), generator=g))


DATA = make_data()  # one data set for every call (new data would start its epoch afresh)


def sgd_momentum(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def step_lr(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


def linear() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(8, 3)


def plain_loop(model: nn.Module, calls, rate=None, order=None) -> list[float]:
    """The calls `(ranks, batch per rank, steps)` as one hand-written loop in one process: a step averages
    the ranks' gradients, each the mean over its share (the sampler deals samples round-robin), as DDP's
    all-reduce does; a call on R ranks starts at the multiple of R at or below where the last one
    stopped. `rate`: step -> its rate, in place of the StepLR schedule; `order`: the epoch's global order of
    samples (a shuffled one; one epoch only), else 0..N-1. Returns the rate of every step."""
    x, y = DATA.tensors
    optimizer = sgd_momentum(model.parameters())
    schedule = step_lr(optimizer) if rate is None else None
    done, rates = 0, []  # samples of the epoch's order already used
    for ranks, batch, steps in calls:
        done -= done % ranks
        for _ in range(steps):
            share = done // ranks
            grads = []
            for rank in range(ranks):
                rows = list(range(N) if order is None else order)[rank::ranks][share:share + batch]
                model.zero_grad()
                nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
            for p, *per_rank in zip(model.parameters(), *grads):
                p.grad = sum(g / ranks for g in per_rank)
            if rate is not None:
                optimizer.param_groups[0]["lr"] = rate(len(rates))
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if schedule is not None:
                schedule.step()
            done += min(batch, N // ranks - share) * ranks
            done = 0 if done >= N else done
    return rates


def assert_same_weights(model: nn.Module, reference: nn.Module) -> None:
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b), (a - b).abs().max()


def fit(model, ranks: int, batch: int, steps: int, **options):
    options = {"shuffle": False, **options}
    return nbtrain.fit(model, DATA, loss_fn=nn.CrossEntropyLoss(), optimizer=sgd_momentum, scheduler=step_lr,
                       scheduler_interval="step", devices=ranks, batch_size=batch, max_steps=steps, accelerator="cpu",
                       **options)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("calls", [
    ((2, 16, 5), (2, 16, 5)),             # two DDP calls, across an epoch's end
    ((1, 15, 3), (2, 16, 4), (1, 32, 3)),  # kernel, DDP (at sample 45: 44 on two ranks), kernel again
], ids=lambda calls: "-".join("ddp" if ranks > 1 else "kernel" for ranks, _, _ in calls))
def test_calls_on_one_or_two_ranks_continue_each_other_as_one_plain_loop(calls):
    model, reference = linear(), linear()
    expected = plain_loop(reference, calls)
    results = [fit(model, *call) for call in calls]
    assert [lr for r in results for lr in r.log.columns["lr"]] == pytest.approx(expected, rel=1e-12)
    assert_same_weights(model, reference)
    notes = [note for r in results for note in r.summary.notes]
    read_again = [note for note in notes if note.startswith("data position")]
    if calls[0][:2] == (1, 15):  # 45 samples used: two ranks start at 44, and the summary says so
        assert read_again == ["data position: the last call stopped at sample 45 of epoch 0's order, not a multiple "
                              "of 2 ranks: this run starts at sample 44 (1 sample(s) read again)"]
    else:
        assert read_again == []


class Dropped(nn.Module):
    """Random numbers in every step (dropout), so each rank's stream has to continue across calls."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ddp_calls_train_bit_for_bit_as_one_with_shuffled_data_and_dropout():
    split, whole = Dropped(), Dropped()
    first, second = fit(split, 2, 16, 5, shuffle=True), fit(split, 2, 16, 5, shuffle=True)
    one = fit(whole, 2, 16, 10, shuffle=True)
    assert first.log.columns["lr"] + second.log.columns["lr"] == one.log.columns["lr"]
    assert [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125] == pytest.approx(one.log.columns["lr"])
    assert_same_weights(split, whole)


def test_a_scheduler_shipped_with_its_optimizer_steps_without_torchs_override_warning():
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    recipe = Recipe(model=model, train_data=TensorDataset(torch.randn(4, 4), torch.randn(4, 1)),
                    loss_fn=nn.MSELoss(), optimizer=optimizer, scheduler=scheduler)
    run = RunDir.create(config=nbtrain.TrainConfig(), recipe=recipe)
    try:
        shipped = run.recipe()  # as a rank reads it
    finally:
        run.remove()
    assert shipped.scheduler.optimizer.param_groups[0]["lr"] == 0.1  # its rates untouched
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shipped.scheduler.optimizer.step()
        shipped.scheduler.step()
    assert shipped.scheduler.get_last_lr() == [0.05]


class LitScheduled(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.net = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        optimizer = sgd_momentum(self.parameters())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": step_lr(optimizer), "interval": "step"}}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=16, shuffle=False)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_lightningmodule_cells_on_two_devices_continue_as_one_plain_loop_without_torchs_warning(ip, capfd):
    reference = LitScheduled()
    rates = plain_loop(reference.net, ((2, 16, 5), (2, 16, 5)))
    ip.user_ns.update(LitScheduled=LitScheduled)
    ip.run_cell("model = LitScheduled()")
    for name in ("first", "second"):
        ip.run_cell(f"%%nbtrain --devices 2 --accelerator cpu --max-steps 5 --no-plot --no-progress --name {name}\n"
                    "pass")
    results = [ip.user_ns[name] for name in ("first", "second")]
    assert [lr for r in results for lr in r.log.columns["lr"]] == pytest.approx(rates, rel=1e-12)
    assert_same_weights(ip.user_ns["model"], reference)
    assert "has been overridden after learning rate scheduler initialization" not in "".join(capfd.readouterr())


def test_the_kernel_holds_a_ddp_call_as_one_process_of_the_same_global_batch_where_the_model_is():
    config = nbtrain.TrainConfig(devices=2, batch_size=16, accelerator="cuda", precision="16-mixed", strategy="ddp",
                                 preload_data=True, resume="last")
    kernel = carry.kernel_config(config, linear())  # no live engine yet: the model stays put, the data unread
    assert (kernel.world_size, kernel.global_batch_size, kernel.accelerator, kernel.precision, kernel.strategy,
            kernel.preload_data, kernel.resume) == (1, 32, "cpu", "32-true", "auto", False, None)
    engine = nbtrain.Engine(Recipe(model=linear(), train_data=DATA, loss_fn=nn.CrossEntropyLoss()),
                            nbtrain.TrainConfig(accelerator="cpu", precision="bf16-mixed", preload_data=True))
    held = carry.kernel_config(config.replace(precision="bf16-mixed", accelerator="auto", preload_data=None),
                               engine.model, engine)
    assert (held.accelerator, held.precision, held.preload_data) == ("cpu", "bf16-mixed", True)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_first_ddp_call_builds_no_engine_in_the_kernel_before_its_ranks_start_and_leaves_one_that_continues(
        monkeypatch):
    from nbtrain.distributed.launchers.local import LocalTarget
    built, at_start = [], []
    engine_init, start = nbtrain.Engine.__init__, LocalTarget.start

    def counted_init(self, *args, **kwargs):
        built.append(self)
        engine_init(self, *args, **kwargs)

    def noted_start(self, *args, **kwargs):
        at_start.append(len(built))
        return start(self, *args, **kwargs)

    monkeypatch.setattr(nbtrain.Engine, "__init__", counted_init)
    monkeypatch.setattr(LocalTarget, "start", noted_start)
    model, reference = linear(), linear()
    calls = ((2, 16, 3), (1, 32, 2))  # a first DDP call, then the kernel continues it
    expected = plain_loop(reference, calls)
    first = fit(model, *calls[0])
    assert at_start == [0]  # the ranks started before any Engine was built in the kernel
    live = nbtrain.api.live_engine(model)
    assert live is not None and built == [live] and live.step == 3  # made from what the ranks brought back
    second = fit(model, *calls[1])
    assert first.log.columns["lr"] + second.log.columns["lr"] == pytest.approx(expected, rel=1e-12)
    assert_same_weights(model, reference)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_first_ddp_call_trains_the_users_optimizer_instance_at_the_lr_rules_warmed_up_rates():
    # The ranks get the user's optimizer as given. Before, a kernel engine built first had already set the
    # instance's rate to its first warmed-up one (0.2 / 3), which the ranks then took for the user's own rate:
    # they trained at 0.067, 0.089, 0.133, 0.133 instead of 0.067, 0.133, 0.2, 0.2.
    model, reference = linear(), linear()
    rule = lambda step: 0.1 * 2 * min(1.0, (step + 1) / 3)  # noqa: E731  linear rule: global batch 32 / 16
    expected = plain_loop(reference, ((2, 16, 4), (2, 16, 2)), rate=rule)
    optimizer = sgd_momentum(model.parameters())
    results = [nbtrain.fit(model, DATA, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, devices=2, batch_size=16,
                           max_steps=steps, accelerator="cpu", shuffle=False, warmup_steps=3, scale_lr="linear",
                           base_batch_size=16) for steps in (4, 2)]
    assert [lr for r in results for lr in r.log.columns["lr"]] == pytest.approx(expected, rel=1e-12)
    assert expected[:4] == pytest.approx([0.2 / 3, 0.4 / 3, 0.2, 0.2])
    assert_same_weights(model, reference)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_ranks_of_a_first_unseeded_ddp_call_shuffle_by_one_seed_the_kernel_keeps():
    # seed=None: the kernel draws one for every rank (a rank drawing its own would deal the epoch's
    # samples by another permutation than its peers'); the kernel's engine keeps it for the next call.
    # torchrun: each rank a fresh interpreter (ranks forked from one zygote would draw alike by chance).
    model, reference = linear(), linear()
    result = fit(model, 2, 16, 3, shuffle=True, seed=None, launcher="torchrun")
    seed = nbtrain.api.live_engine(model).seed
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()  # DistributedSampler's, epoch 0
    expected = plain_loop(reference, ((2, 16, 3),), order=order)
    assert list(result.log.columns["lr"]) == pytest.approx(expected, rel=1e-12)
    assert_same_weights(model, reference)
