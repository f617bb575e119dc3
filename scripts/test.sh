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
  if [ ${#missing[@]} -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") \
      || echo "note: could not install ${missing[*]}; the tests that need them will skip"
  fi
fi

python3 -m venv .venv
. .venv/bin/activate
pip install -q -e ".[test]"
python -m pytest "$@"  # ends with the time of the fast subset (-m "not slow") and of the whole suite
