"""prefix_load (sim/policies.py's _PrefixLoad, which ranks without scoring every row) takes the same node
as its definition, prefix_load_picker (the placer's Picker with llm-d's queue and prefix-cache scorers),
on every pick: over a churning fleet with exclusions, prefixes, ties and nodes coming and going, and
through a whole simulated run."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from services.placer.cluster.state import ClusterState
from services.placer.pick.query import PickQuery
from sim.config import SimConfig, WorkloadConfig
from sim.fleet import FleetLayout
from sim.policies import Choice, prefix_load, prefix_load_picker
from sim.prefix_load_native import PrefixLoadRanking
from sim.sharegpt import conversations
from sim.simulation import Simulation
from tests.placer.pick.churn import CLASSES, random_spec, random_write
from tests.placer.pick.helpers import MODEL, NOW, query, snapshot_of


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("writes_per_pick", [0, 1, 3])
def test_the_same_node_as_the_picker_over_a_churning_fleet(writes_per_pick: int, compiled: bool) -> None:
    rng = np.random.default_rng(11 + writes_per_pick)
    ids = [f"n{i}" for i in range(12)]
    state = ClusterState(clock=lambda: NOW)
    state.snapshot = snapshot_of(*({"id": i, **random_spec(rng, k)} for k, i in enumerate(ids)))
    if compiled:
        assert PrefixLoadRanking.create(2.0, 3.0, 1e-9) is not None, "the C ranking did not build"
    fast, reference = prefix_load(3, compiled=compiled), prefix_load_picker(3)
    outcomes: Counter[str] = Counter()
    for step in range(600):
        for w in range(writes_per_pick):
            random_write(state.snapshot, rng, step * writes_per_pick + w, ids)
        chain = (1 + step % 29, 10 + step % 7, 100 + step % 3)[: step % 4]
        q = query(
            CLASSES[step % 3], model=[MODEL, "qwen-7b", "never-reported"][step % 11 % 3],
            now_s=NOW + step / 20, prefix_chain=chain, prompt_tokens=128 * len(chain) + step % 5 * 300,
            exclude=frozenset({ids[step % len(ids)], "gone"}) if step % 4 == 0 else frozenset(),
        )  # fmt: skip
        chosen = fast(state, q)
        assert chosen == reference(state, q), f"step {step}"
        if chosen is None:
            outcomes["none"] += 1
        else:  # a node llm-d's index holds some of the prompt on, or one its queue score put first
            outcomes["held" if chosen.cached_tokens else "elsewhere" if chain else "no chain"] += 1
    # every outcome was compared
    assert outcomes["held"] > 100 and outcomes["elsewhere"] > 10 and outcomes["none"] > 10, outcomes


def test_the_same_node_as_the_picker_on_every_pick_of_a_run() -> None:
    """A run where prefixes repeat, queues differ and many nodes wait alike (drawn among)."""
    layout = FleetLayout(hosts=4, hosts_per_rack=2, model_sets=((("llama-70b", "llama-8b", "minilm"), 1.0),))
    sim = Simulation(SimConfig(layout, WorkloadConfig(duration_s=60.0)), "prefix_load", conversations(300))
    reference = prefix_load_picker(0, sim.kv_blocks)
    in_numpy = prefix_load(0, sim.kv_blocks, compiled=False)
    choose = sim.choose
    picks = 0

    def both(state: ClusterState, q: PickQuery) -> Choice | None:
        nonlocal picks
        chosen = choose(state, q)
        assert chosen == reference(state, q) == in_numpy(state, q), f"pick {picks}"
        picks += 1
        return chosen

    sim.choose = both
    sim.run()
    assert picks > 1000
    assert sim.summary()["prefix_hits"] > 100  # the prefix index decided some of them
