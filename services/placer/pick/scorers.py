"""Pick scorers: a value in [0, 1] per node, 1 best. Two kinds:

- a row scorer, `(snapshot, query, rows) -> float[len(rows)]`, depends on the node's columns, the model
  and the workload class only (`rows` as for filters: a slice or row indices). The Picker keeps its
  values per model and class and rescores only the rows written since, so reading anything else from
  the query would be a bug;
- a RequestScorer depends on the request itself (the caller's topology, the prompt's prefix): it runs
  on every pick, writing into `out` (float[num_rows], all 0) and returning the rows it wrote (row
  indices in [0, num_rows), repeats allowed, the last write counting) or None, so a pick touches only
  the rows a request favours. One that favours at most one row (prefix affinity) also gives that row
  and its value as `point`, which the Picker writes as scalars.

Scorers are pure: they read the snapshot's columns, the query and the framework-resolved context, and
change nothing else. The framework clamps their output to [0, 1] (NaN becomes 0), weights it per
workload class and sums; a scorer documents its formula and need not repeat the clamp.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import UNKNOWN_CODE, ClusterSnapshot, topology_keys
from services.placer.pick import nvml_bits
from services.placer.pick.filters import Rows
from services.placer.pick.query import PickContext, PickQuery

RowScorer = Callable[[ClusterSnapshot, PickQuery, Rows], np.ndarray]


# A request scorer that favours at most one row: (row in [0, num_rows), its value) or None.
PointScore = Callable[[ClusterSnapshot, PickQuery, PickContext], tuple[int, float] | None]


@dataclass(frozen=True)
class RequestScorer:
    """A scorer whose values depend on the request, not only on the node, model and class.

    point: for a scorer that favours at most one row, the same scores as (row, value) or None, which
    the Picker adds as a scalar: writing, clamping and clearing a one-row array cost it microseconds a
    pick, about a tenth of a compiled pick at fleet scale. score stays the definition."""

    score: Callable[[ClusterSnapshot, PickQuery, PickContext, np.ndarray], np.ndarray | None]
    point: PointScore | None = None


Scorer = RowScorer | RequestScorer


def evaluate(scorer: Scorer, snapshot: ClusterSnapshot, query: PickQuery, context: PickContext) -> np.ndarray:
    """Either kind of scorer's value for every row (float[num_rows]) as the Picker weighs it: clamped to
    [0, 1], NaN as 0. For tests, tools and policies that want a whole column."""
    if isinstance(scorer, RequestScorer):
        values = np.zeros(snapshot.num_rows)
        scorer.score(snapshot, query, context, values)
    else:
        values = np.array(scorer(snapshot, query, slice(0, snapshot.num_rows)), dtype=np.float64)
    return clamp_scores(values)


def clamp_scores(values: np.ndarray) -> np.ndarray:
    """values clamped to [0, 1] in place, NaN as 0 (a scorer's NaN means "no information", not "best")."""
    # fmax first: it maps NaN to 0.
    return np.minimum(np.fmax(values, 0.0, out=values), 1.0, out=values)


def clamp_score(value: float) -> float:
    """One value as clamp_scores clamps it: to [0, 1], NaN as 0."""
    return min(float(value), 1.0) if value >= 0.0 else 0.0


@dataclass(frozen=True)
class ScorerConfig:
    thermal_span_c: float = 30.0  # headroom this many degrees below slowdown or more counts as fully cool
    thermal_horizon_s: float = 10.0  # a rising temperature is projected this far ahead
    default_slowdown_c: float = nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C  # where NVML reports none
    no_sample_thermal_score: float = 0.5  # neutral: neither preferred nor avoided
    # A cached prefix is worth nothing to a batch request on a node with this many requests waiting:
    # past a few, the queue costs more than recomputing the prompt elsewhere.
    prefix_queue_limit: float = 8.0
    # A node this full of KV has no room to gather more batch (batch_isolation); below the memory
    # filter's 0.98, so batch moves on before the node is refused outright.
    batch_kv_limit: float = 0.95
    # The share of nodes node_reserve keeps for the latency classes (where a class weighs it): on a
    # uniformly cooled fleet a sixteenth bought most of what a quarter did for chat, at a sixtieth of
    # its cost in batch (docs/simulator.md, item 9).
    node_reserve_fraction: float = 0.0625


def model_affinity(snapshot: ClusterSnapshot, query: PickQuery, rows: Rows) -> np.ndarray:
    """1.0 where the model is resident, 0.5 where a host copy is kept, 0.0 where it would load cold."""
    model = snapshot.models.get(query.model)
    if model is None:
        return np.zeros(snapshot.live[rows].shape)
    resident = model.resident[rows]
    # 0, 1 or 2 halves: "resident or host copy" counts one, resident one more. uint8 sums are cheap.
    halves = resident.view(np.uint8) + (resident | model.host_copy[rows]).view(np.uint8)
    return halves * 0.5


def load(snapshot: ClusterSnapshot, query: PickQuery, rows: Rows) -> np.ndarray:
    """1 - (0.5 * (running + waiting) / max(max_running, 1) + 0.5 * kv_usage), so 0 once the node is
    full (the framework's clamp floors it there).

    Normalised against each node's own capacity, not min-max across candidates, so one decision's value
    means the same in the next; a queue longer than capacity drives it to 0.
    """
    busy = snapshot.running[rows] + snapshot.waiting[rows]  # in place from here: one temporary
    busy /= np.maximum(snapshot.max_running[rows], 1.0)
    busy += snapshot.kv_usage[rows]
    busy *= -0.5
    busy += 1.0
    return busy


def batch_isolation(
    snapshot: ClusterSnapshot,
    query: PickQuery,
    rows: Rows,
    *,
    config: ScorerConfig = ScorerConfig(),
) -> np.ndarray:
    """share = (batch_running + batch_waiting) / (running + waiting), the node's work that is BATCH.
    Every class but BATCH scores 1 - share (1 on an idle node). A BATCH request scores share on a node
    with room for it, and 0 on one without: batch already waiting there (the placer's own picks since
    the last heartbeat included), every seat taken (running + waiting >= max_running), or kv_usage >=
    config.batch_kv_limit; an idle node has share 0, so load and heat decide between it and others.

    Why: a GPU decoding batch beside a chat request stalls its tokens behind batch prompts' prefill
    chunks, and at fleet load an evenly spread batch is on every GPU. This gathers batch where batch
    already runs and keeps latency work where it does not. "Room" stops the gathering at what a node
    admits: without it, batch piled up in the queues of the GPUs it had reached first (the fleet
    simulator: batch throughput 28,500 -> 11,100 output tok/s). No class weighs it by default
    (weights.py says why); HANZO_PLACER_WEIGHTS_FILE or `python -m sim --weights` turn it on.
    """
    work = snapshot.running[rows] + snapshot.waiting[rows]
    batch_waiting = snapshot.batch_waiting[rows]
    batch = snapshot.batch_running[rows] + batch_waiting
    share = np.divide(batch, work, out=np.zeros_like(batch), where=work > 0)
    if query.workload_class != WorkloadClass.BATCH:
        share *= -1.0
        share += 1.0
        return share
    no_room = (batch_waiting > 0) | (work >= snapshot.max_running[rows])
    no_room |= snapshot.kv_usage[rows] >= config.batch_kv_limit
    np.putmask(share, no_room, 0.0)
    return share


def thermal_headroom(
    snapshot: ClusterSnapshot,
    query: PickQuery,
    rows: Rows,
    *,
    config: ScorerConfig = ScorerConfig(),  # frozen, so one shared default is safe
) -> np.ndarray:
    """clamp((slowdown - temp) / span - max(trend, 0) * horizon / span, 0, 1), then
    x 0.25 where a power slowdown bit is set, and 0 where a thermal slowdown bit is set.

    slowdown is the reported NVML slowdown threshold (config.default_slowdown_c where unknown), span is
    config.thermal_span_c, horizon config.thermal_horizon_s, trend temperature_trend_c_per_s (only a rising
    temperature counts). Nodes without a thermal sample get config.no_sample_thermal_score (neutral 0.5).
    """
    temp = snapshot.temperature_c[rows]
    reported = snapshot.slowdown_temperature_c[rows]
    slowdown = nvml_bits.slowdown_threshold_c(reported, config.default_slowdown_c)
    rising = np.maximum(snapshot.temperature_trend_c_per_s[rows], 0.0)
    # In place, one temporary: degrees C of headroom left after `horizon` seconds at the current trend.
    score = slowdown - temp
    score -= rising * config.thermal_horizon_s
    score /= config.thermal_span_c
    np.minimum(np.maximum(score, 0.0, out=score), 1.0, out=score)  # before the bits scale it down
    # putmask rather than score[mask] = ...: the same result, a few times faster on scattered masks.
    reasons = snapshot.clock_event_reasons[rows]
    np.putmask(score, nvml_bits.any_bits(reasons, nvml_bits.POWER_SLOWDOWN), score * 0.25)
    np.putmask(score, nvml_bits.any_bits(reasons, nvml_bits.THERMAL_SLOWDOWN), 0.0)
    np.putmask(score, ~snapshot.has_thermal[rows], config.no_sample_thermal_score)
    return score


def node_reserve(
    snapshot: ClusterSnapshot,
    query: PickQuery,
    rows: Rows,
    *,
    config: ScorerConfig = ScorerConfig(),
) -> np.ndarray:
    """The node reserve: the nodes whose reserve_rank (a hash of the node id, uniform in [0, 1)) lies
    below config.node_reserve_fraction are kept for the latency classes. A BATCH request scores 0 on
    them and 1 elsewhere; every other class 1 on them and 0 elsewhere.

    Why: where batch reaches a GPU, its prompt chunks stretch every chat token there, and at fleet load
    an evenly spread batch reaches every GPU. Uneven cooling keeps batch off the hot GPUs
    (thermal_headroom), which leaves chat somewhere to go; a uniformly cooled fleet has no such GPUs.
    Weighted above what load and heat can make up, batch lands on the reserve only when no node outside
    it passes the filters. A hash, not a list kept somewhere: every placer replica reserves the same
    nodes with nothing to agree on, and a node keeps its place as others come and go. No class weighs
    it by default, and the latency classes are better left unweighted too: load already sends them to
    the nodes batch keeps off, and drawn into a reserve too small for them they queue there
    (docs/simulator.md, item 9)."""
    reserved = snapshot.reserve_rank[rows] < config.node_reserve_fraction
    if query.workload_class == WorkloadClass.BATCH:
        reserved = ~reserved
    return reserved.astype(np.float64)


def topology(
    snapshot: ClusterSnapshot, query: PickQuery, context: PickContext, out: np.ndarray
) -> np.ndarray | None:
    """max of: 1.0 on the caller's host, 0.7 in its rack, 0.4 in its zone; 0.0 elsewhere.

    A caller label that is unknown ("") matches nothing, so with no caller labels every node scores 0 (no
    preference). Labels compare as interned codes, racks qualified by their zone (topology_keys); the
    snapshot keeps each label's rows, so this touches only the caller's zone, rack and host.
    """
    written = []
    zone, rack, host = topology_keys(query.caller_zone, query.caller_rack, query.caller_host)
    for label, column, value in ((zone, "zone", 0.4), (rack, "rack", 0.7), (host, "host", 1.0)):
        code = snapshot.known_code(label)
        if code != UNKNOWN_CODE:
            rows = snapshot.labelled(column, code)
            # Later levels are closer, so they overwrite: the result is the max of the matches.
            out[rows] = value
            written.append(rows)
    if not written:
        return None
    return written[0] if len(written) == 1 else np.concatenate(written)


def prefix_affinity(
    snapshot: ClusterSnapshot,
    query: PickQuery,
    context: PickContext,
    out: np.ndarray,
    *,
    config: ScorerConfig = ScorerConfig(),
) -> np.ndarray | None:
    """On context.prefix_row (the node that last served the prompt's longest remembered prefix, resolved by
    the framework: it likely still holds that prefix's KV blocks): 1.0, or for a BATCH request max(0, 1 -
    waiting / config.prefix_queue_limit); 0.0 everywhere else and everywhere when it is None.

    Why batch alone fades with the queue: the fleet simulator showed a flat 1.0 sending a whole job's
    documents (one shared instruction prefix) to one node, whose queue then grew without bound. Latency
    classes are served ahead of that queue by the worker's adaptive policy, and the queue ahead of them
    (their own class) is not in the heartbeat, so for them the cache keeps its full weight."""
    found = prefix_affinity_point(snapshot, query, context, config=config)
    if found is None:
        return None
    row, out[row] = found
    return np.array([row])


def prefix_affinity_point(
    snapshot: ClusterSnapshot,
    query: PickQuery,
    context: PickContext,
    *,
    config: ScorerConfig = ScorerConfig(),
) -> tuple[int, float] | None:
    """prefix_affinity's one scored row and its value (RequestScorer.point), or None."""
    row = context.prefix_row
    if row is None or not 0 <= row < snapshot.num_rows:
        return None
    value = 1.0
    if query.workload_class == WorkloadClass.BATCH:
        value = max(0.0, 1.0 - float(snapshot.waiting[row]) / config.prefix_queue_limit)
    return row, value


def build_scorers(config: ScorerConfig | None = None) -> dict[str, Scorer]:
    """The standard scorers by name, with config's constants bound in."""
    config = config or ScorerConfig()
    return {
        "model_affinity": model_affinity,
        "load": load,
        "batch_isolation": functools.partial(batch_isolation, config=config),
        "thermal_headroom": functools.partial(thermal_headroom, config=config),
        "node_reserve": functools.partial(node_reserve, config=config),
        "topology": RequestScorer(topology),
        "prefix_affinity": RequestScorer(
            functools.partial(prefix_affinity, config=config),
            point=functools.partial(prefix_affinity_point, config=config),
        ),
    }


DEFAULT_SCORERS: Mapping[str, Scorer] = MappingProxyType(build_scorers())  # read-only
