"""Each pick filter against a table of one-node cases: does the node pass?"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.placer.pick import filters, nvml_bits
from tests.placer.pick.helpers import by_id, query, snapshot_of

HW_THERMAL = nvml_bits.HW_THERMAL_SLOWDOWN
SW_THERMAL = nvml_bits.SW_THERMAL_SLOWDOWN

# (case, node spec, query fields, passes)
HEALTHY = [
    ("fresh", {}, {}, True),
    ("deadline passed", {"deadline": -0.1}, {}, False),
    ("deadline exactly now", {"deadline": 0.0}, {}, False),
    ("draining", {"draining": True}, {}, False),
]

# The helper's model weighs 16 GB.
LOADABLE = [
    ("resident, no free memory", {"models": {"llama-8b": "resident"}, "free_gb": 0}, {}, True),
    ("host copy, no free memory", {"models": {"llama-8b": "host"}, "free_gb": 0}, {}, True),
    ("cold, weights fit", {"free_gb": 16}, {}, True),
    ("cold, weights do not fit", {"free_gb": 15.9}, {}, False),
    ("not in its catalog, weights fit", {"models": {"other": "resident"}, "free_gb": 80}, {}, False),
    ("unknown model", {}, {"model": "nobody-has-it"}, False),
    ("weight size never reported", {"weight_bytes": 0, "free_gb": 0}, {}, True),
]

MEMORY = [
    ("resident, kv has room", {"models": {"llama-8b": "resident"}, "kv": 0.5, "free_gb": 0}, {}, True),
    ("resident, kv full", {"models": {"llama-8b": "resident"}, "kv": 0.98}, {}, False),
    ("host copy needs room for weights", {"models": {"llama-8b": "host"}, "free_gb": 1}, {}, False),
    ("host copy with room", {"models": {"llama-8b": "host"}, "free_gb": 20}, {}, True),
    ("cold with room", {"free_gb": 16}, {}, True),
    ("cold without room", {"free_gb": 8}, {}, False),
    ("unknown model leaves only the kv check", {}, {"model": "nobody-has-it"}, True),
]

THERMAL = [
    ("no thermal sample", {}, {}, True),
    ("cool", {"temp": 60}, {}, True),
    ("within shutdown margin", {"temp": 90.5, "slowdown": 0, "shutdown": 95}, {}, False),
    ("just outside shutdown margin", {"temp": 89.9, "slowdown": 0, "shutdown": 95}, {}, True),
    ("shutdown unknown: no margin check", {"temp": 99, "slowdown": 0, "shutdown": 0}, {}, True),
    (
        "hw thermal bit past slowdown",
        {"temp": 91, "slowdown": 90, "shutdown": 100, "reasons": HW_THERMAL},
        {},
        False,
    ),
    ("hw thermal bit at slowdown", {"temp": 90, "slowdown": 90, "reasons": HW_THERMAL}, {}, False),
    ("hw thermal bit below slowdown", {"temp": 85, "slowdown": 90, "reasons": HW_THERMAL}, {}, True),
    (
        "hw slowdown bit past slowdown",
        {"temp": 91, "shutdown": 100, "reasons": nvml_bits.HW_SLOWDOWN},
        {},
        False,
    ),
    (
        "sw thermal bit past slowdown is for scoring",
        {"temp": 91, "shutdown": 100, "reasons": SW_THERMAL},
        {},
        True,
    ),
    ("hot without any bit is for scoring", {"temp": 91, "slowdown": 90, "shutdown": 100}, {}, True),
    ("hw bit, slowdown unknown: default 87 C", {"temp": 88, "slowdown": 0, "reasons": HW_THERMAL}, {}, False),
]


def _passes(keep: filters.Filter, spec: dict[str, Any], fields: dict[str, Any]) -> bool:
    snapshot = snapshot_of({"id": "n", **spec})
    mask = keep(snapshot, query(**fields), filters.all_rows(snapshot))
    assert mask.dtype == np.bool_ and mask.shape == (snapshot.num_rows,)
    return bool(by_id(snapshot, mask)["n"])


@pytest.mark.parametrize(
    ("keep", "spec", "fields", "expected"),
    [pytest.param(filters.healthy, s, f, e, id=f"healthy: {c}") for c, s, f, e in HEALTHY]
    + [pytest.param(filters.model_loadable, s, f, e, id=f"loadable: {c}") for c, s, f, e in LOADABLE]
    + [pytest.param(filters.memory, s, f, e, id=f"memory: {c}") for c, s, f, e in MEMORY]
    + [pytest.param(filters.not_thermally_critical, s, f, e, id=f"thermal: {c}") for c, s, f, e in THERMAL],
)
def test_filter_cases(
    keep: filters.Filter, spec: dict[str, Any], fields: dict[str, Any], expected: bool
) -> None:
    assert _passes(keep, spec, fields) is expected


def test_a_removed_node_row_never_passes() -> None:
    snapshot = snapshot_of({"id": "a", "free_gb": 20}, {"id": "b", "free_gb": 20})
    row = snapshot.row_of["a"]
    snapshot.remove("a")
    assert filters.passing(snapshot, query(), filters.DEFAULT_FILTERS).tolist() == [snapshot.row_of["b"]]
    assert row != snapshot.row_of["b"]


def test_thresholds_come_from_config() -> None:
    config = filters.FilterConfig(kv_full_fraction=0.5, shutdown_margin_c=10.0)
    built = filters.build_filters(config)
    assert list(built) == ["healthy", "model_loadable", "memory", "not_thermally_critical"]
    snapshot = snapshot_of(
        {"id": "n", "models": {"llama-8b": "resident"}, "kv": 0.6, "temp": 86, "shutdown": 95}
    )
    rows = filters.all_rows(snapshot)
    assert not built["memory"](snapshot, query(), rows)[0]
    assert not built["not_thermally_critical"](snapshot, query(), rows)[0]
    assert filters.DEFAULT_FILTERS["memory"](snapshot, query(), rows)[0]
    assert filters.DEFAULT_FILTERS["not_thermally_critical"](snapshot, query(), rows)[0]
