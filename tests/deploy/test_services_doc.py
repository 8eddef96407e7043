"""deploy/SERVICES.md's worker and placer metrics tables against the metrics each registers: every
exported metric documented with its type, nothing documented that is not exported."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from services.placer.metrics import PlacerMetrics
from services.worker.server.metrics import WorkerMetrics
from tests.deploy.manifests import DEPLOY


@pytest.mark.parametrize(
    ("prefix", "registry"),
    [("hanzo_worker", lambda: WorkerMetrics().registry), ("hanzo_placer", lambda: PlacerMetrics().registry)],
)
def test_metrics_tables_match_the_registries(prefix: str, registry: object) -> None:
    exported = {}
    collected: CollectorRegistry = registry()  # type: ignore[operator]
    for family in collected.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        exported[name] = family.type
    text = (DEPLOY / "SERVICES.md").read_text()
    rows = re.findall(rf"^\| `({prefix}_\w+)` \| (\w+) \|", text, re.M)
    assert dict(rows) == exported
