"""nbtrain against a plain hand-written loop, on generated combinations (issue 13's net).

Each case is a sequence of runs on one live model, as a notebook user makes them: `nbtrain.fit`
again and again, with the batch size, accumulation or precision changed between runs, a run
that crashes after writing checkpoints, `resume='last'` (twice, or with another batch size,
into the same model or a fresh one), an optimizer given as an instance with param groups or as
a factory, frozen parameters, dropout and BatchNorm buffers. The reference is the loop a
person would write by hand over the same data order, with checkpoints kept as in-memory
copies. At fp32 on the CPU the weights must come out bit-identical.

Every case runs twice: batches through the DataLoader, and cut from the data held in memory
(preload_data); both must match the plain loop.

NBTRAIN_DIFFERENTIAL_CASES (default 40, a few seconds) sets how many cases are generated;
NBTRAIN_DIFFERENTIAL_SEED picks another set.
"""
from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
import nbtrain.engine.data

N_SAMPLES, FEATURES = 52, 6
CASES = int(os.environ.get("NBTRAIN_DIFFERENTIAL_CASES", "40"))
SEED = int(os.environ.get("NBTRAIN_DIFFERENTIAL_SEED", "2026"))
OPTIMIZERS = ("sgd-groups-instance", "sgd-momentum-factory", "adam-weight-decay-groups-instance",
              "adamw-factory", "adamw-instance")


@dataclass
class Run:
    steps: int
    batch: int
    accumulate: int = 1
    precision: str = "32-true"
    crash_at_call: int | None = None  # the loss call (1-based, this run) that raises
    resume: bool = False              # resume='last' (continues the crashed run's plan)
    fresh_model: bool = False         # resume into a new model object, as after a kernel restart
    change_at_call: int | None = None  # the loss call during which a live change is requested
    change: dict = field(default_factory=dict)  # e.g. {"batch_size": 5} or {"precision": "bf16-mixed"}


@dataclass
class Case:
    optimizer: str
    frozen: bool
    dropout: bool
    batchnorm: bool
    drop_last: bool
    checkpoint_every: int
    runs: list = field(default_factory=list)

    def __str__(self):
        parts = [self.optimizer] + [w for w, on in (("frozen", self.frozen), ("dropout", self.dropout),
                                                     ("batchnorm", self.batchnorm), ("drop_last", self.drop_last)) if on]
        for r in self.runs:
            text = f"{r.steps}x{r.batch}"
            text += f"/acc{r.accumulate}" if r.accumulate > 1 else ""
            text += "/bf16" if r.precision != "32-true" else ""
            text += f"/crash@{r.crash_at_call}" if r.crash_at_call else ""
            text += "/resume" + ("-fresh" if r.fresh_model else "") if r.resume else ""
            text += "".join(f"/{k}={v}@{r.change_at_call}" for k, v in r.change.items())
            parts.append(text)
        return " ".join(parts)


def generate(rng: random.Random) -> Case:
    case = Case(optimizer=rng.choice(OPTIMIZERS), frozen=rng.random() < 0.4, dropout=rng.random() < 0.3,
                batchnorm=rng.random() < 0.3, drop_last=rng.random() < 0.3, checkpoint_every=rng.choice((2, 3)))
    case.drop_last |= case.batchnorm  # BatchNorm cannot train on a batch of one sample
    def some_run(**kw):
        return Run(steps=rng.randint(3, 7), batch=rng.choice((4, 5, 8, 16)), accumulate=rng.choice((1, 1, 2, 3)),
                   precision=rng.choice(("32-true",) * 3 + ("bf16-mixed",)), **kw)

    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.45:  # a crash after checkpoints, then one or two resumes
            crashed = some_run()
            crashed.steps += 4
            # after the first checkpoint (each step takes at most `accumulate` calls), before the plan ends
            first_checkpoint = case.checkpoint_every * crashed.accumulate + 1
            crashed.crash_at_call = rng.randint(first_checkpoint, max(first_checkpoint, (crashed.steps - 1) * crashed.accumulate))
            case.runs.append(crashed)
            again = rng.random() < 0.5
            resumed = copy.copy(crashed)
            resumed.crash_at_call, resumed.resume = None, True
            resumed.fresh_model = rng.random() < 0.3
            if rng.random() < 0.4:
                resumed.batch = rng.choice((4, 5, 8))
            if again:  # crashes again, and is resumed again
                second = copy.copy(resumed)
                second.crash_at_call = rng.randint(2, 6)
                case.runs.append(second)
            case.runs.append(resumed)
        else:
            run = some_run()
            if rng.random() < 0.5:  # a change asked for while the run trains (the panel's sliders)
                run.change_at_call = rng.randint(1, run.steps)
                run.change = rng.choice(({"batch_size": rng.choice((4, 5, 8, 16))},
                                         {"precision": rng.choice(("32-true", "bf16-mixed"))},
                                         {"accumulate_grad_batches": rng.choice((1, 2))}))
            case.runs.append(run)
    return case


