#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine, then the suite itself.
# System packages (headless Chromium for the browser test, SLURM for the cluster tests)
# are installed when apt-get is available and we are root; without them those tests skip
# and say why.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${NBTRAIN_NO_APT:-}" ]; then
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld slurmd slurm-client munge)
  command -v slurmdbd >/dev/null 2>&1 || missing+=(slurmdbd mariadb-server)  # accounting: sacct answers
  if [ ${#missing[@]} -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") \
      || echo "note: could not install ${missing[*]}; the tests that need them will skip"
  fi
fi

python3 -m venv .venv
. .venv/bin/activate
# Without an NVIDIA GPU, torch from PyPI is the CUDA build: the CPU builds go in first, as in the README's
# install block, so that the package's install keeps them (scripts/torch_index.sh decides; NBTRAIN_TORCH_INDEX).
torch_index=$(bash scripts/torch_index.sh python)  # the venv's python: is torch in it already?
if [ "$torch_index" = cpu ]; then
  # The README's line. Where the CPU index does not answer, pip takes both from a mirror or a folder of wheels,
  # often a pair not built for each other ("operator torchvision::nms does not exist"): then both go, and the
  # package's install below brings the registry's matching pair (the CUDA build, ~6 GB, runs on a CPU too).
  pip install -q torch torchvision --index-url https://download.pytorch.org/whl/cpu --retries 1 --timeout 15 \
    && python -c "import torchvision" 2>/dev/null || pip uninstall -y torch torchvision
fi
pip install -q -e ".[test,ray]"  # ray: the Ray launcher's smoke test runs, not skips
# Whichever way torch got here (just now, kept from before, from a mirror): a torchvision built for another torch
# fails only at import ("operator torchvision::nms does not exist"); say so now, with the line to run.
python -m nbtrain doctor
python -m pytest "$@"  # ends with the time of the fast subset (-m "not slow") and of the whole suite
