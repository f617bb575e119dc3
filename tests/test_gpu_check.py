"""benchmarks/gpu_check.py and scripts/gpu-check.sh: expectations stated and checked, and a clean skip
without a GPU (the GPU run itself happens where a GPU is lent: `bash scripts/gpu-check.sh`)."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nbtrain.measure.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.gpu_check import at_least, expectation_line, rows  # noqa: E402


def test_an_expectation_b_at_least_a_fails_only_when_b_is_measurably_slower():
    assert at_least(Verdict(0.80, 0.72, 0.88, 8)) is False           # measurably slower
    assert at_least(Verdict(0.99, 0.95, 1.03, 8)) is True            # no measurable difference
    assert at_least(Verdict(1.40, 1.34, 1.47, 26)) is True           # faster
    assert at_least(Verdict(1.2, math.nan, math.nan, 1)) is None     # too few blocks: not measured, not passed
    assert expectation_line("pinned >= pageable", Verdict(0.49, 0.45, 0.53, 8)) == \
        ("    expectation pinned >= pageable: FAILS", False)


def test_every_pinned_row_states_its_expectation():
    pinned = [row for row in rows() if row[2].get("pin_memory") and not row[1].get("pin_memory")]
    assert len(pinned) == 3 and all(row[3] == "pinned >= pageable" for row in pinned)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="on a GPU the check measures (scripts/gpu-check.sh runs it)")
def test_without_a_gpu_the_check_skips_cleanly():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("gpu check: skipped: no CUDA device here"), done.stderr
