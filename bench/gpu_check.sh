#!/usr/bin/env bash
# Reads a few real NVML samples (driver, device names, then one JSON line per GPU per reading).
# Usage: bench/gpu_check.sh [--samples N] [--interval-s S] [--gpu-index I]. Exits non-zero without NVML.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -x .venv/bin/python ]]; then
  PYTHON=.venv/bin/python
else
  PYTHON=python3
fi
exec "$PYTHON" -m services.telemetry.gpu_check "$@"
