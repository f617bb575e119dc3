"""The cost of nbtrain's loop on real-shaped code: four or five peers, each against its own plain loop.

Each peer is training code written the way its community writes it, trained once by a hand-written loop and
once by `nbtrain.fit`, from the same weights over the same batches in the same order (no shuffling, dropout
off), at one torch thread:

- gpt: a small GPT shaped like nanoGPT (token and position embeddings, pre-norm blocks of causal
  self-attention and an MLP, tied head; AdamW over two groups, decay for matrices only; a warm-up + cosine
  rate as a per-step LambdaLR; gradient clipping at 1.0; 2 micro-batches a step);
- lstm: a word-level LSTM language model whose hidden state is carried from batch to batch (detached), SGD,
  clipping at 0.25 (a `training_step` closure holds the state, on both sides);
- cnn: an MNIST-shaped conv net, Adadelta with a StepLR stepped per epoch;
- rnn: Lightning's parity RNN (benchmarks.peer_rnn's workload), Adam, a step of about a millisecond;
- hf-gpt2: a 2-layer GPT-2 built from a `transformers` config over dict rows with labels, AdamW with a linear
  warm-up schedule per step, clipping at 1.0 (only where `transformers` is installed; listed as skipped
  otherwise).

Per step: each side's whole call (optimizer built, every step, the last loss read; nbtrain's start-up,
summary and records included) over the optimizer steps it took, in interleaved pairs (A B, B A, ...) in one
process, so machine noise hits both alike. Printed per peer: the median of the pairs' ratios of wall time
with its distribution-free 95% interval, the same of CPU time (the work each side did, which a loaded
machine's waits for a CPU do not move), and whether the weights were bit-identical after every pair.
Per call: a short call (10 steps of the parity RNN) on each side, paired; nbtrain's extra milliseconds.

Targets (issue 51): per step <= 1.02 with the interval's upper end <= 1.04 on a quiet machine; per call
<= 5 ms on the parity RNN.

Where the extra time goes, without a clock: `--where N` prints, per peer, the N functions whose Python opcode
counts differ most between one nbtrain call and one plain-loop call (the hf-gpt2 total is also a target).

    python -m benchmarks.peers [--pairs 8] [--only gpt lstm ...] [--where 20]
"""
from __future__ import annotations

import argparse
import collections
import math
import pathlib
import statistics
import sysconfig
import time

import torch
from scipy import stats
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import nbtrain

from . import peer_rnn
from .common import machine

STEP_TARGET, CALL_TARGET = "<= 1.02 (upper end <= 1.04)", "<= 5 ms"
# nbtrain's extra Python opcodes in one hf-gpt2 call: a count, the same on a loaded machine as on a quiet one, so a
# change that adds bookkeeping shows here where the wall ratios' noise (a percent on this box) hides it. 147,000
# outside the steps before stop 60, ~107,000 after; the bar sits above what it reads now.
OPCODE_TARGET = 140_000