# --- the model, data and optimizers, built the same way for both sides -----------------


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N_SAMPLES, FEATURES, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True).tanh() + 0.05 * torch.randn(N_SAMPLES, 1, generator=g))


def make_model(case: Case) -> nn.Module:
    torch.manual_seed(11)
    layers = [nn.Linear(FEATURES, 12)]
    layers += [nn.BatchNorm1d(12)] if case.batchnorm else []
    layers += [nn.Tanh()] + ([nn.Dropout(0.2)] if case.dropout else []) + [nn.Linear(12, 1)]
    model = nn.Sequential(*layers)
    if case.frozen:
        model[0].bias.requires_grad_(False)
    return model


def make_optimizer(case: Case, model: nn.Module):
    """What the user passes: an instance (param groups and all) or a factory params -> optimizer."""
    first, last = model[0], model[len(model) - 1]
    if case.optimizer == "sgd-groups-instance":  # layer 0 frozen by lr=0, the head at the default rate
        return torch.optim.SGD([{"params": first.parameters(), "lr": 0.0},
                                {"params": [p for m in list(model)[1:] for p in m.parameters()]}],
                               lr=0.1, momentum=0.9)
    if case.optimizer == "adam-weight-decay-groups-instance":  # weight decay on weights only
        weights = [p for n, p in model.named_parameters() if n.endswith("weight") and p.ndim > 1]
        others = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.ndim > 1)]
        return torch.optim.Adam([{"params": weights, "weight_decay": 0.1}, {"params": others, "lr": 3e-3}],
                                lr=1e-2)
    if case.optimizer == "adamw-instance":
        return torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.05)
    if case.optimizer == "sgd-momentum-factory":
        return lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.5)
    assert last is not None
    return lambda params: torch.optim.AdamW(params, lr=4e-3)


def reference_optimizer(case: Case, model: nn.Module):
    made = make_optimizer(case, model)
    return made if isinstance(made, torch.optim.Optimizer) else made(model.parameters())


class ScriptedLoss(nn.MSELoss):
    """MSE that, at given calls, raises (a crash mid-run, after checkpoints) or asks the live engine
    for a change, as a control panel would while the run trains."""

    def __init__(self, run: Run, model: nn.Module):
        super().__init__()
        self.run, self.model, self.calls = run, model, 0

    def forward(self, output, target):
        self.calls += 1
        if self.calls == self.run.crash_at_call:
            raise RuntimeError("simulated crash")
        if self.calls == self.run.change_at_call:
            nbtrain.api.live_engine(self.model).request(**self.run.change)
        return super().forward(output, target)


# --- the plain loop ------------------------------------------------------------------


