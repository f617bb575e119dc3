#!/usr/bin/env bash
# The one command a GPU machine runs: bash scripts/gpu-check.sh [REPORT]  (default: gpu-check-report.txt)
#
# Under 6 minutes on one GPU; no Jupyter server (notebooks run in a kernel nbclient starts); installs
# nothing beyond the README's install. It writes a text report a note can quote, every part's output
# with its exit code and time, and a summary line: every `pytest -m cuda` test; "train on the GPU in the
# kernel, then devices=2" (gloo ranks on the CPU with one GPU, NCCL with two); notebooks 05 and 06
# executed; the checklist walk on a small conv net (it must finish and print its table); and
# benchmarks.gpu_check. Without a GPU every GPU part says "skipped" (a dry check of the script itself).
# The exit code is the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
REPORT=${1:-gpu-check-report.txt}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
started=$(date +%s)

{
  echo "nbtrain gpu check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  "$PYTHON" -c "import platform, os, torch; n = torch.cuda.device_count(); print(f'{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {n} CUDA device(s)')"
} > "$REPORT" 2>&1

part() {  # part NAME COMMAND...: its output into the report, its exit code and time after it
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  echo "== $name" >> "$REPORT"
  "$@" >> "$REPORT" 2>&1
  rc=$?
  echo "== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)"), $(( $(date +%s) - t0 )) s" >> "$REPORT"
  echo "$name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

part "pytest -m cuda" "$PYTHON" -m pytest -m cuda -rA -q -p no:cacheprovider
part "train on the GPU in the kernel, then devices=2" "$PYTHON" scripts/gpu_check_parts.py sequence
part "notebook 05 executed" "$PYTHON" scripts/gpu_check_parts.py notebook 05
part "notebook 06 executed" "$PYTHON" scripts/gpu_check_parts.py notebook 06
part "checklist walk on a small conv net" "$PYTHON" scripts/gpu_check_parts.py walk
part "benchmarks.gpu_check" "$PYTHON" -m benchmarks.gpu_check

echo "gpu check: $failed part(s) failed, $(( $(date +%s) - started )) s in all" >> "$REPORT"
echo "gpu check: $failed part(s) failed; report in $REPORT"
exit "$failed"
