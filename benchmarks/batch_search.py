"""Bar: the CPU batch-size search under a memory budget finds a batch within 10% of the true largest
batch under that budget (found here by brute force), in at most ceil(log2(max)) + 4 trials.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/batch_search.py [--headroom-mb 40]

Brute force and search judge a batch the same way: one real training step, the process's
peak RSS (reset before each trial) against the budget, the model restored afterwards.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from checklist_recipes import memory_heavy_recipe  # noqa: E402

from nbtrain import TrainConfig
from nbtrain.tools import trial  # noqa: E402
from nbtrain.api import engine_for  # noqa: E402
from nbtrain.engine.memory import current_rss  # noqa: E402
from nbtrain.tools.tune import find_batch_size  # noqa: E402


def fits(engine, start, batch, limit, snapshot) -> bool:
    trial.release_memory()
    m = trial.measure(engine, start.replace(batch_size=batch), steps=1, warmup_steps=0)
    snapshot.restore()
    trial.release_memory()
    return m.ok and m.peak_bytes <= limit


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--headroom-mb", type=float, default=150)
    parser.add_argument("--max-batch", type=int, default=2048)
    parser.add_argument("--stride", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    recipe = memory_heavy_recipe(args.max_batch)
    start = TrainConfig(batch_size=8)
    engine = engine_for(recipe, start.replace(max_steps=1))
    engine.run()  # one-off allocations (thread pools, first kernels) before the budget is set
    trial.release_memory()
    limit = current_rss() + int(args.headroom_mb * 2**20)
    print(f"budget: peak process RSS <= {limit / 2**20:,.1f} MB (now + {args.headroom_mb:g} MB); "
          f"max batch {args.max_batch}")

    t0 = time.perf_counter()
    search = find_batch_size(recipe, config=start, memory_budget=limit, max_batch=args.max_batch)
    search_s = time.perf_counter() - t0
    print(search.table())

    lent = trial.borrow(recipe, config=start)  # a trial: the live engine is never reached
    engine, snapshot = lent.engine, lent.start
    t0 = time.perf_counter()
    with trial.exact_cpu_peaks():  # the same measuring conditions as the search
        passing = [b for b in range(args.stride, args.max_batch + 1, args.stride)
                   if fits(engine, start, b, limit, snapshot)]
        coarse = max(passing, default=0)
        fine = [b for b in range(coarse + 1, min(coarse + args.stride, args.max_batch + 1))
                if fits(engine, start, b, limit, snapshot)]
    true_max = max(fine, default=coarse)
    lent.close()
    brute_trials = args.max_batch // args.stride + len(range(coarse + 1, min(coarse + args.stride, args.max_batch + 1)))
    brute_s = time.perf_counter() - t0
    bound = math.ceil(math.log2(args.max_batch)) + 4
    quality = search.batch_size / true_max if true_max else float("nan")
    print(f"brute force: largest batch under the budget {true_max} ({brute_trials} trials, {brute_s:.1f} s)")
    print(f"search: {search.batch_size} in {len(search.trials)} trials ({search_s:.1f} s); bound {bound} trials")
    ok_quality = abs(1 - quality) <= 0.10
    ok_trials = len(search.trials) <= bound
    print(f"found/true: {quality:.3f} (target within 10%) {'PASS' if ok_quality else 'FAIL'}; "
          f"trials {len(search.trials)} <= {bound} {'PASS' if ok_trials else 'FAIL'}")
    return {"found batch / true largest batch": (quality, "within 10%"),
            f"trials (bound {bound})": (len(search.trials), f"<= {bound}")}


if __name__ == "__main__":
    main()
