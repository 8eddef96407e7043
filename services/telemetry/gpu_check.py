"""Real-GPU check: prints driver, device names and a few NVML readings as JSON lines, then the last
readings as the agent's /metrics shows them (dcgm-exporter's names: dcgm_metrics.py); installs nothing.

`python -m services.telemetry.gpu_check [--samples N] [--interval-s S]`. Exit 0 on success, 2 where
there is no usable NVML (the message says so on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import time

import pynvml
from prometheus_client import generate_latest

from services.telemetry.dcgm_metrics import DcgmMetrics
from services.telemetry.nvml_source import NvmlSource


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=5, help="readings per GPU (default 5)")
    parser.add_argument("--interval-s", type=float, default=1.0, help="seconds between readings (default 1)")
    parser.add_argument("--gpu-index", type=int, default=None, help="only this GPU (default: all)")
    args = parser.parse_args(argv)
    try:
        source = NvmlSource(args.gpu_index)
    except pynvml.NVMLError as err:
        print(
            f"gpu_check: no NVML ({err}): no usable NVIDIA driver/GPU here, nothing to check", file=sys.stderr
        )
        return 2
    try:
        print(json.dumps(source.describe()), flush=True)
        readings = []
        for n in range(args.samples):
            if n:
                time.sleep(args.interval_s)  # a plain script: no event loop to keep free
            readings = source.read()
            for reading in readings:
                print(json.dumps(dataclasses.asdict(reading)), flush=True)
        metrics = DcgmMetrics(socket.gethostname(), "gpu-check")
        metrics.update(readings)
        exposition = generate_latest(metrics.registry).decode()
        print("\n".join(line for line in exposition.splitlines() if line.startswith("DCGM_")), flush=True)
    finally:
        source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
