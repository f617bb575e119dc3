"""Two runs differing only where an older digest did not read (a notebook global, a hook, an attribute object,
a dtype, a process-wide flag) never read "same settings (A/A)": the digest (engine/workload.py) reads each of
them, and where it reads two runs alike but their rates are far apart, the observation wins (runs/apart.py).

Each kind is built as a notebook builds it: its classes and functions defined in a namespace of their own
(a cell's globals), with a setting that makes a step do more work (`REPEATS` extra matmuls)."""
import contextlib
import re
import textwrap

import pytest
import torch
from torch import nn

import nbtrain
from nbtrain import Recipe
from nbtrain.engine.workload import digest
from nbtrain.runs.repeats import same_settings

CELL = textwrap.dedent("""
    import dataclasses
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    @dataclasses.dataclass
    class Cfg:
        repeats: int = 0

    def work(x, repeats):  # more repeats: more work per step, the same result
        for _ in range(repeats):
            x = x + 0 * (x @ torch.ones(x.shape[-1], x.shape[-1], dtype=x.dtype))
        return x

    class Net(nn.Module):
        def __init__(self, cfg=None):
            super().__init__()
            self.net, self.cfg = nn.Linear(8, 1), cfg

        def forward(self, x):
            x = work(x.float(), REPEATS + (self.cfg.repeats if self.cfg else 0))
            return self.net(x)

    class Pairs(Dataset):
        def __init__(self, cfg=None, dtype=torch.float32):
            g = torch.Generator().manual_seed(0)
            self.x, self.y, self.cfg, self.dtype = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g), cfg, dtype

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return work(self.x[i].to(self.dtype), self.cfg.repeats if self.cfg else 0), self.y[i]

    def loss(out, y):
        return nn.functional.mse_loss(work(out, LOSS_REPEATS), y)

    def collate(items):
        xs, ys = torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])
        return work(xs, COLLATE_REPEATS), ys

    def hook(module, args, output):
        return work(output, HOOK_REPEATS)
""")

KINDS = ["a global read in forward", "a register_forward_hook", "a dataclass config on a module",
         "a dataclass config on a Dataset", "a Dataset's dtype attribute", "a loss reading a global",
         "a collate_fn reading a global", "set_detect_anomaly", "set_num_threads"]


def notebook(**settings):
    """The cell run in a fresh namespace (as `__main__`, a notebook's), its globals at `settings`."""
    namespace = {"__name__": "__main__", "REPEATS": 0, "LOSS_REPEATS": 0, "COLLATE_REPEATS": 0, "HOOK_REPEATS": 0}
    namespace.update(settings)
    exec(CELL, namespace)
    return namespace


