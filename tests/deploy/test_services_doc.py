"""deploy/SERVICES.md's worker metrics table against the metrics the worker registers: every exported
metric documented, nothing documented that is not exported."""

from __future__ import annotations

import re

from services.worker.server.metrics import WorkerMetrics
from tests.deploy.manifests import DEPLOY


def test_worker_metrics_table_matches_the_registry() -> None:
    exported = {}
    for family in WorkerMetrics().registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        exported[name] = family.type
    rows = re.findall(r"^\| `(hanzo_worker_\w+)` \| (\w+) \|", (DEPLOY / "SERVICES.md").read_text(), re.M)
    assert dict(rows) == exported
