"""llm-d's approximate prefix index over prefix chains (sim/llm_d_prefix.py): what a server scores is the
share of the prompt's blocks it was sent, walked from the first block, at most 256 blocks, and each
server forgets its least recent blocks past its KV size. Every match here is also walked in C
(sim/csrc/prefix_load.c, what prefix + load's compiled pick reads), which must find the same."""

from __future__ import annotations

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick.query import PickQuery
from sim.llm_d_prefix import LlmDPrefixIndex
from sim.prefix_load_native import PrefixLoadRanking
from tests.placer.pick.helpers import node, snapshot_of

_COMPILED = PrefixLoadRanking.create(2.0, 3.0, 1e-9)


def turn(chain: tuple[int, ...], ends: tuple[int, ...], prompt: int) -> PickQuery:
    return PickQuery(
        model="m", workload_class=WorkloadClass.REALTIME_CHAT, prefix_chain=chain,
        prefix_chain_tokens=ends, prompt_tokens=prompt,
    )  # fmt: skip


def fleet() -> ClusterSnapshot:
    return snapshot_of({"id": "a"}, {"id": "b"}, {"id": "c"})


def match(
    index: LlmDPrefixIndex, q: PickQuery, snapshot: ClusterSnapshot | None = None
) -> tuple[dict[str, int], int]:
    """({server: blocks of the prompt it holds}, the prompt's blocks), over the fleet's servers; the
    compiled walk must find the same."""
    snapshot = snapshot or fleet()
    held, total = index.held(snapshot, q), index.match(snapshot, q)[2]
    assert _compiled_match(index, q, snapshot) == (held, total)
    return held, total


def _compiled_match(
    index: LlmDPrefixIndex, q: PickQuery, snapshot: ClusterSnapshot
) -> tuple[dict[str, int], int]:
    """match() as the compiled walk finds it."""
    assert _COMPILED is not None, "the C ranking did not build"
    total, chain = index.chain(snapshot, q)
    rows = _COMPILED.match(snapshot.capacity, chain)
    return {str(snapshot.node_ids[row]): held for row, held in rows.items()}, total


def test_a_conversation_scores_the_share_of_its_prompt_a_server_was_sent() -> None:
    index = LlmDPrefixIndex()
    index.add(turn((7,), (0,), 1000), "a")  # first turn: 62 whole blocks of 16 tokens
    index.add(turn((7,), (0,), 1000), "b")
    index.add(turn((7,), (1000,), 1600), "a")  # second turn on a only
    # Third turn: its prompt extends the second's (1,600 tokens); b was sent the first turn's 1,000.
    assert match(index, turn((7,), (1600,), 2400)) == ({"a": 100, "b": 62}, 150)


def test_long_prompts_are_matched_on_their_first_256_blocks_only() -> None:
    index = LlmDPrefixIndex()
    index.add(turn((7,), (0,), 8000), "a")
    assert match(index, turn((7,), (8000,), 12000)) == ({"a": 256}, 256)  # a whole match: score 1


def test_the_walk_ends_where_no_server_holds_the_next_block() -> None:
    index = LlmDPrefixIndex()
    tools, session = 3, 9
    index.add(turn((tools, 5), (1600, 1600), 2000), "b")  # another session of the tenant
    index.add(turn((tools, session), (1600, 1600), 2000), "a")
    index.add(turn((tools, session), (1600, 2000), 2600), "a")
    matched, total = match(index, turn((tools, session), (1600, 2600), 3000))
    assert (matched, total) == ({"a": 162, "b": 100}, 187)  # b holds the tools only
    index2 = LlmDPrefixIndex()
    index2.add(turn((5,), (0,), 400), "c")  # a session that did not open with these tools
    assert match(index2, turn((tools, 5), (1600, 2000), 2600)) == ({}, 162)  # its first block is nobody's
    assert match(index, turn((7,), (0,), 10)) == ({}, 0)  # no whole block: nothing to score


