"""Small recipes the tests train (real models, real data, real loaders)."""
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from nbtrain import Recipe


def regression_data(n=256, features=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def regression_recipe(seed=0, optimizer=None, **data):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return Recipe(model=model, train_data=regression_data(**data), loss_fn=nn.MSELoss(),
                  optimizer=optimizer or (lambda p: torch.optim.SGD(p, lr=0.05)))


class IndexedData(Dataset):
    """Items are (features, index), so a training step can record which samples it saw."""

    def __init__(self, n=100):
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same_weights(a, b, atol=0.0):
    return all(torch.allclose(x, y, atol=atol, rtol=0) if atol else torch.equal(x, y) for x, y in zip(a, b))
