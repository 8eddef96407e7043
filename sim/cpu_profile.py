"""A GpuProfile for one CPU worker of the local mesh, from the step times sim/calibrate.py fitted here.

What the simulator's engine needs, taken from the worker as the local mesh configures it: seats
(max_num_seqs), the step's token budget (max_num_batched_tokens), KV capacity in tokens (expressed as
the memory that leaves exactly that many tokens after the weights, in sim/engine_model.py's own
formula), and the preemption granularity: half a layer of a full-budget prompt step, as the H200
profile takes it (the engine's layer-level preemption points sit between layers).

The thermal model is neutral: a CPU does not throttle the way an NVML GPU does, and the fidelity run
sets the mesh's simulated telemetry to report a constant temperature as well (bench/sim_fidelity.py),
so neither side's placer reads heat. Power equals idle, so the temperature stays at inlet + R x idle
(30 C with the fleet's 25 C inlet), and the clock is never cut (min_clock_factor 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from services.worker.engine.policy.classes import PolicyConfig
from sim.fit import TERMS
from sim.profiles import GpuProfile, ModelCost, ThermalProfile

_VRAM_SHARE = 0.9  # GpuEngine leaves 10% for activations: the memory is sized up to cancel it
HALVED_CORE = 0.5  # an encoder beside a working decoder, where no serving fit measured its share

NEUTRAL_THERMAL = ThermalProfile(
    idle_w=50.0,
    tdp_w=50.0,
    decode_power_fraction=1.0,
    thermal_resistance_c_per_w=0.1,
    time_constant_s=30.0,
    slowdown_c=87.0,
    shutdown_c=92.0,
    hw_slowdown_margin_c=3.0,
    min_clock_factor=1.0,
    max_sm_clock_mhz=1.0,
)


def model_cost(name: str, fitted: Mapping[str, object], embedding: bool) -> ModelCost:
    """A served model's ModelCost from its calibration record."""
    coefficients = fitted["coefficients"]
    assert isinstance(coefficients, Mapping)
    load_s = float(fitted["load_s"])  # type: ignore[arg-type]
    return ModelCost(
        name=name,
        **{term: float(coefficients[term]) for term in TERMS},
        weight_bytes=int(fitted["weight_bytes"]),  # type: ignore[call-overload]
        kv_bytes_per_token=int(fitted["kv_bytes_per_token"]),  # type: ignore[call-overload]
        load_s=load_s,
        reload_s=load_s,  # loads are not simulated; the measured one stands for both
        embedding=embedding,
    )


def cpu_profile(calibration: Mapping[str, object], decoder: str, encoder: str | None) -> GpuProfile:
    """The profile of one CPU worker serving `decoder` (and `encoder`, if not None) as calibrated."""
    worker = calibration["worker"]
    fitted = calibration["models"]
    assert isinstance(worker, Mapping) and isinstance(fitted, Mapping)
    decoder_record = fitted[decoder]
    assert isinstance(decoder_record, Mapping)
    models = {decoder: model_cost(decoder, decoder_record, embedding=False)}
    if encoder is not None:
        models[encoder] = model_cost(encoder, fitted[encoder], embedding=True)
    chat = models[decoder]
    capacity = int(worker["kv_capacity_tokens"])
    weights = sum(m.weight_bytes for m in models.values())
    memory = math.ceil((capacity * chat.kv_bytes_per_token + weights + 1) / _VRAM_SHARE)
    budget = int(worker["max_num_batched_tokens"])
    full_step = chat.base_s + chat.prompt_s(0, budget)  # a full budget's prompt from position 0
    return GpuProfile(
        name=f"cpu-{decoder}",
        memory_bytes=memory,
        token_budget=budget,
        max_running=int(worker["max_num_seqs"]),
        # A record from before the calibration noted it has the worker's default, which it measured.
        block_tokens=int(worker.get("block_size", GpuProfile.block_tokens)),
        preempt_granularity_s=full_step / (2 * int(worker["num_layers"])),
        models=models,
        thermal=NEUTRAL_THERMAL,
        # The worker's encoder is a thread of its own, which the OS runs beside the decoder's at once, not
        # after a layer boundary, on the one core a worker gets: while the decoder works they share it.
        # The share is fitted with the serving step costs (sim/encoder_fit.py: 0.38-0.61 over fidelity
        # runs 23-26's traces); an offline calibration, which times encodes alone, takes the halved core.
        encoder_wait_s=0.0,
        encoder_core_share=encoder_core_share(fitted[encoder]) if encoder is not None else HALVED_CORE,
        # The engine's steps vary in size (its adaptive budget, decodes between prompts), so the wait for
        # a preemption point is half a layer of the step running, not of a full-budget one.
        layers=int(worker["num_layers"]),
        itl_min_efficiency=PolicyConfig().itl_min_efficiency,  # the worker's default policy
        # Fitted with the serving step costs (sim/serving_fit.py); an offline calibration, a process alone,
        # has none.
        host_slowdown_per_request=float(decoder_record.get("host_slowdown_per_request", 0.0)),
    )


def encoder_core_share(record: object) -> float:
    """An encoder's calibration record's share of the core beside a working decoder: the serving fit's
    where it measured one (sim/encoder_fit.py), else the halved core."""
    assert isinstance(record, Mapping)
    return float(record.get("encoder_core_share", HALVED_CORE))


def kv_capacity(profile: GpuProfile, decoder: str) -> int:
    """Tokens of KV the simulated engine will hold, by GpuEngine's formula (for checks)."""
    weights = sum(m.weight_bytes for m in profile.models.values())
    return int((profile.memory_bytes * _VRAM_SHARE - weights) / profile.models[decoder].kv_bytes_per_token)
