"""A simulation's configuration: the fleet, the workload, the service levels, the routing options.

Plain frozen dataclasses in a module of their own, which stays interpreted when the hot modules are
compiled (sim/compiled.py): a comparison hands each policy's run its SimConfig through a process pool,
and mypyc's frozen dataclasses cannot be unpickled (mypyc issue 1213: unpickling assigns the fields
through the frozen __setattr__).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.workload import WorkloadClass
from services.placer.pick.scorers import ScorerConfig
from sim.fleet import Cooling, FleetLayout, NetworkCosts
from sim.profiles import H200, GpuProfile


@dataclass(frozen=True)
class ServiceLevel:
    """A request meets its class's SLO when its first token comes within ttft_s (None: not judged) and
    the rest at tpot_s per token at most, or, without those, when it completes within e2e_s."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


# Targets on a GPU: the mission's 200 ms to first token for chat; 100 ms per output token after it
# (faster than people read; MLPerf's Llama-2-70B server scenario allows 200 ms); agent steps a little
# more time to first token (their prompts carry the tools); embeddings 100 ms in all; batch only has
# to finish within ten minutes.
GPU_SLOS = {
    WorkloadClass.REALTIME_CHAT: ServiceLevel(ttft_s=0.2, tpot_s=0.1),
    WorkloadClass.AGENT_TOOL: ServiceLevel(ttft_s=0.3, tpot_s=0.1),
    WorkloadClass.EMBEDDING: ServiceLevel(e2e_s=0.1),
    WorkloadClass.BATCH: ServiceLevel(e2e_s=600.0),
}


@dataclass(frozen=True)
class WorkloadConfig:
    """Rates are new sessions per second per GPU of the fleet."""

    duration_s: float
    chat_rate: float = 0.06
    agent_rate: float = 0.03
    batch_rate: float = 0.75
    embedding_rate: float = 0.1
    diurnal_amplitude: float = 0.3
    burst_every_s: float = 600.0
    burst_length_s: float = 60.0
    burst_factor: float = 1.6
    chat_think_s: float = 20.0
    agent_tool_s: float = 1.5
    agent_tenants: int = 24
    batch_jobs: int = 4
    batch_prompt_median: int = 4000
    batch_output_median: int = 500


@dataclass(frozen=True)
class Models:
    chat: str = "llama-70b"
    batch: str = "llama-70b"
    agent: tuple[str, ...] = ("llama-70b", "llama-70b", "llama-8b")  # by tenant, cycled
    embedding: str = "minilm"


@dataclass(frozen=True)
class SimConfig:
    layout: FleetLayout
    workload: WorkloadConfig
    cooling: Cooling = Cooling.SEVERE
    profile: GpuProfile = H200
    network: NetworkCosts = field(default_factory=NetworkCosts)
    slos: dict[WorkloadClass, ServiceLevel] = field(default_factory=lambda: dict(GPU_SLOS))
    seed: int = 0
    caller_rack: str = ""  # the callers' rack (the local mesh's gateway shares one with a worker); "": none
    # Overrides of the placer's per-class weights for `ours`, as HANZO_PLACER_WEIGHTS_FILE holds them
    # ({"BATCH": {"thermal_headroom": 0.5}}); the baselines keep their own.
    class_weights: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # `ours` with the placer's replica planner (sim/planner.py) loading and evicting models; off, and
    # for the baselines always, every GPU keeps the models it starts with (as llm-d's model pools are
    # deployed). Off by default: in the default fleet it has nothing to move (docs/simulator.md).
    replica_planner: bool = False
    # The ours_reserve experiment's target: latency requests per reserved node (sim/latency_reserve.py).
    reserve_seats: float = 20.0
    # The share of nodes the placer's node_reserve scorer keeps for the latency classes, where
    # class_weights weigh it (HANZO_PLACER_NODE_RESERVE_FRACTION).
    node_reserve_fraction: float = ScorerConfig.node_reserve_fraction
