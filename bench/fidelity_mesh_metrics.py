"""What bench/sim_fidelity.py reads from the running mesh besides the requests it serves: each
service's CPU time, and from the workers' own Prometheus text their engine steps by budget and their
preemptions by class, and the dtype each worker's log says "auto" chose."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from bench.chaos_mesh import UpProcess
from services.common.workload import WorkloadClass
from sim.fidelity import CHAT_MODEL


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process has used, from /proc; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_metrics(up: UpProcess) -> dict[str, str]:
    """Each worker's Prometheus text, by its name in the process table (service, pid, address, metrics
    port, detail)."""
    texts: dict[str, str] = {}
    for _, line in up.lines:
        cells = line.split()
        if len(cells) < 4 or not cells[0].startswith("worker-") or not cells[3].isdigit():
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{cells[3]}/metrics", timeout=5) as reply:
            texts[cells[0]] = reply.read().decode()
    return texts


def engine_steps(texts: dict[str, str]) -> dict[str, dict[str, float]]:
    """Each worker's engine steps by the token budget its policy chose (its Prometheus counter, warm-up
    included): how finely the real engine cut the work the simulator runs in full-budget steps."""
    found: dict[str, dict[str, float]] = {}
    for worker, text in texts.items():
        steps: dict[str, float] = {}
        for row in text.splitlines():
            if row.startswith("hanzo_worker_engine_steps_total{") and f'model_name="{CHAT_MODEL}"' in row:
                budget = row.split('budget="', 1)[1].split('"', 1)[0]
                steps[budget] = float(row.rsplit(" ", 1)[1])
        found[worker] = dict(sorted(steps.items(), key=lambda kv: int(kv[0])))
    return found


def preemptions(texts: dict[str, str]) -> dict[str, float]:
    """Sequences the workers' engines preempted so far, by the preempted one's class (lower-case)."""
    found = {wc.name.lower(): 0.0 for wc in WorkloadClass if wc != WorkloadClass.UNSPECIFIED}
    for text in texts.values():
        for row in text.splitlines():
            if row.startswith("hanzo_worker_num_preemptions_total{") and f'model_name="{CHAT_MODEL}"' in row:
                workload = row.split('workload_class="', 1)[1].split('"', 1)[0].lower()
                found[workload] = found.get(workload, 0.0) + float(row.rsplit(" ", 1)[1])
    return found


def dtype_line(text: str) -> str:
    """What "auto" chose for each model the worker loaded, in load order (its log's dtype lines)."""
    marker = "dtype auto -> "
    return ",".join(line.split(marker, 1)[1].split()[0] for line in text.splitlines() if marker in line)
