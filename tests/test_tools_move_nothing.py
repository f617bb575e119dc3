"""A tool moves nothing the next call trains with (issue 49, item 5): a data set's own generator (a stream's
torch.Generator, a Dataset's np.random.default_rng augmentation) and a module's plain Python counter come back
from profile and ab as they were, so the next fit trains exactly as an untouched twin's."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

import nbtrain

N, FEATURES = 48, 4


class Augmented(Dataset):
    """Rows with noise from the data set's own numpy generator (an augmentation)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(N, FEATURES, generator=g), torch.randn(N, 1, generator=g)
        self.rng = np.random.default_rng(7)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i] + torch.from_numpy(self.rng.normal(0, 0.1, FEATURES).astype(np.float32)), self.y[i]


class Stream(IterableDataset):
    """Endless rows drawn from the stream's own torch.Generator."""

    def __init__(self):
        self.g = torch.Generator().manual_seed(3)

    def __iter__(self):
        while True:
            x = torch.randn(FEATURES, generator=self.g)
            yield x, x.sum(0, keepdim=True)


class Ramped(nn.Module):
    """A curriculum: the output's scale ramps with the number of forward calls (a plain Python counter)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Linear(FEATURES, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.net(x) * min(1.0, 0.2 + self.calls / 10)


TOOLS = {
    "profile": lambda model: nbtrain.profile(model, steps=2, warmup_steps=0, ceilings=False),
    "ab": lambda model: nbtrain.ab(model, a={}, b={"gradient_clip_val": 1.0}, block_steps=2, min_pairs=2,
                                   max_pairs=2),
}
class Rows(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(N, FEATURES, generator=g), torch.randn(N, 1, generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def plain():
    torch.manual_seed(1)
    return nn.Linear(FEATURES, 1)


# (data set, model): each moves one thing a tool must put back
CASES = {"augmented": (Augmented, plain), "stream": (Stream, plain), "counter": (Rows, Ramped)}


def calls(kind, tool=None):
    data, model = CASES[kind][0](), CASES[kind][1]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options = dict(loss_fn=nn.MSELoss(), optimizer=optimizer, max_steps=3, batch_size=8, seed=5, accelerator="cpu",
                   num_workers=0, preload_data=False)
    nbtrain.fit(model, data, **options)
    if tool is not None:
        TOOLS[tool](model)
    nbtrain.fit(model, data, **options)
    return model


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_next_call_after_a_tool_trains_as_an_untouched_twin(tool, kind):
    twin, used = calls(kind), calls(kind, tool)
    for (name, a), b in zip(used.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g} after {tool}"
    assert getattr(used, "calls", None) == getattr(twin, "calls", None)


def test_a_manual_optimization_lightningmodule_is_refused_with_one_line():
    L = pytest.importorskip("lightning")

    class Manual(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Linear(FEATURES, 1)

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Manual()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    data = torch.utils.data.TensorDataset(torch.randn(16, FEATURES), torch.randn(16, 1))
    for call in (lambda: nbtrain.fit(module, data, max_steps=2, accelerator="cpu"),
                 lambda: nbtrain.profile(module, data, steps=2, warmup_steps=0, ceilings=False)):
        with pytest.raises(nbtrain.RecipeError, match=r"^automatic_optimization=False: .*allowed: "
                                                      r"automatic_optimization=True, or a Lightning Trainer$"):
            call()
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
