"""The comparison as a picture: SLO attainment per policy and class, and GPU temperatures over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # after choosing the backend
import numpy as np

CLASSES = ("realtime_chat", "agent_tool", "embedding", "batch")


def plot(runs: list[dict[str, object]], path: Path, slowdown_c: float) -> Path:
    """runs: run_policies' summaries for one cooling level."""
    fig, (bars, temps) = plt.subplots(1, 2, figsize=(14, 5.5))
    policies = [str(r["policy"]) for r in runs]
    width = 0.8 / len(CLASSES)
    x = np.arange(len(policies))
    for i, name in enumerate(CLASSES):
        values = [r["classes"][name]["slo_attainment"] or 0.0 for r in runs]  # type: ignore[index]
        bars.bar(x + (i - 1.5) * width, values, width, label=name.replace("_", " "))
    bars.set_xticks(x, policies, rotation=20)
    bars.set_ylim(0, 1.05)
    bars.set_ylabel("SLO attainment")
    bars.set_title(f"Service levels by policy ({runs[0]['cooling']} cooling imbalance)")
    bars.legend(loc="lower left", fontsize=8)

    for run in runs:
        trace = np.asarray(run["trace"])
        if trace.size == 0:
            continue
        minutes = trace[:, 0] / 60
        (line,) = temps.plot(minutes, trace[:, 3], label=f"{run['policy']} p99")
        temps.plot(minutes, trace[:, 1], color=line.get_color(), alpha=0.4, linestyle=":")
    temps.axhline(slowdown_c, color="red", linestyle="--", linewidth=1, label="slowdown threshold")
    temps.set_xlabel("simulated minutes")
    temps.set_ylabel("GPU temperature, C (solid p99, dotted p50)")
    temps.set_title("Fleet temperature distribution")
    temps.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
