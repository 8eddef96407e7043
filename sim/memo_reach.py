"""How many prefix hashes a placer's prefix memo (services/placer/pick/memo.py) must hold for a session's
next turn to still find the node its history went to.

The simulator's own workload (sim/trace.py's trace of it, answers taking no time, so only think and tool
times separate turns) is replayed as the prefix chains the gateway would send for it
(services/gateway/prefix_chain.py: one element per 128 prompt tokens, each over the prompt from its
start, a partial last block included, at most 64; a chat's opening through its first user message one
element), through the real PrefixMemo at each capacity, one memo seeing every request (a single placer
replica serving the whole fleet: the most a memo is asked to hold). The fleet simulation itself gives
its sessions one element per prefix the placer can tell apart (sim/workload.py), which costs a memo far
less; this is what the real chains cost.

Per capacity, of the later turns of chats and of agent sessions, each, the share whose longest
remembered prefix is their own history ("own"), a prefix shared with other sessions, which leads to
wherever the last of those went ("shared": the tenant's tools), or nothing (placed by load alone); of
agent sessions' first turns and batch documents, the share that find their tenant's tools or their
job's instruction.

    .venv/bin/python -m sim.memo_reach [--hosts 125] [--minutes 30] [--capacities 10000,100000,1000000]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from collections import Counter
from collections.abc import Iterator

from services.common.workload import WorkloadClass
from services.placer.pick.memo import PrefixMemo
from services.placer.pick.query import MAX_PREFIX_CHAIN
from sim.cli_args import counts, positive
from sim.compare import CONVERSATIONS
from sim.config import Models, WorkloadConfig
from sim.fleet import FleetLayout
from sim.sharegpt import conversations
from sim.trace import TraceSession, build_trace
from sim.workload import CHAT_SYSTEM_TOKENS

TOKENS_PER_ELEMENT = 128  # the gateway's block (services/gateway/prefix_chain.py)
_LATER = (WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL)  # sessions with later turns
_SHARED = (WorkloadClass.AGENT_TOOL, WorkloadClass.BATCH)  # first turns opening with a shared prefix


class _Labels:
    """A snapshot's row_of for PrefixMemo.row: every "node" is a session's index, its own row, so a
    lookup says whose request last remembered the longest prefix found."""

    @staticmethod
    def get(node_id: str) -> int:
        return int(node_id)


class _Snapshot:
    row_of = _Labels()


def chain(session: TraceSession, k: int) -> tuple[int, ...]:
    """Turn k's prefix chain as the gateway would hash it, each element a hash of what it covers: a
    whole block of the shared prefix (the tenant's tools, the job's instruction) is the same for every
    session sharing it; any other whole block is the session's own and the same for each of its later
    turns; a partial last block is that turn's alone."""
    prompt = session.prompt(k)
    own = session.conversation or session.index + 1
    if session.workload == WorkloadClass.REALTIME_CHAT:
        opening = CHAT_SYSTEM_TOKENS + session.turns[0].new_tokens  # one element: ChatKey.opening
        elements = [hash((own, "opening"))]
        rest = prompt - opening
        whole, partial = divmod(rest, TOKENS_PER_ELEMENT)
        elements += [hash((own, i)) for i in range(whole)]
    else:
        shared_whole = session.shared_tokens // TOKENS_PER_ELEMENT if session.shared_key else 0
        whole, partial = divmod(prompt, TOKENS_PER_ELEMENT)
        elements = [
            hash((session.shared_key, i)) if i < shared_whole else hash((own, i)) for i in range(whole)
        ]
    if partial:
        elements.append(hash((own, "turn", k)))
    return tuple(elements[:MAX_PREFIX_CHAIN])


def requests(sessions: tuple[TraceSession, ...]) -> Iterator[tuple[float, TraceSession, int]]:
    """(arrival, session, turn) in arrival order: each turn its think time after the one before."""
    heap = [(s.start_s, s.index, 0, s) for s in sessions if s.workload != WorkloadClass.EMBEDDING]
    heapq.heapify(heap)
    while heap:
        t, index, k, session = heapq.heappop(heap)
        yield t, session, k
        if k + 1 < len(session.turns):
            heapq.heappush(heap, (t + session.turns[k + 1].gap_s, index, k + 1, session))


def replay(sessions: tuple[TraceSession, ...], capacity: int) -> dict[str, object]:
    """Every request's chain through one PrefixMemo of capacity; what its lookup found, per kind."""
    memo = PrefixMemo(capacity)
    found: dict[str, Counter[str]] = {
        "chat_later_turns": Counter(),
        "agent_later_turns": Counter(),
        "shared_openings": Counter(),
    }
    snapshot = _Snapshot()
    for _, session, k in requests(sessions):
        elements = chain(session, k)
        if k > 0 and session.workload in _LATER:
            whose = memo.row(snapshot, elements)  # type: ignore[arg-type]
            kind = "none" if whose is None else "own" if whose == session.index else "shared"
            chat = session.workload == WorkloadClass.REALTIME_CHAT
            found["chat_later_turns" if chat else "agent_later_turns"][kind] += 1
        elif k == 0 and session.workload in _SHARED:
            whose = memo.row(snapshot, elements)  # type: ignore[arg-type]
            found["shared_openings"]["none" if whose is None else "found"] += 1
        memo.remember(elements, str(session.index))
    return {
        name: {kind: round(n / max(sum(counts.values()), 1), 4) for kind, n in sorted(counts.items())}
        for name, counts in found.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hosts", type=positive(int), default=125, help="hosts of 8 GPUs (the full run's 125)"
    )
    parser.add_argument("--minutes", type=positive(float), default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--capacities", type=counts, default=[10_000, 30_000, 100_000, 300_000, 1_000_000, 10_000_000],
        help="comma-separated memo capacities, in chain elements",
    )  # fmt: skip
    args = parser.parse_args(argv)
    started = time.perf_counter()
    layout = FleetLayout(hosts=args.hosts)
    config = WorkloadConfig(duration_s=args.minutes * 60)
    zones = [f"zone-{z}" for z in range(layout.zones)]  # names only; sessions draw one each
    trace = build_trace(config, layout.gpus, zones, conversations(CONVERSATIONS), args.seed, Models())
    elements = Counter[str]()
    for _, session, k in requests(trace.sessions):
        elements[session.workload.name] += len(chain(session, k))
    written = sum(elements.values())
    out: dict[str, object] = {
        "gpus": layout.gpus,
        "simulated_s": config.duration_s,
        "requests": trace.requests(),
        "elements_written": written,
        "elements_per_s": round(written / config.duration_s),
        "elements_per_s_per_gpu": round(written / config.duration_s / layout.gpus, 1),
        "elements_share": {name: round(n / written, 3) for name, n in elements.most_common()},
        "capacities": {},
    }
    for capacity in args.capacities:
        out["capacities"][str(capacity)] = {  # type: ignore[index]
            "seconds_of_traffic": round(capacity / max(written / config.duration_s, 1e-9), 1),
            **replay(trace.sessions, capacity),
        }
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
