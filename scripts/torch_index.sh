#!/usr/bin/env bash
# Which torch build scripts/test.sh installs before the package, printed as one word:
#   installed  torch is already in the environment of PYTHON (the first argument): nothing to fetch (offline too)
#   cpu        no NVIDIA GPU here (no `nvidia-smi` on PATH, or it lists no GPU): the CPU builds of torch and
#              torchvision from the CPU index, the README's install line, not PyPI's CUDA build (~15 nvidia-*
#              wheels, several GB)
#   pypi       an NVIDIA GPU (or macOS, whose PyPI build is the CPU one): `pip install -e .` takes PyPI's build
# NBTRAIN_TORCH_INDEX=cpu or =pypi decides instead of nvidia-smi (a torch already there is still kept).
# Only compared, never run or passed on: what the variable holds reaches no command line.
set -euo pipefail
python=${1:?usage: torch_index.sh PYTHON}

if "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null; then
  echo installed
  exit 0
fi
case "${NBTRAIN_TORCH_INDEX:-}" in
  cpu | pypi) echo "$NBTRAIN_TORCH_INDEX" ;;
  "")
    if [ "$(uname -s)" = Darwin ]; then
      echo pypi  # PyPI's macOS build has no CUDA in it
    elif command -v nvidia-smi >/dev/null 2>&1 && listed=$(nvidia-smi -L 2>/dev/null) \
        && grep -q '^GPU ' <<<"$listed"; then  # (read whole first: grep -q may end before a pipe's writer)
      echo pypi
    else
      echo cpu
    fi ;;
  *)
    printf 'scripts/test.sh: NBTRAIN_TORCH_INDEX=%q: allowed: cpu (the CPU builds of torch and torchvision), pypi ' \
      "$NBTRAIN_TORCH_INDEX" >&2
    echo "(PyPI's build, CUDA on Linux) or unset (cpu unless nvidia-smi lists a GPU, or on macOS)" >&2
    exit 2 ;;
esac
