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
import threading
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



def draw_base_seed() -> None:
    """What `iter(DataLoader)` draws from torch's generator at every pass (its base seed): the loop a user
    writes over a DataLoader draws it, and every later dropout mask depends on it."""
    torch.empty((), dtype=torch.int64).random_()

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
            if self.offset == 0:  # a pass of the loader starts: iter(DataLoader) draws its base seed
                draw_base_seed()
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


# --- sequences that cross calls and tools (issue 27) ----------------------------------------
#
# A live model trained in several calls, as a notebook user drives it: a scheduler added, kept
# (the same factory, or one of the same code and values, as a cell run again makes), replaced or
# removed between calls, its interval changed, a call stopped part-way and the next continuing,
# and a tool (ab, checklist, ceilings, find_batch_size) pointed at the model between two calls.
# A tool changes nothing, so the reference (a plain loop over the same order) never sees it; a
# scheduler given in a later call starts a fresh curve from the optimizer's configured rate.

CALL_CASES = int(os.environ.get("NBTRAIN_DIFFERENTIAL_CALL_CASES", "12"))
TOOLS = (None, None, "ab", "checklist", "ceilings", "find_batch_size")
SCHEDULES = (("step", 2), ("step", 3), ("exp", 0.7), ("exp", 0.9))


def make_scheduler(kind: str, value):
    """A factory the user would write; the same (kind, value) twice is the same code over the same values."""
    if kind == "step":
        return lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, value, 0.5)
    return lambda optimizer: torch.optim.lr_scheduler.ExponentialLR(optimizer, value)


@dataclass
class Call:
    steps: int
    schedule: tuple | None       # (kind, value) given in this call, or None (no scheduler)
    interval: str = "step"
    fresh: bool = False          # this call's scheduler differs from the last call's: a new curve
    stop_after: int | None = None  # the call is stopped after this many of its steps
    tool_before: str | None = None


@dataclass
class CallCase:
    optimizer: str
    batch: int
    calls: list = field(default_factory=list)

    def __str__(self):
        words = [self.optimizer, f"b{self.batch}"]
        for c in self.calls:
            text = f"{c.steps}" + (f"/{c.schedule[0]}{c.schedule[1]}@{c.interval}" if c.schedule else "/none")
            text += f"/stop@{c.stop_after}" if c.stop_after else ""
            words.append((f"{c.tool_before}+" if c.tool_before else "") + text)
        return " ".join(words)


def generate_calls(rng: random.Random) -> CallCase:
    case = CallCase(optimizer=rng.choice(("sgd-momentum", "adam")), batch=rng.choice((5, 8, 16)))
    schedule, interval = rng.choice((None,) + SCHEDULES), "step"
    for i in range(rng.randint(2, 4)):
        if i:  # between calls: keep, replace, remove or add the scheduler, or change its interval
            action = rng.choice(("keep", "keep", "replace", "remove", "interval"))
            if action == "replace" or (action == "interval" and schedule is None):
                schedule = rng.choice([s for s in SCHEDULES if s != schedule])
            elif action == "remove":
                schedule = None
            elif action == "interval":
                interval = "epoch" if interval == "step" else "step"
        fresh = not case.calls or schedule != case.calls[-1].schedule
        call = Call(steps=rng.randint(2, 6), schedule=schedule, interval=interval, fresh=fresh,
                    tool_before=rng.choice(TOOLS) if i else None)
        if rng.random() < 0.25:
            call.stop_after = rng.randint(1, call.steps - 1)
        case.calls.append(call)
    return case


def call_parts(case: CallCase):
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(FEATURES, 12), nn.Tanh(), nn.Linear(12, 1))
    if case.optimizer == "sgd-momentum":
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def play_calls_plainly(case: CallCase, seed: int) -> nn.Module:
    model, optimizer = call_parts(case)
    base_lr = optimizer.param_groups[0]["lr"]
    dataset, step, epoch, offset, scheduler = data(), 0, 0, 0, None
    torch.manual_seed(seed)
    for call in case.calls:
        if call.fresh:  # given anew: built over the optimizer's configured rate, as at a first call
            for group in optimizer.param_groups:
                group["lr"] = base_lr
                group.pop("initial_lr", None)
            scheduler = make_scheduler(*call.schedule)(optimizer) if call.schedule else None
        for _ in range(call.stop_after or call.steps):
            if offset == 0:
                draw_base_seed()
            order = torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
            x, y = dataset[order[offset:offset + case.batch]]
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, offset = step + 1, min(offset + case.batch, N_SAMPLES)
            if scheduler is not None and call.interval == "step":
                scheduler.step()
            if offset == N_SAMPLES:
                epoch, offset = epoch + 1, 0
                if scheduler is not None and call.interval == "epoch":
                    scheduler.step()
    return model


