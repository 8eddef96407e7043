"""The simulated fleet's layout: GPUs in hosts in racks in zones, which models each serves, and how well
each is cooled.

Cooling is per rack (the inlet air) and per host (its fans). Figures: ASHRAE's recommended inlet range
is 18-27 C (class A1 allows up to 32 C); air that recirculates from a hot aisle raises a rack's inlet by
5-15 C; a failed fan in an HGX chassis leaves the others at full speed and the GPUs behind it 10-20 C
hotter under load, which we model as a higher thermal resistance. Which racks and hosts are affected is
drawn from the seed, the same for every policy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Cooling(enum.Enum):
    NONE = "none"  # every rack at the same inlet, every fan working
    MILD = "mild"
    SEVERE = "severe"


@dataclass(frozen=True)
class CoolingImbalance:
    inlet_spread_c: float  # standard deviation of rack inlets around the base
    hot_rack_fraction: float  # racks fed recirculated air
    hot_rack_extra_c: float
    failing_fan_fraction: float  # hosts with a failed fan
    failing_fan_resistance: float  # thermal resistance multiplier behind it


IMBALANCE = {
    Cooling.NONE: CoolingImbalance(0.0, 0.0, 0.0, 0.0, 1.0),
    Cooling.MILD: CoolingImbalance(1.0, 0.125, 5.0, 0.02, 1.25),
    Cooling.SEVERE: CoolingImbalance(1.5, 0.25, 10.0, 0.05, 1.5),
}
BASE_INLET_C = 25.0


@dataclass(frozen=True)
class FleetLayout:
    zones: int = 2
    hosts: int = 125
    gpus_per_host: int = 8
    hosts_per_rack: int = 4
    # Model sets per host, with the fraction of hosts serving each (all GPUs of a host alike).
    model_sets: tuple[tuple[tuple[str, ...], float], ...] = (
        (("llama-70b", "minilm"), 0.85),
        (("llama-8b", "minilm"), 0.15),
    )
    # Models every host keeps in host memory besides those it serves (pinned, for a reload over PCIe):
    # a fleet that moves GPUs between models. A request routed to one reloads it (every policy); the
    # replica planner (sim/planner.py) moves them ahead of requests.
    host_copies: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host


class Fleet:
    """Per-GPU labels and cooling, as arrays indexed by GPU."""

    def __init__(self, layout: FleetLayout, cooling: Cooling, base_resistance: float, seed: int) -> None:
        self.layout = layout
        rng = np.random.default_rng([seed, 1])
        n, per_host = layout.gpus, layout.gpus_per_host
        host = np.arange(n) // per_host
        rack = host // layout.hosts_per_rack
        racks = int(rack.max()) + 1
        # Racks fill zones in order, so a zone is a contiguous block of rows (an aisle or a hall).
        zone = rack * layout.zones // racks
        self.host, self.rack, self.zone = host, rack, zone
        self.node_ids = [f"gpu-{h}-{g % per_host}" for g, h in enumerate(host)]
        self.zone_names = [f"zone-{z}" for z in range(layout.zones)]
        self.zone_labels = [self.zone_names[z] for z in zone]
        self.rack_labels = [f"rack-{r}" for r in rack]
        self.host_labels = [f"host-{h}" for h in host]

        imbalance = IMBALANCE[cooling]
        rack_inlet = BASE_INLET_C + rng.normal(0.0, 1.0, racks) * imbalance.inlet_spread_c
        hot = rng.random(racks) < imbalance.hot_rack_fraction
        rack_inlet += hot * imbalance.hot_rack_extra_c
        failing = rng.random(layout.hosts) < imbalance.failing_fan_fraction
        self.inlet_c = rack_inlet[rack]
        self.resistance = base_resistance * np.where(failing[host], imbalance.failing_fan_resistance, 1.0)
        self.hot_racks = int(hot.sum())
        self.failing_fan_hosts = int(failing.sum())

        sets = [s for s, _ in layout.model_sets]
        shares = np.array([f for _, f in layout.model_sets])
        choice = rng.choice(len(sets), size=layout.hosts, p=shares / shares.sum())
        self.models: list[tuple[str, ...]] = [sets[choice[h]] for h in host]


@dataclass(frozen=True)
class NetworkCosts:
    """Round trip from a caller's gateway to a GPU: a few switch hops inside a zone (~0.1 ms each, typical
    of a leaf-spine data-centre fabric) and, across zones, the 1-2 ms that clouds quote between
    availability zones in one region."""

    hop_s: float = 0.0001
    hops_in_zone: int = 4
    cross_zone_s: float = 0.0015
    # What the serving stack adds to every request besides the wire: the gateway, its call to the placer,
    # the worker's RPC and tokenizing. 0 for the GPU fleet (not modelled there); the fidelity run
    # measures the local mesh's on its calibration trace (sim/serving_fit.py).
    request_overhead_s: float = 0.0

    def round_trip_s(self, same_zone: bool) -> float:
        wire = self.hop_s * self.hops_in_zone + (0.0 if same_zone else self.cross_zone_s)
        return wire + self.request_overhead_s
