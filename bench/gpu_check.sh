#!/usr/bin/env bash
# The checks that need a GPU, as one prepared run for a lent device machine (see ../.library/device):
#   1. real NVML samples (driver, device names, one JSON line per GPU per reading);
#   2. the CUDA paths of the memory manager and engines: tests/worker/memory (its CUDA tests are skipped
#      on a CPU machine: arena sized from free GPU memory, pinned host copies, reload on CUDA);
#   3. bench/multimodel.py on CUDA: host-copy reload vs disk vs a plain copy, switch overhead.
# Each step runs even if an earlier one failed; a summary line per step ends the output, and every
# step's output is also written to $OUT when it is set (the device tool brings that folder back).
#
# On the device machine nothing is installed: its python3 has torch, grpcio, protobuf, pytest and
# nvidia-ml-py; the generated protobuf package is carried. From this machine, after `make setup`:
#   run(command="bash bench/gpu_check.sh", carry=["hanzo"], timeout_s=540)
# Usage: bench/gpu_check.sh [--nvml-only]. Exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then
  PYTHON=.venv/bin/python
else
  PYTHON=python3
fi
export PYTHONUNBUFFERED=1
out="${OUT:-}"
declare -a summary=()
failed=0

step() {  # step NAME COMMAND...: run it, keep its output, record its exit code
  local name=$1
  shift
  echo "=== ${name}: $*"
  if [[ -n "$out" ]]; then
    "$@" 2>&1 | tee "$out/${name}.log"
  else
    "$@" 2>&1
  fi
  local rc=${PIPESTATUS[0]}
  summary+=("${name}: exit ${rc}")
  [[ $rc -eq 0 ]] || failed=1
}

step nvml "$PYTHON" -m services.telemetry.gpu_check --samples 3
if [[ "${1:-}" != "--nvml-only" ]]; then
  step memory_tests "$PYTHON" -m pytest -q -p no:cacheprovider tests/worker/memory
  step multimodel_bench "$PYTHON" bench/multimodel.py --device cuda --quick --skip-serving
fi
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $failed
