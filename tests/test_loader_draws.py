"""A model with dropout trains bit for bit like the user's own loop over DataLoaders (issue 49, item 9): a plain
loop's `iter(DataLoader)` draws one number from torch's global generator at every pass (the loader's base seed),
train and validation loaders alike, so every later dropout mask depends on it. Generated cases: shuffle on or
off, with or without held-out data, batches through the DataLoader or held, several epochs."""
import itertools

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import nbtrain

N, FEATURES, CLASSES, SEED = 40, 5, 3, 123


class NbtrainOrder(Sampler):
    """The order nbtrain promises for a loader it builds: DistributedSampler's, seeded by seed + epoch."""

    def __init__(self, n, shuffle):
        self.n, self.shuffle, self.epoch = n, shuffle, 0

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(SEED + self.epoch)) \
            if self.shuffle else torch.arange(self.n)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self):
        return self.n


def data(n=N, salt=0):
    g = torch.Generator().manual_seed(5 + salt)
    return TensorDataset(torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


def model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, CLASSES))


def plain(shuffle, val, epochs, batch):
    """The loop a user writes: DataLoaders (their own generators aside, the global one draws each pass)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    torch.manual_seed(SEED)  # fit(seed=...) seeds torch's generator when it starts
    train = DataLoader(data(), batch_size=batch, sampler=NbtrainOrder(N, shuffle))
    held = DataLoader(data(16, salt=1), batch_size=8) if val else None
    for _ in range(epochs):
        net.train()
        for x, y in train:
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if held is not None:
            net.eval()
            with torch.no_grad():
                for x, y in held:
                    net(x)
    return net


CASES = list(itertools.product((False, True), (False, True), (False, True), (2, 3)))


@pytest.mark.parametrize("shuffle,val,held,epochs", CASES,
                         ids=[f"shuffle={s}-val={v}-held={h}-epochs={e}" for s, v, h, e in CASES])
def test_a_dropout_model_trains_bit_for_bit_like_the_users_dataloader_loop(shuffle, val, held, epochs):
    batch = 8
    reference = plain(shuffle, val, epochs, batch)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    result = nbtrain.fit(net, data(), loss_fn=nn.CrossEntropyLoss(), optimizer=opt, val_data=data(16, salt=1)
                         if val else None, max_epochs=epochs, batch_size=batch, shuffle=shuffle, preload_data=held,
                         seed=SEED, accelerator="cpu", num_workers=0)
    assert result.status == "completed", result.message
    for (name, a), b in zip(net.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g}"
