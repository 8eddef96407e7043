"""The demo's per-class report: percentiles, a text table, a few real answers, and the same as JSON.

The samples are there because numbers alone cannot tell a served model from a broken one: a person
reading the report sees what was asked and what came back, and the probe's answer beside its question.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.common.workload import WorkloadClass
from services.mesh.driver import RequestResult

SAMPLES_PER_CLASS = 3
ASKED_CHARS = 100  # a sample's question head
ANSWER_CHARS = 200  # a sample's answer, trimmed

CLASSES = [
    WorkloadClass.REALTIME_CHAT,
    WorkloadClass.AGENT_TOOL,
    WorkloadClass.BATCH,
    WorkloadClass.EMBEDDING,
]


def percentile(values: Sequence[float], q: float) -> float | None:
    """q-th percentile (q in [0, 100]) with linear interpolation between ranks, as numpy's default;
    None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def class_name(cls: WorkloadClass) -> str:
    """Report key of a class: "realtime_chat", as in x-hanzo-workload."""
    return cls.name.lower()


def build_report(results: Sequence[RequestResult], meta: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-ready report: {"meta", "classes": {name: stats}, "total": stats, "samples", "probe", "ok"}.

    Times in ms. output_tokens_per_s: a class's completion tokens over the span from its first send to
    its last finish (None without tokens). nodes: served requests per node id. samples: {name: [sample]}
    for the classes that generate text, the first SAMPLES_PER_CLASS answered requests of each (the probe
    aside); probe: the request with an expected answer as a sample with "expected" and "status" added
    (None when the plan had none). ok: every request succeeded, the probe's answer check included.
    """
    classes = {class_name(c): _stats([r for r in results if r.workload_class is c]) for c in CLASSES}
    return {
        "meta": dict(meta),
        "classes": classes,
        "total": _stats(list(results)),
        "samples": {
            class_name(c): [_sample(r) for r in _answered(results, c)][:SAMPLES_PER_CLASS]
            for c in CLASSES
            if c is not WorkloadClass.EMBEDDING
        },
        "probe": _probe(results),
        "ok": all(r.ok for r in results),
    }


def _probe(results: Sequence[RequestResult]) -> dict[str, Any] | None:
    probe = next((r for r in results if r.expected), None)
    if probe is None:
        return None
    return {**_sample(probe), "expected": probe.expected, "status": probe.status}


def _answered(results: Sequence[RequestResult], cls: WorkloadClass) -> list[RequestResult]:
    return [r for r in results if r.workload_class is cls and r.ok and r.text and not r.expected]


def _sample(r: RequestResult) -> dict[str, Any]:
    """One request's question head and answer, whitespace collapsed so each reads on one line."""
    return {
        "index": r.index,
        "node": r.node_id,
        "asked": _trim(r.asked, ASKED_CHARS),
        "answer": _trim(r.text, ANSWER_CHARS),
    }


def _trim(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _stats(rs: Sequence[RequestResult]) -> dict[str, Any]:
    ok = [r for r in rs if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    tokens = sum(r.output_tokens for r in ok)
    span = max(
        (r.sent_at_s + r.e2e_s for r in ok if r.sent_at_s is not None and r.e2e_s is not None), default=0.0
    )
    span -= min((r.sent_at_s for r in ok if r.sent_at_s is not None), default=0.0)
    return {
        "requests": len(rs),
        "ok": len(ok),
        "errors": dict(sorted(Counter(r.status for r in rs if not r.ok).items())),
        "ttft_ms": {"p50": _ms(percentile(ttfts, 50)), "p99": _ms(percentile(ttfts, 99))},
        "e2e_ms": {"p50": _ms(percentile(e2es, 50)), "p99": _ms(percentile(e2es, 99))},
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / span, 1) if tokens and span > 0 else None,
        "nodes": dict(sorted(Counter(r.node_id or "?" for r in ok).items())),
        "classified_as": dict(
            sorted(Counter(class_name(r.served_class) for r in ok if r.served_class is not None).items())
        ),
        "first_errors": [f"#{r.index} {r.status}: {r.message}" for r in rs if not r.ok][:3],
    }


def format_report(report: Mapping[str, Any]) -> str:
    """A fixed-width table, one row per class plus a total row, each class's first errors, then the
    samples and the probe."""
    head = ("class", "reqs", "errors", "ttft p50", "ttft p99", "e2e p50", "e2e p99", "out tok/s", "nodes")
    rows = [head]
    for name, s in [*report["classes"].items(), ("total", report["total"])]:
        errors = ",".join(f"{k}={v}" for k, v in s["errors"].items()) or "0"
        nodes = " ".join(f"{k}:{v}" for k, v in s["nodes"].items()) or "-"
        rows.append(
            (
                name,
                str(s["requests"]),
                errors,
                _fmt(s["ttft_ms"]["p50"], "ms"),
                _fmt(s["ttft_ms"]["p99"], "ms"),
                _fmt(s["e2e_ms"]["p50"], "ms"),
                _fmt(s["e2e_ms"]["p99"], "ms"),
                _fmt(s["output_tokens_per_s"], ""),
                nodes,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    for name, s in [*report["classes"].items()]:
        lines += [f"  {name}: {e}" for e in s["first_errors"]]
    return "\n".join(lines + _sample_lines(report))


def _sample_lines(report: Mapping[str, Any]) -> list[str]:
    lines = []
    probe = report.get("probe")
    if probe is not None:
        lines += ["", f"probe ({probe['status']}, the answer must contain {probe['expected']!r}):"]
        lines += [f"  Q: {probe['asked']}", f"  A: {probe['answer'] or '-'}"]
    for name, samples in report.get("samples", {}).items():
        if samples:
            lines += ["", f"{name} samples:"]
        for s in samples:
            lines += [
                f"  #{s['index']} on {s['node'] or '?'}",
                f"    Q: {s['asked']}",
                f"    A: {s['answer']}",
            ]
    return lines


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def write_report(report: Mapping[str, Any], path: Path) -> Path:
    """Write the report as indented JSON (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path
