"""The issue-48 case on a Hugging Face GPT-2 (an optional test extra: `pip install transformers`; the model is built
from a config, no weights downloaded): the user's AdamW, a linear warm-up schedule stepped per step, clipping at 1.0,
batch 8, dict rows with labels. The walk's choice never learns worse than the start in the same time, and a batch
change says what it does to the schedule counted in steps."""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (an optional test extra: "
                                                          "pip install transformers)")

import nbtrain  # noqa: E402
from nbtrain.measure.learned import alters_learning  # noqa: E402


def rows(n: int, seed: int) -> list:
    """Sequences of a fixed bigram chain over 256 tokens (learnable), as dict rows with labels."""
    chain = torch.softmax(3 * torch.randn(256, 256, generator=torch.Generator().manual_seed(0)), dim=1)
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, 32, dtype=torch.long)
    ids[:, 0] = torch.randint(0, 256, (n,), generator=g)
    for t in range(31):
        ids[:, t + 1] = torch.multinomial(chain[ids[:, t]], 1, generator=g).squeeze(1)
    return [{"input_ids": row, "labels": row} for row in ids]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_walk_on_a_tiny_gpt2_keeps_nothing_that_learns_worse_in_the_same_time():
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0,
                                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(1)
    model = transformers.GPT2LMHeadModel(config)
    walk = nbtrain.checklist(model, rows(512, 1), val_data=rows(128, 2), budget_s=40,
                             optimizer=lambda p: torch.optim.AdamW(p, lr=5e-4),
                             scheduler=lambda o: transformers.get_linear_schedule_with_warmup(o, 5, 256),
                             scheduler_interval="step", batch_size=8, gradient_clip_val=1.0, accelerator="cpu",
                             items=("batch_size", "precision", "optimizer_impl"))
    table = walk.table()
    batch = [i for i in walk.items if i.name == "batch_size"]
    assert not batch or batch[0].about.startswith(("critical batch size ~", "critical batch size not")), table
    if alters_learning(walk.best_config, walk.start_config):  # kept: it learned as well against the start at the end
        assert walk.learned is not None and walk.learned.measured and not walk.learned.worse, table
    if walk.best_config.global_batch_size != 8:  # the user's per-step schedule: what the batch does to it, said
        assert "your schedule (LambdaLR every step (as given)) counts optimizer steps" in walk.lr_note, table
    for item in walk.items:  # each kept change that alters what is learned says what it learned, and over what time
        if item.kept and item.name in ("batch_size", "precision"):
            assert " in the same time (" in item.note and "(held-out (val_data) " in item.note, table