def variant(kind: str, more: bool):
    """(recipe, process-wide context) of `kind`, the heavier setting where `more`."""
    k = 6 if more else 0
    nb = notebook(**{"a global read in forward": {"REPEATS": k}, "a loss reading a global": {"LOSS_REPEATS": k},
                     "a collate_fn reading a global": {"COLLATE_REPEATS": k}}.get(kind, {}))
    torch.manual_seed(0)
    model = nb["Net"](nb["Cfg"](k) if kind == "a dataclass config on a module" else None)
    data = nb["Pairs"](cfg=nb["Cfg"](k) if kind == "a dataclass config on a Dataset" else None,
                       dtype=torch.float64 if more and kind == "a Dataset's dtype attribute" else torch.float32)
    if kind == "a register_forward_hook" and more:
        nb["HOOK_REPEATS"] = 6
        model.register_forward_hook(nb["hook"])
    context = contextlib.nullcontext()
    if kind == "set_detect_anomaly":
        context = torch.autograd.set_detect_anomaly(more)
    elif kind == "set_num_threads":
        context = _threads(1 if more else 2)
    recipe = Recipe(model=model, train_data=data, loss_fn=nb["loss"], collate_fn=nb["collate"],
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    return recipe, context


@contextlib.contextmanager
def _threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _digest(kind, more):
    recipe, context = variant(kind, more)
    with context:
        return digest(recipe)


@pytest.mark.parametrize("kind", KINDS)
def test_a_hidden_difference_changes_the_digest_and_a_twin_keeps_it(kind):
    light, twin, heavy = _digest(kind, False), _digest(kind, False), _digest(kind, True)
    assert light == twin is not None  # built afresh, the same: still the same settings
    assert heavy != light


@pytest.mark.parametrize("kind", KINDS)
def test_runs_with_a_hidden_difference_never_read_a_a(kind):
    runs = []
    for more, name in ((False, "light"), (True, "heavy")):
        recipe, context = variant(kind, more)
        with context:
            runs.append(nbtrain.fit(recipe=recipe, max_steps=6, batch_size=8, accelerator="cpu", name=name,
                                    log_every_n_steps=1))
    assert not same_settings(*runs)
    cell = nbtrain.compare(*runs).rows[1]["vs first"]
    assert "A/A" not in cell, cell


def test_an_unreadable_part_makes_the_digest_unknown_and_unknown_is_never_the_same():
    recipe, _ = variant("a global read in forward", False)
    recipe.model.handle = open(__file__)  # a file object read in forward: nbtrain cannot say what it holds
    try:
        assert digest(recipe) is None
    finally:
        recipe.model.handle.close()


def test_a_global_in_a_users_own_module_is_read_by_value(tmp_path, monkeypatch):
    (tmp_path / "settings_of_mine.py").write_text("SCALE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import settings_of_mine
    nb = notebook(settings_of_mine=settings_of_mine)
    exec("def scaled_loss(out, y):\n    return nn.functional.mse_loss(out * settings_of_mine.SCALE, y)\n", nb)
    recipe = Recipe(model=nb["Net"](), train_data=nb["Pairs"](), loss_fn=nb["scaled_loss"])
    before = digest(recipe)
    monkeypatch.setattr(settings_of_mine, "SCALE", 3)
    assert None not in (before, digest(recipe)) and digest(recipe) != before
    assert re.fullmatch(r"[0-9a-f]{16}", before)


class Settings:  # a plain settings object, neither a dataclass nor a module
    def __init__(self, repeats):
        self.repeats = repeats


def _more_work(module, *args):
    return None


MORE_KINDS = {
    "a forward pre-hook": lambda model: model.register_forward_pre_hook(_more_work),
    "a full backward hook": lambda model: model.register_full_backward_hook(_more_work),
    "a hook on a torch submodule": lambda model: model.net.register_forward_hook(_more_work),
    "a parameter's gradient hook": lambda model: model.net.weight.register_hook(lambda grad: grad * 1),
    "a global module hook": lambda model: nn.modules.module.register_module_forward_hook(_more_work),
    "a plain settings object, edited in place": lambda model: setattr(model.settings, "repeats", 6),
    "a class attribute": lambda model: setattr(type(model), "SCALE", 6),
    "a matmul precision": lambda model: torch.set_float32_matmul_precision("medium"),
    "deterministic algorithms": lambda model: torch.use_deterministic_algorithms(True),
}


@pytest.mark.parametrize("kind", list(MORE_KINDS))
def test_more_hidden_differences_change_the_digest(kind):
    nb = notebook()
    recipe = Recipe(model=nb["Net"](), train_data=nb["Pairs"](), loss_fn=nb["loss"])
    recipe.model.settings = Settings(0)
    before = digest(recipe)
    precision, deterministic = torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()
    handle = MORE_KINDS[kind](recipe.model)
    try:
        assert None not in (before, digest(recipe)) and digest(recipe) != before
    finally:
        if hasattr(handle, "remove"):
            handle.remove()
        torch.set_float32_matmul_precision(precision)
        torch.use_deterministic_algorithms(deterministic)
    if recipe.model.settings.repeats == 0 and not hasattr(type(recipe.model), "SCALE"):
        assert digest(recipe) == before  # the hook removed, the flag put back: the same settings again
