"""Recipes for the checklist tools' tests: one data-bound, one compute-bound, one leaking step."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from nbtrain import Recipe


class HeavyTransformData(Dataset):
    """Small samples behind a CPU-heavy, deterministic per-sample transform (repeated 2-D FFTs)."""

    def __init__(self, n=256, features=16, rounds=4, size=48):
        self.n, self.features, self.rounds, self.size = n, features, rounds, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        a = np.random.default_rng(i).standard_normal((self.size, self.size))
        for _ in range(self.rounds):
            a = np.abs(np.fft.fft2(a))
            a /= a.max()
        return torch.tensor(a[0, :self.features], dtype=torch.float32), i % 4


def data_bound_recipe(seed=0, **data):
    torch.manual_seed(seed)
    return Recipe(model=nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)),
                  train_data=HeavyTransformData(**data), loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.05))


def compute_bound_recipe(seed=0, n=1024, width=768):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 256, generator=g), torch.randint(0, 4, (n,), generator=g))
    model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
    return Recipe(model=model, train_data=data, loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


class WideActivations(nn.Module):
    """Cheap to compute, heavy to keep: each sample holds ~200 KB of activations for backward,
    so peak memory is dominated by the batch and a trial is quick."""

    def __init__(self, features=64, spread=256):
        super().__init__()
        self.inp, self.out = nn.Linear(features, features), nn.Linear(features, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, spread))

    def forward(self, x):
        h = torch.relu(self.inp(x).unsqueeze(-1) * self.scale)
        h = torch.relu(h * self.scale + 0.1)
        h = torch.tanh(h * self.scale)
        return self.out(h.mean(-1))


def memory_heavy_recipe(n=1024):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,)))
    return Recipe(model=WideActivations(), train_data=data, loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


def state(model, optimizer=None):
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if optimizer is not None:
        for i, s in optimizer.state_dict()["state"].items():
            for k, v in s.items():
                out[f"opt.{i}.{k}"] = v.clone() if torch.is_tensor(v) else torch.tensor(v)
    return out


def same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def ddp_diagnose_rank(out_dir):
    """One rank of a 2-process gloo job that profiles a DDP model (run by nbtrain's launcher)."""
    import json
    import os

    import torch.distributed as torch_dist

    from nbtrain import TrainConfig
    from nbtrain.tools.diagnose import diagnose

    d = diagnose(compute_bound_recipe(n=256, width=256), config=TrainConfig(batch_size=32), steps=4)
    with open(os.path.join(out_dir, f"rank{torch_dist.get_rank()}.json"), "w") as f:
        json.dump({"grad_sync_ms": d.grad_sync_ms, "step_ms": d.step_ms, "table": d.table()}, f)


def tiny_ops_recipe(depth=48, width=8, n=256):
    """Many tiny layers on a few features: each operation's dispatch costs far more than its arithmetic."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())]
    data = TensorDataset(torch.randn(n, width, generator=g), torch.randint(0, 4, (n,), generator=g))
    return Recipe(model=nn.Sequential(*layers, nn.Linear(width, 4)), train_data=data, loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