def test_a_batch_job_shares_only_its_instruction_across_documents() -> None:
    index = LlmDPrefixIndex()
    job = 12
    index.add(turn((job,), (300,), 2300), "a")
    index.add(turn((job,), (300,), 900), "b")
    index.add(turn((job,), (300,), 5000), "a")
    assert match(index, turn((job,), (300,), 1500)) == ({"a": 18, "b": 18}, 93)


def test_a_server_forgets_its_least_recent_blocks_past_its_kv_size() -> None:
    asked: list[str] = []

    def kv_blocks(server: str) -> int:
        asked.append(server)
        return 200

    index = LlmDPrefixIndex(kv_blocks)
    job, chat = 12, 7
    index.add(turn((chat,), (0,), 800), "a")  # 50 blocks
    index.add(turn((job,), (300,), 1600), "a")  # 100 blocks: 150 held
    assert asked == ["a", "a"]
    assert set(match(index, turn((chat,), (800,), 900))[0]) == {"a"}
    # The next document of the job: the first one's own 82 blocks stay, orphaned, beside this one's 100.
    index.add(turn((job,), (300,), 1600), "a")
    assert match(index, turn((chat,), (800,), 900)) == ({}, 56)  # 232 > 200: the chat turn was forgotten
    assert match(index, turn((job,), (300,), 1000)) == ({"a": 18}, 62)
    for _ in range(3):  # each document's own blocks push the older ones out, never the job's
        index.add(turn((job,), (300,), 1600), "a")
    assert match(index, turn((job,), (300,), 1000)) == ({"a": 18}, 62)
    index.add(turn((chat,), (0,), 3000), "a")  # 187 blocks: the job's and the last orphan's go
    assert match(index, turn((job,), (300,), 1000)) == ({}, 62)
    assert match(index, turn((chat,), (3000,), 3100)) == ({"a": 187}, 193)


def test_servers_outside_the_fleet_are_not_scored_and_rows_follow_the_fleet() -> None:
    index = LlmDPrefixIndex()
    snapshot = fleet()
    index.add(turn((7,), (0,), 1000), "a")
    index.add(turn((7,), (0,), 1000), "gone")  # a server the fleet does not have
    index.add(turn((7,), (0,), 1000), "c")
    follow_up = turn((7,), (1000,), 1600)
    assert match(index, follow_up, snapshot) == ({"a": 62, "c": 62}, 100)
    snapshot.remove("a")
    snapshot.upsert(node("gone"))  # takes a's row
    assert match(index, follow_up, snapshot) == ({"gone": 62, "c": 62}, 100)


def test_the_compiled_walk_matches_as_numpy_does_over_a_random_history() -> None:
    """Shared tools and conversations extended or parted from, servers forgetting (small KV), servers
    outside the fleet, prompts ending inside an element: every query's match, in numpy and in C."""
    rng = np.random.default_rng(5)
    servers = [f"s{i}" for i in range(9)]
    snapshot = snapshot_of(*({"id": s} for s in servers[:7]))  # s7 and s8 are not in the fleet
    index = LlmDPrefixIndex(lambda server: 150 + 40 * int(server[1:]))
    compared = matched = 0
    for step in range(800):
        tools = int(rng.integers(1, 4))
        depth = int(rng.integers(0, 4))
        chain = (tools, *(10 * tools + int(rng.integers(0, 3)) + 100 * d for d in range(1, depth + 1)))
        ends = np.cumsum(rng.integers(0, 900, size=len(chain))).tolist()
        q = turn(chain, tuple(ends), ends[-1] + int(rng.integers(0, 1200)))
        if step % 3:
            index.add(q, servers[int(rng.integers(len(servers)))])
        else:
            numpy_held, total = index.held(snapshot, q), index.match(snapshot, q)[2]
            assert _compiled_match(index, q, snapshot) == (numpy_held, total), f"step {step}"
            compared += 1
            matched += bool(numpy_held)
    assert compared > 250 and matched > 100
