"""A tool's trial never reaches the live engine (engine/borrow.py): it borrows the model and gives it back.

Generated over every tool of the registry (nbtrain.ab among them) x every kind of training data: after a few
steps that leave a pass open, the tool runs with a tiny budget; the live engine is then the same objects
(optimizer, schedule, loader, config, recipe) holding the same values (optimizer state, the schedule's
state and notes, the loader's open pass and every generator under it, the position, notes, RNG, weights),
and the next steps train exactly as a twin's that never ran the tool. No code puts any of it back: the
trial trains parts of its own.
"""
import copy
import functools
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, SubsetRandomSampler, TensorDataset, \
    WeightedRandomSampler

import nbtrain
from nbtrain.api import live_engine
from nbtrain.tools.registry import TOOLS

N = 96


class Rows(Dataset):
    """A map-style Dataset nbtrain builds the loader for (not a TensorDataset: not held)."""

    def __init__(self, noise: bool = False, n: int = N):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.noise = torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g), noise

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] + 0.1 * torch.randn(6) if self.noise else self.x[i]  # a random augmentation
        return x, self.y[i]


class Stream(IterableDataset):
    def __init__(self):
        self.rows = Rows()

    def __iter__(self):
        return (self.rows[i] for i in range(N))


def _tensors():
    rows = Rows()
    return TensorDataset(rows.x, rows.y)


# Each kind: (training data, fit's options). Made fresh for the live model and for its twin alike.
KINDS = {
    "dataset": lambda: (Rows(), {"shuffle": True}),
    "held": lambda: (_tensors(), {"shuffle": True}),
    "own_sampler": lambda: (DataLoader(Rows(), 8, sampler=SubsetRandomSampler(range(80))), {}),
    "weighted": lambda: (DataLoader(Rows(), 8, sampler=WeightedRandomSampler(
        torch.linspace(0.1, 1, N), N, generator=torch.Generator().manual_seed(5))), {}),
    "workers": lambda: (Rows(noise=True), {"num_workers": 2, "shuffle": True}),
    "stream": lambda: (Stream(), {}),
}

# Each tool with a tiny budget; `cache` reads the data set alone (it never trains).
TINY = {
    "profile": dict(steps=2, warmup_steps=0, ceilings=False),
    "ceilings": dict(steps=10, seconds=0.05),
    "find_batch_size": dict(max_batch=8, steps=1, speed_s=0),
    "find_workers": dict(candidates=[0], seconds=0.05, warmup_steps=0),
    "find_lr": dict(steps=5),
    "find_leaks": dict(steps=4),
    "find_sync": dict(steps=1),
    "checklist": dict(budget_s=1.0, trial_s=0.1, items=("batch_size",), clock=lambda: 0.0),
    # Its compute and its check are read on 2 ranks launched apart (trial.run_apart): the live engine must not
    # follow them as a DDP call's does (distributed/carry.py).
    "forecast": dict(seconds=0.2, devices=[1, 2], nodes=[1], check=True),
}
# Every launch of ranks costs seconds: the forecast over the data nbtrain batches and a user's own sampler.
FORECAST_KINDS = ("dataset", "own_sampler")
TOOL_NAMES = sorted(TOOLS)


def _fit(model, data, options, steps=3):
    return nbtrain.fit(model, data, loss_fn=nn.MSELoss(), optimizer=lambda p: torch.optim.Adam(p, lr=0.01),
                       scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5), seed=0, max_steps=steps,
                       accelerator="cpu", **{"batch_size": 8, **options})


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def _values(obj, path="loader", depth=0, seen=None) -> dict:
    """Every value under a loader (to depth 4): numbers, strings, generators' states, tensors and the identity
    of every object (its open pass, its iterator); data sets are left out (their rows are the data)."""
    seen = set() if seen is None else seen
    if isinstance(obj, (bool, int, float, str, type(None))):
        return {path: obj}
    if isinstance(obj, torch.Generator):
        return {path: obj.get_state()}
    if isinstance(obj, torch.Tensor):
        return {path: obj.clone()}
    found = {path: ("object", id(obj), type(obj).__name__)}
    if id(obj) in seen or depth >= 4 or isinstance(obj, Dataset) or callable(obj) and not hasattr(obj, "__dict__"):
        return found
    seen.add(id(obj))
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) \
        else vars(obj).items() if hasattr(obj, "__dict__") else ()
    for key, value in list(items)[:20]:
        found.update(_values(value, f"{path}.{key}", depth + 1, seen))
    return found