def run_calls_tool(tool: str, model, dataset) -> None:
    parts = {"loss_fn": nn.MSELoss()} if dataset is not None else {}  # a LightningModule brings its own
    if tool == "ab":
        nbtrain.ab(model, dataset, a={}, b={"batch_size": 4}, block_steps=2, min_pairs=2, max_pairs=2, **parts)
    elif tool == "checklist":
        nbtrain.checklist(model, dataset, budget_s=5, items=("batch_size",), **parts)
    elif tool == "ceilings":
        nbtrain.ceilings(model, dataset, steps=10, seconds=0.2, **parts)
    elif tool == "find_batch_size":
        nbtrain.tune.find_batch_size(model, dataset, steps=2, max_batch=16, **parts)


def live_setup(engine) -> tuple:
    """What a tool must leave as it was: optimizer object and state, schedule and its state, config."""
    return (engine.optimizer, copy.deepcopy(engine.optimizer.state_dict()), engine.schedule,
            engine.schedule.state_dict() if engine.schedule is not None else None, engine.config)


def assert_same_setup(before: tuple, after: tuple, what: str) -> None:
    assert before[0] is after[0] and before[2] is after[2] and before[3] == after[3] and before[4] == after[4], what
    for a, b in zip(before[1]["state"].values(), after[1]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a), what
    assert before[1]["param_groups"] == after[1]["param_groups"], what


def play_calls_with_nbtrain(case: CallCase, seed: int) -> nn.Module:
    model, optimizer = call_parts(case)
    dataset = data()
    for call in case.calls:
        if call.tool_before:
            engine = nbtrain.api.live_engine(model)
            before = live_setup(engine)
            run_calls_tool(call.tool_before, model, dataset)
            assert_same_setup(before, live_setup(engine), f"{call.tool_before} changed the live engine in {case}")
        stop = threading.Event()
        loss = nn.MSELoss()
        if call.stop_after:
            calls = iter(range(1, call.stop_after + 1))
            loss = lambda out, y: (stop.set() if next(calls, 0) == call.stop_after else None) or \
                nn.functional.mse_loss(out, y)  # noqa: E731 - stops at this step's boundary
        result = nbtrain.fit(model, dataset, loss_fn=loss, optimizer=optimizer, batch_size=case.batch,
                             scheduler=make_scheduler(*call.schedule) if call.schedule else None,
                             scheduler_interval=call.interval, max_steps=call.steps, seed=seed,
                             accelerator="cpu", stop=stop)
        assert result.summary.run_steps == (call.stop_after or call.steps), case
    return model


@pytest.mark.parametrize("case", [generate_calls(random.Random(SEED + i)) for i in range(CALL_CASES)], ids=str)
def test_calls_schedulers_and_tools_train_exactly_as_the_plain_loop(case):
    seed = 3000 + sum(map(ord, str(case))) % 1000
    reference = play_calls_plainly(case, seed)
    trained = play_calls_with_nbtrain(case, seed)
    for (name, a), b in zip(trained.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g} in {case}"


# A LightningModule trained in several calls (some stopped part-way, a tool between two) ends with
# the weights of one lightning.Trainer fit of as many steps, and sees the Trainer's batch_idx.

LIT_CASES = int(os.environ.get("NBTRAIN_DIFFERENTIAL_LIGHTNING_CASES", "6"))


def lit_module(optimizer: str, schedule: str | None):
    L = pytest.importorskip("lightning", reason="needs lightning (pip install -e '.[test]')")

    class Sequenced(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(11)
            self.net = nn.Sequential(nn.Linear(FEATURES, 12), nn.Tanh(), nn.Linear(12, 1))
            self.batch_indices, self.recording = [], True

        def training_step(self, batch, batch_idx):
            if self.recording:
                self.batch_indices.append(batch_idx)
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            made = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd-momentum" \
                else torch.optim.Adam(self.parameters(), lr=1e-2)
            if schedule is None:
                return made
            return {"optimizer": made, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(made, 2, 0.5),
                                                        "interval": schedule}}

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data(), batch_size=8, shuffle=False)  # 7 batches an epoch

    return L, Sequenced()


