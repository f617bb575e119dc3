"""`python -m benchmarks`: every benchmark in one run, one table of measured ratios.

Each benchmark module's `main(argv)` returns {measure: (value, target)}; modules that
are missing or need hardware this machine lacks are listed as skipped.
"""
from __future__ import annotations

import argparse
import importlib
import io
import time
from contextlib import redirect_stdout

from .common import machine

BENCHMARKS = ("parity", "ddp_parity", "engine_overhead", "peer_rnn", "peers", "launch_latency", "checklist_vs_grid", "batch_search",
              "magic_views_overhead", "budgets", "notebook_time", "in_memory", "long_runs", "verdicts", "forecast_check",
              "ceilings_textbook", "walk_headline", "compare_beside_load", "slurm_job",
              "threads", "time_to_quality")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these")
    parser.add_argument("--verbose", action="store_true", help="show each benchmark's own output")
    args = parser.parse_args(argv)
    rows = []
    for name in args.only or BENCHMARKS:
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ImportError as exc:
            rows.append((name, "skipped", f"not available: {exc}", ""))
            continue
        started = time.perf_counter()
        if args.verbose:
            measured = module.main([])
        else:
            with redirect_stdout(io.StringIO()):
                measured = module.main([])
        for measure, (value, target) in (measured or {}).items():
            text = f"{value:.3f}" if isinstance(value, float) else str(value)
            rows.append((name, measure, text, target))
        rows.append((name, "wall time", f"{time.perf_counter() - started:.0f} s", ""))
    print(f"nbtrain benchmarks on {machine()}")
    widths = [max(len(str(r[i])) for r in rows + [("benchmark", "measure", "value", "target")]) for i in range(4)]
    for row in [("benchmark", "measure", "value", "target")] + rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
