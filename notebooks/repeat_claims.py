"""Repeat the tutorials' claims, to see how often each holds (the table in notebooks/README.md).

    python notebooks/repeat_claims.py speed 03 --runs 20     # a speed claim as its notebook measures it
    python notebooks/repeat_claims.py speed --runs 20        # ... every one listed below
    python notebooks/repeat_claims.py notebook 04 --runs 20  # a whole notebook, executed as the tests execute it

One JSON line per run: a speed claim's verdict (ratio, interval, pairs), whether the claim held, and the load
the reading ran under; a notebook's error (if its checks failed) and the words its checks cell ended with.
A speed claim is the notebook's own `nbtrain.ab` call: the same model, data, settings and budget.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _speed_claims():
    import torch
    from torch import nn
    from torch.utils.data import Subset, TensorDataset
    from torchvision.ops import Conv2dNormActivation
    from torchvision.transforms import v2

    from nbtrain.demo import DigitsDataset, DigitsMLP

    adamw = lambda p: torch.optim.AdamW(p, lr=3e-3)  # noqa: E731
    sgd = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)  # noqa: E731

    def images():
        digits = DigitsDataset(train=True, image=True)
        return TensorDataset(v2.Resize(16, antialias=True)(digits.x), digits.y)

    def cnn():
        return nn.Sequential(Conv2dNormActivation(1, 32), Conv2dNormActivation(32, 64, stride=2),
                             Conv2dNormActivation(64, 64, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(64, 10))

    digits = lambda: DigitsDataset(train=True)  # noqa: E731
    fp32_64 = {"batch_size": 64, "precision": "32-true"}
    # name: (model, data, optimizer, a, b, ab's options, the claim on the verdict)
    return {
        "00-batch": (DigitsMLP, digits, adamw, {"batch_size": 32}, {"batch_size": 256},
                     dict(budget_s=10, min_pairs=8), lambda v: v.faster),
        "00-bf16": (DigitsMLP, digits, adamw, {"batch_size": 128, "precision": "32-true"},
                    {"batch_size": 128, "precision": "bf16-mixed"}, dict(budget_s=10, min_pairs=8),
                    lambda v: not v.faster),
        "02-small": (DigitsMLP, digits, sgd, {"batch_size": 8}, {"batch_size": 32}, dict(budget_s=8, min_pairs=8),
                     lambda v: v.faster and v.low > 1.5),
        "02-large": (DigitsMLP, digits, sgd, {"batch_size": 128}, {"batch_size": 512}, dict(budget_s=8, min_pairs=8),
                     lambda v: not v.above(1.0)),
        "03": (DigitsMLP, lambda: Subset(DigitsDataset(train=True), range(1280)), adamw, {"batch_size": 256},
               {"batch_size": 64, "accumulate_grad_batches": 4}, dict(budget_s=20, min_pairs=8, max_pairs=60),
               lambda v: v.high < 1.0),
        "05-logging": (DigitsMLP, digits, adamw, {"batch_size": 32, "log_every_n_steps": 50},
                       {"batch_size": 32, "log_every_n_steps": 1}, dict(block_steps=50, budget_s=8, min_pairs=8),
                       lambda v: v.low < 1.25 and v.high > 0.8),
        "06-mlp": (DigitsMLP, digits, adamw, {"batch_size": 128}, {"batch_size": 128, "precision": "bf16-mixed"},
                   dict(budget_s=8, min_pairs=8), lambda v: not v.above(0.2)),
        # on a CPU with bfloat16 instructions (notebook 06 asserts these only there)
        "06-cnn-bf16": (cnn, images, adamw, fp32_64, {"batch_size": 64, "precision": "bf16-mixed"},
                        dict(budget_s=24, min_pairs=6), lambda v: v.faster),
        "06-cnn-both": (cnn, images, adamw, fp32_64, {"batch_size": 64, "precision": "bf16-mixed",
                                                      "channels_last": True},
                        dict(budget_s=16, min_pairs=6), lambda v: v.faster),
    }


def repeat_speed(names: list[str], runs: int) -> None:
    import torch
    from torch import nn

    import nbtrain
    claims = _speed_claims()
    for name in names or list(claims):
        model, data, optimizer, a, b, options, holds = claims[name]
        train_data = data()
        for run in range(runs):
            torch.manual_seed(0)
            start = time.monotonic()
            result = nbtrain.ab(model(), train_data, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, a=a, b=b,
                                **options)
            v, load = result.verdict, result.load
            print(json.dumps({"claim": name, "run": run, "holds": bool(holds(v)), "ratio": v.ratio, "low": v.low,
                              "high": v.high, "pairs": v.pairs, "other_cores": load.other_cores,
                              "waited_cores": load.waited_cores, "s": round(time.monotonic() - start, 1),
                              "text": result.text()}), flush=True)


def repeat_notebook(prefix: str, runs: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from nbclient.exceptions import CellExecutionError
    from notebook_runner import NOTEBOOKS, execute, text_of, without_outputs
    path = next(NOTEBOOKS.glob(f"{prefix}*.ipynb"))
    for run in range(runs):
        nb, error, start = without_outputs(path), "", time.monotonic()
        with tempfile.TemporaryDirectory() as work:
            try:
                execute(nb, Path(work), 300)
            except CellExecutionError as e:
                error = str(e).strip().splitlines()[-1][:400]
        print(json.dumps({"notebook": path.name, "run": run, "error": error, "s": round(time.monotonic() - start),
                          "checks": text_of(nb.cells[-1]).strip()[-300:]}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("speed", "notebook"))
    parser.add_argument("names", nargs="*", help="speed claims (00-batch, 03, ...) or one notebook's prefix (04)")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    if args.what == "speed":
        known = _speed_claims()
        chosen = [n for n in known if any(n.startswith(p) for p in args.names)] if args.names else list(known)
        if not chosen:
            parser.error(f"no speed claim starts with {' or '.join(args.names)}; known: {', '.join(known)}")
        repeat_speed(chosen, args.runs)
    else:
        if len(args.names) != 1:
            parser.error("name one notebook by its prefix, e.g. 04")
        repeat_notebook(args.names[0], args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