def generate_lightning(rng: random.Random) -> dict:
    calls = []
    for i in range(rng.randint(2, 3)):
        steps = rng.randint(2, 8)
        calls.append({"steps": steps, "stop_after": rng.randint(1, steps - 1) if rng.random() < 0.3 else None,
                      "tool": rng.choice((None, "ab", "ceilings", "find_batch_size")) if i else None})
    return {"optimizer": rng.choice(("sgd-momentum", "adam")), "schedule": rng.choice((None, "step", "epoch")),
            "calls": calls}


def _lightning_id(case: dict) -> str:
    return " ".join([case["optimizer"], str(case["schedule"])] + [
        (f"{c['tool']}+" if c["tool"] else "") + f"{c['steps']}" + (f"/stop@{c['stop_after']}" if c["stop_after"] else "")
        for c in case["calls"]])


@pytest.mark.parametrize("case", [generate_lightning(random.Random(SEED + 100 + i)) for i in range(LIT_CASES)],
                         ids=_lightning_id)
def test_a_lightningmodule_over_calls_stops_and_tools_trains_as_one_trainer_fit(case):
    module = lit_module(case["optimizer"], case["schedule"])[1]
    trained = 0
    for call in case["calls"]:
        if call["tool"]:
            engine = nbtrain.api.live_engine(module.__dict__["_nbtrain_training"].value)
            before, module.recording = live_setup(engine), False
            run_calls_tool(call["tool"], module, None)
            module.recording = True
            assert_same_setup(before, live_setup(engine), f"{call['tool']} changed the live engine")
        stop, step = threading.Event(), module.training_step
        if call["stop_after"]:
            seen = len(module.batch_indices)
            module.training_step = lambda batch, i: (stop.set() if len(module.batch_indices) - seen + 1 ==
                                                     call["stop_after"] else None) or step(batch, i)
        result = nbtrain.fit(module, max_steps=call["steps"], accelerator="cpu", stop=stop)
        module.training_step = step
        trained += result.summary.run_steps
    L, reference = lit_module(case["optimizer"], case["schedule"])
    L.Trainer(max_steps=trained, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(reference)
    for (name, a), b in zip(module.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g}"
    assert module.batch_indices == reference.batch_indices


# keep_best: the checklist leaves the live engine on the config it kept, with the user's schedule
# rescaled by the LR rule; the next call then trains as a twin asked for that config directly.


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adam"])
def test_keep_best_then_training_is_the_kept_config_asked_for_directly(optimizer):
    dataset, seed = data(), 4242
    step_lr = lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5)  # noqa: E731
    options = dict(loss_fn=nn.MSELoss(), scheduler=step_lr, scheduler_interval="step", scale_lr="linear",
                   base_batch_size=4, batch_size=4, seed=seed, accelerator="cpu", log_every_n_steps=1)
    case = CallCase(optimizer=optimizer, batch=4)
    (kept, kept_optimizer), (twin, twin_optimizer) = call_parts(case), call_parts(case)
    for model, made in ((kept, kept_optimizer), (twin, twin_optimizer)):
        nbtrain.fit(model, dataset, optimizer=made, max_steps=3, **options)
    result = nbtrain.checklist(kept, dataset, loss_fn=nn.MSELoss(), budget_s=5, items=("batch_size",),
                               keep_best=True)
    best = result.best_config
    assert nbtrain.api.live_engine(kept).config == best and result.kept_on_engine
    if best.batch_size != 4:  # the summary says the user's schedule follows the rule
        assert "the live StepLR's rates rescaled by the same factor" in result.lr_note, result.lr_note
    later = {**options, "batch_size": best.batch_size, "max_steps": 4}
    runs = [nbtrain.fit(model, dataset, optimizer=made, **later) for model, made in
            ((kept, kept_optimizer), (twin, twin_optimizer))]
    assert runs[0].log.columns["lr"] == runs[1].log.columns["lr"], (best.batch_size, runs[0].log.columns["lr"])
    factor = best.batch_size / 4
    assert runs[0].log.columns["lr"][-1] == pytest.approx(kept_optimizer.defaults["lr"] * factor * 0.5 ** 3)
    for (name, a), b in zip(kept.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g} (kept batch {best.batch_size})"