# --- gpt: nanoGPT's shape, written here ------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=128, context=32, width=64, heads=4, layers=2):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2 and nanoGPT do

    def forward(self, idx, targets):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def gpt_optimizer(params_or_model, model=None):
    """nanoGPT's configure_optimizers: weight decay on matrices, none on biases and norms."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for _, p in named if p.dim() >= 2]
    rest = [p for _, p in named if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.95))


def warmup_cosine(step: int, warmup: int = 10, total: int = 200, floor: float = 0.1) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def gpt_peer():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 128, (16 * 2 * 40, 33), generator=g)  # whole accumulation windows only
    data = TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    def model():
        torch.manual_seed(1)
        return TinyGPT()

    def training_step(m, batch):
        return m(*batch)

    def plain(m):
        optimizer = gpt_optimizer(None, m)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
        accumulate, steps = 2, 0
        for i, batch in enumerate(DataLoader(data, batch_size=16)):
            loss = training_step(m, batch) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0:
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                steps += 1
        loss.item()
        return steps

    def ours(m):
        return nbtrain.fit(m, data, training_step=training_step, optimizer=lambda p: gpt_optimizer(p, m),
                           scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, warmup_cosine),
                           scheduler_interval="step", batch_size=16, accumulate_grad_batches=2,
                           gradient_clip_val=1.0, shuffle=False, max_epochs=1, accelerator="cpu")

    return model, plain, ours


# --- lstm: a word-level language model with carried hidden state -----------------------------------------

class WordLM(nn.Module):
    def __init__(self, vocab=400, width=64):
        super().__init__()
        self.embed, self.rnn, self.out = nn.Embedding(vocab, width), nn.LSTM(width, width, 2), nn.Linear(width, vocab)

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.embed(x), hidden)
        return self.out(output), hidden


def lstm_peer():
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(0, 400, (20 * 35 * 30 + 1,), generator=g)
    data = TensorDataset(stream[:-1].view(-1, 35), stream[1:].view(-1, 35))  # rows of 35 tokens
    carried = {}

    def model():
        torch.manual_seed(1)
        carried.clear()
        return WordLM()

    def training_step(m, batch):
        x, y = (z.t() for z in batch)  # (time, batch), as the word-language example lays them out
        hidden = carried.get("hidden")
        hidden = None if hidden is None else tuple(h.detach() for h in hidden)  # truncated backprop
        output, carried["hidden"] = m(x, hidden)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), y.reshape(-1))

    def plain(m):
        optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        steps = 0
        for batch in DataLoader(data, batch_size=20):
            loss = training_step(m, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.25)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
        loss.item()
        return steps

    def ours(m):
        return nbtrain.fit(m, data, training_step=training_step, optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
                           batch_size=20, gradient_clip_val=0.25, shuffle=False, max_epochs=1, accelerator="cpu")

    return model, plain, ours


# --- cnn: an MNIST-shaped conv net ----------------------------------------------------------------------

def cnn_peer():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64 * 25, 1, 28, 28, generator=g), torch.randint(0, 10, (64 * 25,), generator=g))

    def model():
        torch.manual_seed(1)
        return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 12 * 12, 64), nn.ReLU(), nn.Linear(64, 10),
                             nn.LogSoftmax(dim=1))

    def plain(m):
        optimizer = torch.optim.Adadelta(m.parameters(), lr=1.0)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        steps = 0
        for x, y in DataLoader(data, batch_size=64):
            loss = F.nll_loss(m(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
        schedule.step()
        loss.item()
        return steps

    def ours(m):
        return nbtrain.fit(m, data, loss_fn=F.nll_loss, optimizer=lambda p: torch.optim.Adadelta(p, lr=1.0),
                           scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7),
                           batch_size=64, shuffle=False, max_epochs=1, accelerator="cpu")

    return model, plain, ours


# --- rnn: Lightning's parity RNN -----------------------------------------------------------------------

def rnn_peer(sequences: int = peer_rnn.SEQUENCES):
    x, y = peer_rnn.workload().tensors
    data = TensorDataset(x[:sequences], y[:sequences])

    def plain(m):
        optimizer = torch.optim.Adam(m.parameters(), lr=peer_rnn.LR)
        steps = 0
        for xb, yb in DataLoader(data, batch_size=peer_rnn.BATCH):
            loss = F.mse_loss(m(xb), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
        loss.item()
        return steps

    def ours(m):
        return nbtrain.fit(m, data, loss_fn=nn.MSELoss(), optimizer=lambda p: torch.optim.Adam(p, lr=peer_rnn.LR),
                           batch_size=peer_rnn.BATCH, shuffle=False, max_epochs=1, accelerator="cpu")

    return peer_rnn.fresh_model, plain, ours


# --- hf-gpt2: a tiny GPT-2 from a transformers config --------------------------------------------------

def hf_peer():
    from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup
    from transformers.utils import logging
    logging.set_verbosity_error()
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 256, (8 * 40, 32), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": row, "labels": row} for row in ids]

    def model():
        torch.manual_seed(1)
        return GPT2LMHeadModel(config)

    def schedule(optimizer):
        return get_linear_schedule_with_warmup(optimizer, 5, 256)

    def plain(m):
        optimizer = torch.optim.AdamW(m.parameters(), lr=5e-4)
        rates = schedule(optimizer)
        steps = 0
        for batch in DataLoader(rows, batch_size=8):
            loss = m(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            rates.step()
            steps += 1
        loss.item()
        return steps

    def ours(m):
        return nbtrain.fit(m, rows, optimizer=lambda p: torch.optim.AdamW(p, lr=5e-4), scheduler=schedule,
                           scheduler_interval="step", batch_size=8, gradient_clip_val=1.0, shuffle=False,
                           max_epochs=1, accelerator="cpu")

    return model, plain, ours


PEERS = {"gpt": gpt_peer, "lstm": lstm_peer, "cnn": cnn_peer, "rnn": rnn_peer, "hf-gpt2": hf_peer}


# --- measuring ------------------------------------------------------------------------------------------

def median_interval(ratios: list[float]) -> tuple[float, float, float]:
    """The median of paired ratios with its distribution-free 95% interval (order statistics): a burst of load
    on one side of a few pairs moves it far less than it moves a mean."""
    ratios = sorted(ratios)
    k = max(int(stats.binom.ppf(0.025, len(ratios), 0.5)) - 1, 0)
    return statistics.median(ratios), ratios[k], ratios[-1 - k]


def timed(run, m) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = run(m)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    steps = out if isinstance(out, int) else out.summary.steps
    return wall, cpu, steps


def race(peer, pairs: int) -> dict:
    model, plain, ours = peer()
    timed(plain, model()), timed(ours, model())  # the first call of each pays lazy imports and allocations
    wall, cpu, same, steps, plain_s = [], [], True, None, []
    for i in range(pairs):
        got = {}
        sides = (("plain", plain), ("nbtrain", ours))
        for name, run in (sides if i % 2 == 0 else sides[::-1]):
            m = model()
            got[name] = (*timed(run, m), m)
        (pw, pc, ps, pm), (nw, nc, ns, nm) = got["plain"], got["nbtrain"]
        steps = ps
        plain_s.append(pw / ps)
        wall.append((nw / ns) / (pw / ps))
        cpu.append((nc / ns) / (pc / ps))
        same = same and ns == ps and all(torch.equal(a, b) for a, b in zip(pm.state_dict().values(),
                                                                           nm.state_dict().values()))
    return {"wall": median_interval(wall), "cpu": median_interval(cpu), "same": same, "steps": steps,
            "ms_per_step": 1e3 * statistics.median(plain_s)}


def per_call(pairs: int) -> dict[str, tuple[float, float, float]]:
    """nbtrain's extra milliseconds per call, of wall and of CPU time: 10-step calls of the parity RNN, paired with
    the plain loop's (on a loaded machine the CPU time is the reading: a wait for a CPU is not nbtrain's work)."""
    model, plain, ours = rnn_peer(sequences=10 * peer_rnn.BATCH)
    timed(plain, model()), timed(ours, model())
    extra = {"wall": [], "cpu": []}
    for i in range(max(pairs, 5) * 2):
        got = {}
        sides = (("plain", plain), ("nbtrain", ours))
        for name, run in (sides if i % 2 == 0 else sides[::-1]):
            got[name] = timed(run, model())
        for k, kind in enumerate(extra):
            extra[kind].append(1e3 * (got["nbtrain"][k] - got["plain"][k]))
    return {kind: median_interval(values) for kind, values in extra.items()}


def opcodes_by_function(peer) -> collections.Counter:
    """The Python opcodes nbtrain's call runs beyond the plain loop's, the same call otherwise, by the function
    that ran them ('nbtrain/engine/loop.py:_train_some', 'torch/nn/modules/module.py:named_modules'): sys.settrace
    counting every opcode of both, after a call of each; deterministic, no clock is read. A library function both
    sides call shows the difference of its counts (the plain loop's own function: negative)."""
    import sys
    model, plain, ours = peer()
    plain(model()), ours(model())

    def counted(run) -> collections.Counter:
        counts = collections.Counter()  # by code object: a name is made once per function, not per opcode

        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            if event == "opcode":
                counts[frame.f_code] += 1
            return tracer
        m = model()
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            run(m)
        finally:
            sys.settrace(previous)
        return counts
    extra = collections.Counter()
    for sign, run in ((-1, plain), (1, ours)):
        for code, n in counted(run).items():
            extra[_where(code)] += sign * n
    return extra


def _where(code) -> str:
    """A function's file, from its package (site-packages, the standard library's folder and this checkout left
    out), and its name: 'torch/nn/modules/module.py:named_modules', 'dataclasses.py:replace'."""
    path = pathlib.PurePath(code.co_filename)
    # site-packages first: outside a virtual environment it lies inside the standard library's folder
    for root in (*_LIBRARY_ROOTS, _CHECKOUT):
        if path.is_relative_to(root):
            path = path.relative_to(root)
            break
    return f"{path.as_posix()}:{code.co_name}"


_LIBRARY_ROOTS = tuple(pathlib.PurePath(p) for p in dict.fromkeys(
    sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")))
_CHECKOUT = pathlib.PurePath(__file__).parent.parent


def extra_opcodes(peer) -> int:
    """The Python opcodes nbtrain's call runs beyond the plain loop's (opcodes_by_function, summed)."""
    return sum(opcodes_by_function(peer).values())


def where_table(extra: collections.Counter, rows: int) -> str:
    """The `rows` functions whose counts differ most, largest first, with the total."""
    lines = [f"{'extra opcodes':>13}  function"]
    lines += [f"{n:>13,}  {name}" for name, n in sorted(extra.items(), key=lambda kv: -abs(kv[1]))[:rows]]
    return "\n".join(lines + [f"{sum(extra.values()):>13,}  all of them"])


def fmt(m: tuple[float, float, float]) -> str:
    return f"{m[0]:.3f} ({m[1]:.3f}-{m[2]:.3f})"


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--only", nargs="*", choices=tuple(PEERS))
    parser.add_argument("--where", type=int, default=0, metavar="N",
                        help="also print the N functions whose opcode counts differ most in one call of each peer "
                             "run (nbtrain's call less the plain loop's): where nbtrain's extra work is, no clock read")
    args = parser.parse_args(argv)
    if args.where < 0:
        parser.error(f"--where {args.where}: allowed: a whole number >= 0 (0: no table)")
    torch.set_num_threads(1)
    print(f"peers benchmark on {machine()}; {args.pairs} interleaved pairs a peer, one call of one epoch a side")
    out, by_function = {}, {}
    for name in args.only or PEERS:
        try:
            result = race(PEERS[name], args.pairs)
        except ImportError as exc:
            print(f"{name}: skipped ({exc})")
            out[f"{name}: per step, nbtrain / own loop"] = (f"skipped: {exc}", STEP_TARGET)
            continue
        print(f"{name} (~{result['ms_per_step']:.1f} ms a step, {result['steps']} steps a call): wall "
              f"{fmt(result['wall'])}, CPU {fmt(result['cpu'])}, weights "
              f"{'bit-identical' if result['same'] else 'DIFFERENT'}")
        out[f"{name}: per step, nbtrain / own loop, wall (95% interval)"] = (fmt(result["wall"]), STEP_TARGET)
        out[f"{name}: per step, CPU (95% interval)"] = (fmt(result["cpu"]), STEP_TARGET)
        out[f"{name}: weights bit-identical"] = ("yes" if result["same"] else "NO", "yes")
        if args.where:
            by_function[name] = opcodes_by_function(PEERS[name])
            print(f"{name}: where nbtrain's call runs Python opcodes the plain loop's does not\n"
                  + where_table(by_function[name], args.where))
    if not args.only or "hf-gpt2" in args.only:
        try:
            # the table's counts where --where took them: the same deterministic call, not traced twice
            opcodes = sum(by_function["hf-gpt2"].values()) if "hf-gpt2" in by_function else extra_opcodes(hf_peer)
        except ImportError as exc:
            out["hf-gpt2: nbtrain's extra Python opcodes a call"] = (f"skipped: {exc}", f"<= {OPCODE_TARGET:,}")
        else:
            print(f"hf-gpt2: nbtrain's extra Python opcodes a call {opcodes:,} (a count: no load moves it)")
            out["hf-gpt2: nbtrain's extra Python opcodes a call"] = (f"{opcodes:,}", f"<= {OPCODE_TARGET:,}")
    call = per_call(args.pairs)
    wall, cpu = (f"{m[0]:.1f} ({m[1]:.1f}-{m[2]:.1f})" for m in (call["wall"], call["cpu"]))
    print(f"per call (10-step parity RNN calls): nbtrain's extra {wall} ms, CPU {cpu} ms")
    out["rnn: per call, nbtrain's extra ms (95% interval)"] = (wall, CALL_TARGET)
    out["rnn: per call, nbtrain's extra CPU ms (95% interval)"] = (cpu, CALL_TARGET)
    return out


if __name__ == "__main__":
    main()