class PlainLoop:
    """The hand-written loop: DistributedSampler's order for one process, accumulation windows
    cut short at an epoch's end, checkpoints as in-memory copies."""

    def __init__(self, case: Case, train_seed: int):
        self.case, self.seed = case, train_seed
        self.model = make_model(case)
        self.optimizer = reference_optimizer(case, self.model)
        self.dataset = data()
        self.step = self.epoch = self.offset = 0
        self.saved = None
        self.run_start = 0
        torch.manual_seed(train_seed)

    def order(self, epoch: int) -> list[int]:
        return torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def batches_left(self, batch: int) -> list[int]:
        left = N_SAMPLES - self.offset
        full, rest = divmod(left, batch)
        return [batch] * full + ([rest] if rest and not self.case.drop_last else [])

    def play(self, run: Run) -> None:
        if run.resume:
            model_state, optimizer_state, rng, position = self.saved
            self.model.load_state_dict(model_state)
            self.optimizer.load_state_dict(copy.deepcopy(optimizer_state))  # it keeps the tensors it is given
            torch.set_rng_state(rng)
            self.step, self.epoch, self.offset, self.run_start = position
        else:
            self.run_start = self.step
        self.model.zero_grad(set_to_none=True)  # a crashed run's half-accumulated gradients are gone
        loss_fn, calls = nn.MSELoss(), 0
        batch, accumulate, precision = run.batch, run.accumulate, run.precision
        while self.step - self.run_start < run.steps:
            sizes = self.batches_left(batch)
            if not sizes:
                self.epoch, self.offset = self.epoch + 1, 0
                continue
            window = min(accumulate, len(sizes))
            order = self.order(self.epoch)
            changed = False
            for size in sizes[:window]:
                x, y = self.dataset[order[self.offset:self.offset + size]]
                calls += 1
                changed |= calls == run.change_at_call
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                    output = self.model(x)  # (BatchNorm counts this batch even when the loss then fails)
                    if calls == run.crash_at_call:
                        return  # crashed: the weights stay as they are, the next run resumes
                    loss = loss_fn(output, y)
                    if window > 1:
                        loss = loss / window
                loss.backward()
                self.offset += size
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            if self.step % self.case.checkpoint_every == 0:
                self.saved = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict()),
                              torch.get_rng_state(), (self.step, self.epoch, self.offset, self.run_start))
            exhausted = not self.batches_left(batch)
            if changed:  # a change asked for during this step applies from the next one
                batch = run.change.get("batch_size", batch)
                accumulate = run.change.get("accumulate_grad_batches", accumulate)
                precision = run.change.get("precision", precision)
            if exhausted or not self.batches_left(batch):  # the loader is exhausted: the epoch is over
                self.epoch, self.offset = self.epoch + 1, 0


# --- nbtrain, as a notebook user drives it ---------------------------------------------


def play_nbtrain(case: Case, train_seed: int, folder, preload_data: bool) -> nn.Module:
    model = make_model(case)
    optimizer = make_optimizer(case, model)
    dataset = data()  # defined once, as in a notebook cell above the training cells
    for run in case.runs:
        if run.fresh_model:  # a new kernel: a fresh model and optimizer, the checkpoint brings the state
            model = make_model(case)
            optimizer = make_optimizer(case, model)
        options = dict(batch_size=run.batch, max_steps=run.steps, accumulate_grad_batches=run.accumulate,
                       precision=run.precision, drop_last=case.drop_last, seed=train_seed, accelerator="cpu",
                       checkpoint_every=str(case.checkpoint_every), checkpoint_dir=str(folder),
                       resume="last" if run.resume else None, preload_data=preload_data)
        try:  # (a crash planned past the run's last call never comes: both sides then just finish)
            nbtrain.fit(model, dataset, loss_fn=ScriptedLoss(run, model), optimizer=optimizer, **options)
        except RuntimeError as error:
            assert run.crash_at_call and "simulated crash" in str(error), error
    return model


def _cases():
    rng = random.Random(SEED)
    return [generate(rng) for _ in range(CASES)]


@pytest.mark.parametrize("preload_data", [False, True], ids=["dataloader", "held-in-memory"])
@pytest.mark.parametrize("case", _cases(), ids=str)
def test_nbtrain_trains_exactly_as_the_plain_loop(case, preload_data, tmp_path):
    train_seed = 1000 + sum(map(ord, str(case))) % 1000
    reference = PlainLoop(case, train_seed)
    for run in case.runs:
        reference.play(run)
    trained = play_nbtrain(case, train_seed, tmp_path, preload_data)
    engine = nbtrain.api.live_engine(trained)
    assert isinstance(engine.loader, nbtrain.engine.data.HeldBatches) == preload_data
    for (name, a), b in zip(trained.state_dict().items(), reference.model.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a.float() - b.float()).abs().max().item():.3g} in {case}"
