"""A data set whose last item is shorter (issue 53, item 11): torch's collate says "stack expects each tensor to
be equal size" and nothing of the data; a tool's failed row says why in one line, and the walk's batch item, whose
every larger batch meets the short item, says it once for the item."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import nbtrain
from nbtrain import TrainConfig
from nbtrain.tools import trial
from nbtrain.tools.failure_causes import none_ran

SYMPTOM = "stack expects each tensor to be equal size"


class Chunks(Dataset):
    """Token chunks of 35, the last one 34 long, as pytorch/examples' word-language model cuts its corpus;
    `short_first`: the short chunk first instead, so that every batch of two or more meets it in its first step
    (shuffle=False), not only by chance."""

    def __init__(self, n: int, short_first: bool = False):
        self.tokens = torch.randint(0, 50, (n * 35 - 1,), generator=torch.Generator().manual_seed(0))
        self.n, self.short_first = n, short_first

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        i = (self.n - 1 - i) if self.short_first and i in (0, self.n - 1) else i
        x = self.tokens[i * 35:(i + 1) * 35]
        return x, x[0] % 3


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.embed(x).mean(1))


def collate_error() -> RuntimeError:
    with pytest.raises(RuntimeError, match=SYMPTOM) as raised:
        for _ in DataLoader(Chunks(4), batch_size=4):
            pass
    return raised.value


def test_a_failed_row_says_the_items_are_not_all_one_size_and_what_to_do():
    line = trial.failed(collate_error())
    assert line.startswith(f"failed: RuntimeError: {SYMPTOM}") and "\n" not in line
    assert "the data's items differ in size" in line and "collate_fn" in line
    assert trial.failed(ValueError("something else")) == "failed: ValueError: something else"


def test_an_item_none_of_whose_candidates_ran_says_their_common_failure_once():
    notes = [trial.failed(collate_error()), trial.failed(collate_error()).replace("entry 3", "entry 1")]
    assert none_ran(notes).startswith(f"no candidate ran: every one failed with '{SYMPTOM}' -- the data's items")
    assert none_ran(["failed: OSError: x", "failed: OSError: x"]) == "no candidate ran: every one failed: OSError: x"
    assert none_ran(["failed: OSError: x", "failed: ValueError: y"]) == "no candidate ran"


@pytest.mark.slow
def test_the_walks_batch_item_says_in_one_line_why_no_larger_batch_ran():
    torch.manual_seed(0)
    walk = nbtrain.checklist(Bag(), Chunks(64, short_first=True), loss_fn=nn.CrossEntropyLoss(), budget_s=30,
                             items=("batch_size",),
                             config=TrainConfig(batch_size=1, shuffle=False, accelerator="cpu"))  # 1 stacks any item
    (item,) = [r for r in walk.items if r.name == "batch_size"]
    assert not item.kept and item.tried and all(t.samples_per_s is None for t in item.tried), walk.table()
    assert item.note.startswith(f"no candidate ran: every one failed with '{SYMPTOM}' -- the data's items"), item.note
    assert item.note in walk.table()
