"""Building one served model: a streaming engine for a decoder, a batching encoder for an embedding model,
from its checkpoint or from the host copy kept when it was evicted, in the worker's arena if it has one."""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.config import EngineConfig
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.snapshot import EngineSnapshot
from services.worker.engine.step_log import StepLog, step_log_for
from services.worker.memory.errors import format_bytes
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from services.worker.models.config import load_model_config
from services.worker.models.config_types import EncoderConfig
from services.worker.models.dtype_choice import resolve_dtype
from services.worker.server.config import WorkerSettings

log = logging.getLogger(__name__)
_NO_ENGINE = EngineSnapshot()  # an encoder's: nothing queued or cached


class ModelKind(enum.StrEnum):
    """What a resident model serves (the kind the worker reports in heartbeats and ListModels)."""

    GENERATE = "generate"
    EMBED = "embed"


class WeightSource(enum.StrEnum):
    """Where a resident model's weights came from."""

    DISK = "disk"
    HOST_COPY = "host_copy"


@dataclass
class ServedModel:
    """One resident model. Exactly one of llm / embedder is set, as kind says. source: where its
    weights came from. in_flight_embeds: Embed calls running on it (decoders
    count theirs in AsyncLLM.num_in_flight)."""

    name: str
    kind: ModelKind
    weight_bytes: int
    source: WeightSource
    llm: AsyncLLM | None = None
    embedder: EmbeddingEngine | None = None
    in_flight_embeds: int = field(default=0)

    @property
    def snapshot(self) -> EngineSnapshot:
        """The decoder engine's state as of its last step (an encoder's: empty)."""
        return self.llm.snapshot if self.llm else _NO_ENGINE

    @property
    def running(self) -> int:
        return self.snapshot.running

    @property
    def waiting(self) -> int:
        return self.snapshot.waiting

    @property
    def in_flight(self) -> int:
        """Requests that an eviction now would cut off (counted on the event loop, so exact)."""
        return (self.llm.num_in_flight if self.llm else 0) + self.in_flight_embeds

    @property
    def kv_usage(self) -> float:
        return self.snapshot.kv_usage


def build_model(
    name: str, source: Path | HostCopy, settings: WorkerSettings, memory: MemoryManager | None
) -> ServedModel:
    """The served model `name` from a checkpoint directory or a host copy (then memory is required and
    nothing is read from disk). Blocks for as long as loading takes: call it off the event loop. Raises
    CheckpointError for a bad checkpoint, OutOfMemoryError when its partition does not fit the arena."""
    s = settings
    if isinstance(source, HostCopy):  # its weights are already in their dtype
        origin, config, dtype = (
            WeightSource.HOST_COPY,
            source.config,
            str(source.dtype).removeprefix("torch."),
        )
    else:
        origin, config = WeightSource.DISK, load_model_config(source)
        dtype = resolve_dtype(s.dtype, s.device, config)
    if isinstance(config, EncoderConfig):
        embedder = EmbeddingEngine(
            source, dtype=dtype, device=s.device, memory=memory, model_name=name, step_log=_step_log(s, name)
        )
        return ServedModel(name, ModelKind.EMBED, embedder.weight_bytes, origin, embedder=embedder)
    engine_config = EngineConfig(
        dtype=dtype,
        device=s.device,
        kv_cache_bytes=s.kv_cache_bytes,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_model_len=s.max_model_len,
        policy=s.policy_config(),
    )
    engine = LLMEngine(source, engine_config, memory=memory, model_name=name)
    layout = engine.layout
    log.info(
        "%s: %s, KV pool %s = %d tokens (%d blocks of %d), context %d tokens, %d seats",
        name, dtype, format_bytes(layout.kv_cache_bytes), layout.num_kv_blocks * layout.block_size,
        layout.num_kv_blocks, layout.block_size, layout.max_model_len, s.max_num_seqs,
    )  # fmt: skip
    weight_bytes = engine.partition.weight_bytes if engine.partition else _module_bytes(engine.runner.model)
    llm = AsyncLLM(engine, _step_log(s, name))
    return ServedModel(name, ModelKind.GENERATE, weight_bytes, origin, llm=llm)


def _step_log(settings: WorkerSettings, name: str) -> StepLog | None:
    """name's step log in this worker (one file per process and model), if settings ask for one."""
    return step_log_for(settings.step_log_dir, name, f"worker-{os.getpid()}")


def _module_bytes(model: torch.nn.Module) -> int:
    params = {id(p): p for p in model.parameters()}  # tied weights once
    return sum(p.numel() * p.element_size() for p in params.values())
