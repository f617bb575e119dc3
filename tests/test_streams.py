"""Training data that is a stream (an IterableDataset): with max_steps, shared out across ranks."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import nbtrain
from nbtrain.options import ConfigError

from helpers import same_weights, weights

N = 60


class Stream(IterableDataset):
    """A deterministic stream of (x, y, index) items; `seen` records what training read."""

    def __init__(self, n=N):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __iter__(self):
        for i in range(len(self.x)):
            yield self.x[i], self.y[i], i


def step(model, batch):
    x, y, _ = batch
    return nn.functional.mse_loss(model(x), y)


def net():
    torch.manual_seed(4)
    return nn.Linear(4, 1)


def test_a_stream_trains_as_a_plain_loop_over_it_and_passes_wrap_around():
    stream = Stream()
    model, reference = net(), net()
    result = nbtrain.fit(model, stream, training_step=step, optimizer=lambda p: torch.optim.SGD(p, 0.05),
                         batch_size=8, max_steps=20)  # 60 items: 8 batches a pass (the last of 4)
    assert result.status == "completed" and result.summary.epochs_trained == 2
    optimizer = torch.optim.SGD(reference.parameters(), 0.05)
    done = 0
    while done < 20:
        for batch in DataLoader(stream, batch_size=8):
            step(reference, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == 20:
                break
    assert same_weights(weights(model), weights(reference))


def test_a_stream_without_max_steps_is_one_clear_message():
    with pytest.raises(ConfigError, match="max_steps=None: a whole number >= 1: the training data is an "
                                          "IterableDataset"):
        nbtrain.fit(net(), Stream(), training_step=step, max_epochs=1)


def test_a_mid_pass_batch_change_continues_with_the_items_not_yet_used():
    seen = []

    def recording(model, batch):
        seen.extend(batch[2].tolist())
        return step(model, batch)

    model, stream = net(), Stream()
    nbtrain.fit(model, stream, training_step=recording, batch_size=8, max_steps=3)
    nbtrain.fit(model, stream, training_step=recording, batch_size=12, max_steps=2)
    assert seen == list(range(24 + 24))


@pytest.mark.slow
def test_each_ddp_rank_trains_on_its_share_of_the_stream(tmp_path):
    model = net()
    before = weights(model)
    result = nbtrain.fit(model, Stream(), training_step=step, batch_size=5, max_steps=4, devices=2,
                         accelerator="cpu")
    assert result.status == "completed" and not same_weights(before, weights(model))
    from nbtrain.engine.stream import RankShare
    from nbtrain.engine.dist import World
    shares = [[item[2] for item in RankShare(Stream(), World(rank=r, size=2))] for r in (0, 1)]
    assert shares[0] == list(range(0, N, 2)) and shares[1] == list(range(1, N, 2))


def test_loader_workers_each_read_their_own_items():
    stream = Stream()
    seen = []

    def recording(model, batch):
        seen.extend(batch[2].tolist())
        return step(model, batch)

    nbtrain.fit(net(), stream, training_step=recording, batch_size=6, max_steps=10, num_workers=2)
    assert sorted(seen) == list(range(N))  # one pass, every item once, none twice


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_continues_with_the_next_item_whatever_the_new_batch_size(workers):
    seen = []

    def recording(model, batch):
        seen.append(batch[2].tolist())
        return step(model, batch)

    model, stream = net(), Stream()
    for batch_size, steps in ((16, 2), (10, 3), (7, 2)):  # 32 items, then 28 (the pass ends at 60), then 14
        nbtrain.fit(model, stream, training_step=recording, batch_size=batch_size, max_steps=steps,
                    num_workers=workers)
    assert [len(b) for b in seen] == [16, 16, 10, 10, 8, 7, 7]
    assert [i for b in seen for i in b] == list(range(N)) + list(range(14))  # none skipped, none twice
