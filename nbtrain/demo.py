"""The embedded demo: scikit-learn's bundled handwritten digits (8x8 images), offline.

1,797 real scans ship inside scikit-learn, so the demo, the tests and the tutorials
train on real data with no download.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .recipe import Recipe


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    return (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int64)


class DigitsDataset(Dataset):
    """Handwritten digits as (64 floats in [0, 1], label); a fixed 80/20 train/held-out split.

    `image=True` gives 1x8x8 tensors for convolutional models.
    """

    def __init__(self, train: bool = True, image: bool = False, split_seed: int = 0):
        x, y = _digits()
        order = np.random.default_rng(split_seed).permutation(len(y))
        cut = int(0.8 * len(y))
        chosen = order[:cut] if train else order[cut:]
        self.x = torch.from_numpy(x[chosen])
        self.y = torch.from_numpy(y[chosen])
        if image:
            self.x = self.x.view(-1, 1, 8, 8)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def digits_recipe(seed: int = 0, hidden: int = 128) -> Recipe:
    """A fresh model on the digits, with cross-entropy and AdamW."""
    torch.manual_seed(seed)
    return Recipe(model=DigitsMLP(hidden), train_data=DigitsDataset(train=True),
                  val_data=DigitsDataset(train=False), loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3))
