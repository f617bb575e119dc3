#!/usr/bin/env bash
# The GPU check for days a CUDA machine is lent: every CUDA test, then a short benchmark.
# Needs the project installed (see README); well under five minutes on one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -m cuda -q -p no:cacheprovider
python -m benchmarks.gpu_check