def _live(engine) -> dict:
    """The live engine: which objects it holds, and what they hold."""
    schedule = engine.schedule
    return {"objects": [id(part) for part in (engine.optimizer, schedule, engine.loader, engine.config, engine.recipe,
                                              engine.train_model, engine.precision)],
            "optimizer": copy.deepcopy(engine.optimizer.state_dict()),
            "schedule": (copy.deepcopy(schedule.state_dict()), list(schedule.notes)),
            "loader": _values(engine.loader), "config": engine.config.to_dict(), "position": engine.position(),
            "notes": dict(engine.notes), "weights": [t.clone() for t in engine.model.state_dict().values()],
            "rng": (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _differences(before: dict, after: dict) -> list:
    out = []
    for key in before:
        if key == "loader":
            out += [f"loader {p}" for p in before[key].keys() | after[key].keys()
                    if not _same(before[key].get(p), after[key].get(p))]
        elif not _same(before[key], after[key]):
            out.append(key)
    return out


def _use(tool: str, model, data, tmp_path):
    if tool == "ab":
        return nbtrain.ab(model, a={}, b={"gradient_clip_val": 1.0}, block_steps=2, min_pairs=2, max_pairs=2)
    if tool == "cache":
        dataset = data.dataset if isinstance(data, DataLoader) else data
        if isinstance(dataset, IterableDataset) or getattr(dataset, "noise", False):  # refused: a stream, a random read
            with pytest.raises(ValueError, match="map-style|random"):
                TOOLS["cache"].function(dataset, tmp_path)
            return None
        return TOOLS["cache"].function(dataset, tmp_path, num_workers=0)
    # A SubsetRandomSampler split is rebuilt (user_loader.py), so its batch size can change; a weighted one cannot.
    refused = {("checklist", "stream"): "stream", ("find_batch_size", "weighted"): "cannot change"}
    kind = "stream" if isinstance(data, IterableDataset) else data.sampler.__class__.__name__ \
        if isinstance(data, DataLoader) else ""
    kind = {"SubsetRandomSampler": "own_sampler", "WeightedRandomSampler": "weighted"}.get(kind, kind)
    if (tool, kind) in refused:  # one clear refusal, and nothing reached
        with pytest.raises(nbtrain.tools.tool_options.ToolRefusal, match=refused[tool, kind]):
            TOOLS[tool].function(model, **TINY[tool])
        return None
    return TOOLS[tool].function(model, **TINY[tool])


def _slow(tool, kind):
    """Worker start-ups, the device's peak rates (ceilings) and the collector's passes (leaks) take seconds."""
    return (kind == "workers" and tool not in ("profile", "find_lr")) or tool in ("ceilings", "find_leaks") \
        and kind not in ("dataset", "held")


CASES = [pytest.param(tool, kind, marks=[pytest.mark.slow] if _slow(tool, kind) or tool == "forecast" else [])
         for tool in TOOL_NAMES for kind in KINDS if tool != "forecast" or kind in FORECAST_KINDS]


@pytest.mark.parametrize("tool, kind", CASES)
def test_a_tool_leaves_the_live_engine_as_it_was_and_the_next_steps_train_as_a_twins(tool, kind, tmp_path):
    model, (data, options) = _model(), KINDS[kind]()
    _fit(model, data, options)  # 3 steps: an epoch of 12 batches left open
    engine = live_engine(model)
    before = _live(engine)
    _use(tool, model, data, tmp_path)
    assert live_engine(model) is engine
    assert not _differences(before, _live(engine)), _differences(before, _live(engine))
    notes = _fit(model, data, options).summary.notes
    weights, optimizer, twin_notes = _twin(kind)
    assert _same(list(model.state_dict().values()), weights)
    assert _same(engine.optimizer.state_dict()["state"], optimizer)
    assert notes == twin_notes  # nothing said of a pass read again, a resume or a schedule the tool rescaled


@functools.lru_cache(maxsize=None)
def _twin(kind):
    """The weights and optimizer state of a twin that trained the same steps without any tool."""
    twin, (twin_data, options) = _model(), KINDS[kind]()
    _fit(twin, twin_data, options)
    notes = _fit(twin, twin_data, options).summary.notes
    return list(twin.state_dict().values()), live_engine(twin).optimizer.state_dict()["state"], notes


# --- what the trial design ends (issue 37, items 6, 8, 11, 12) ------------------------------------------

MAGIC_DATA = """
import torch
from torch.utils.data import DataLoader, SubsetRandomSampler
from test_trial_isolation import Rows, _model
model = _model()
train_data = DataLoader(Rows(), 8, sampler=SubsetRandomSampler(range(80)))
loss_fn = torch.nn.MSELoss()
"""


@pytest.mark.slow
def test_a_profile_cell_between_two_cells_over_a_users_sampler_leaves_the_open_pass_to_the_next_cell(ip, capsys):
    def weights_after(profile: bool):
        ip.run_cell("%%nbtrain --max-steps 3 --seed 0 --no-progress --no-plot" + MAGIC_DATA)
        if profile:
            assert ip.run_cell("%%nbtrain --profile --steps 2\npass\n").error_in_exec is None
        ip.run_cell("%%nbtrain --max-steps 3 --seed 0 --no-progress --no-plot\npass\n")
        notes = ip.user_ns["_nbtrain"].summary.notes
        return [p.detach().clone() for p in ip.user_ns["model"].parameters()], notes

    (profiled, notes), (twin, twin_notes) = weights_after(True), weights_after(False)
    capsys.readouterr()
    assert _same(profiled, twin) and notes == twin_notes
    assert not any("read again" in note for note in notes)  # no note blaming workers or a resume


@pytest.mark.slow
def test_after_keep_best_the_summary_is_a_twins_given_the_kept_config_directly():
    data, options = Rows(n=512), {"shuffle": True, "scale_lr": "linear", "base_batch_size": 8}  # the rule rescales
    kept, twin = _model(), _model()
    _fit(kept, data, options)
    _fit(twin, data, options)
    walk = nbtrain.checklist(kept, budget_s=6, trial_s=0.1, items=("batch_size",), keep_best=True,
                             clock=lambda: 0.0)
    best = walk.best_config
    assert live_engine(kept).config == best
    nbtrain.api.engine_for(live_engine(twin).recipe, best)  # the twin is given the kept config directly
    runs = [_fit(model, data, {**options, "batch_size": best.batch_size}) for model in (kept, twin)]
    assert runs[0].summary.notes == runs[1].summary.notes, best  # no rescale from the walk's blocks
    assert _same(list(kept.state_dict().values()), list(twin.state_dict().values()))


def test_ceilings_on_a_loss_that_is_not_finite_stop_as_ab_does():
    rows = Rows()
    data = TensorDataset(rows.x, torch.full_like(rows.y, float("nan")))
    for measure in (lambda: nbtrain.ceilings(_model(), data, loss_fn=nn.MSELoss(), steps=10, seconds=0.05),
                    lambda: nbtrain.ab(_model(), data, loss_fn=nn.MSELoss(), b={"gradient_clip_val": 1.0},
                                       block_steps=2, min_pairs=2, max_pairs=2)):
        with pytest.raises(nbtrain.tools.tool_options.ToolRefusal, match=r"the loss became nan.* so no speed is compared"):
            measure()


def test_tools_take_training_options_as_fit_does_and_name_an_unknown_one():
    model = _model()
    _fit(model, Rows(), {})
    engine = live_engine(model)
    config = engine.config
    profiled = nbtrain.profile(model, steps=2, warmup_steps=0, ceilings=False, batch_size=16, shuffle=False)
    assert profiled.config.batch_size == 16 and not profiled.config.shuffle and live_engine(model).config is config
    with pytest.raises(nbtrain.tools.tool_options.ToolOptionError,
                       match=r"nbtrain.profile: batchsize=64: allowed: .* a training option as nbtrain.fit takes it "
                             r".*did you mean 'batch_size'"):
        nbtrain.profile(model, steps=2, batchsize=64)
    with pytest.raises(nbtrain.ConfigError, match="batch_size=-1"):
        nbtrain.profile(model, steps=2, batch_size=-1)


def test_a_tool_on_a_model_not_trained_yet_steps_none_of_the_users_own_objects_and_attaches_nothing():
    def parts():
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5)

    (model, optimizer, scheduler), (twin, twin_optimizer, twin_scheduler) = parts(), parts()
    loader = DataLoader(Rows(), 8, sampler=WeightedRandomSampler(torch.linspace(0.1, 1, N), N,
                                                                   generator=torch.Generator().manual_seed(5)))
    twin_loader = DataLoader(Rows(), 8, sampler=WeightedRandomSampler(torch.linspace(0.1, 1, N), N,
                                                                        generator=torch.Generator().manual_seed(5)))
    seen = _values(loader)
    nbtrain.ab(model, loader, loss_fn=nn.MSELoss(), optimizer=optimizer, scheduler=scheduler,
               b={"gradient_clip_val": 1.0}, block_steps=2, min_pairs=2, max_pairs=2)
    assert live_engine(model) is None and not optimizer.state and scheduler.last_epoch == 0
    assert not [path for path in seen if not _same(seen[path], _values(loader).get(path))]
    for m, o, s, d in ((model, optimizer, scheduler, loader), (twin, twin_optimizer, twin_scheduler, twin_loader)):
        nbtrain.fit(m, d, loss_fn=nn.MSELoss(), optimizer=o, scheduler=s, max_steps=4, seed=0, accelerator="cpu")
    assert _same(list(model.state_dict().values()), list(twin.state_dict().values()))


def test_a_trial_keeps_one_copy_of_the_weights_and_of_the_optimizer_state_for_its_blocks():
    model = _model()
    _fit(model, Rows(), {})
    live = live_engine(model)
    with live.trial() as lent:
        kept = {id(values) for values in lent.loan.saved().values()}
        assert all(id(values) in kept for values in lent.start.state["model"].values())
        theirs = {id(t) for values in live.optimizer.state.values() for t in values.values()}
        saved = [t for values in lent.start.state["optimizer"]["state"].values() for t in values.values()]
        assert saved and all(id(t) in theirs for t in saved)  # the live state, read, never stepped
        lent.engine.run()
        lent.reset()
        assert _same(lent.engine.optimizer.state_dict()["state"], live.optimizer.state_dict()["state"])
