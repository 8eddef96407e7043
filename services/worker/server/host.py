"""The models one worker serves: a streaming engine per decoder, a batching encoder per embedding model."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.config import EngineConfig
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.llm_engine import LLMEngine
from services.worker.models.config import EncoderConfig, load_model_config
from services.worker.server.config import WorkerSettings

log = logging.getLogger(__name__)

GENERATE = "generate"
EMBED = "embed"


@dataclass
class ServedModel:
    """One resident model. Exactly one of llm / embedder is set, as kind says."""

    name: str
    kind: str
    weight_bytes: int
    llm: AsyncLLM | None = None
    embedder: EmbeddingEngine | None = None

    @property
    def running(self) -> int:
        return self.llm.engine.scheduler.num_running if self.llm else 0

    @property
    def waiting(self) -> int:
        return self.llm.engine.scheduler.num_waiting if self.llm else 0

    @property
    def kv_usage(self) -> float:
        return self.llm.engine.block_manager.usage if self.llm else 0.0


class ModelHost:
    """Loads models from the worker's catalog and hands out the one a request names."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.models: dict[str, ServedModel] = {}
        self._lock = asyncio.Lock()  # one load/evict at a time: they change what is resident

    @property
    def catalog(self) -> dict[str, Path]:
        return self.settings.models

    async def load(self, name: str) -> tuple[ServedModel, float]:
        """Make `name` resident (no-op if it is); returns it and the seconds loading took."""
        if not name:
            raise InvalidArgument("model", "is empty; name a model from this worker's catalog")
        async with self._lock:
            if name in self.models:
                return self.models[name], 0.0
            path = self.catalog.get(name)
            if path is None:
                known = ", ".join(sorted(self.catalog)) or "none"
                raise NotFound(f"model {name!r} is not in this worker's catalog (it has: {known})")
            start = time.monotonic()
            # Reading weights and building the engine block for seconds: keep them off the event loop.
            served = await asyncio.to_thread(self._build, name, path)
            if served.llm is not None:
                served.llm.start()
            self.models[name] = served
            took = time.monotonic() - start
            log.info(
                "loaded %s (%s, %.1f MiB) in %.2f s", name, served.kind, served.weight_bytes / 2**20, took
            )
            return served, took

    async def evict(self, name: str, force: bool) -> int:
        """Free `name`; with force, abort its requests, else refuse while any runs. Returns aborted count."""
        if not name:
            raise InvalidArgument("model", "is empty; name a resident model")
        async with self._lock:
            served = self.models.get(name)
            if served is None:
                raise NotFound(f"model {name!r} is not resident on this worker")
            busy = served.running + served.waiting
            if busy and not force:
                raise ResourceExhausted(
                    f"model {name!r} has {busy} requests in flight; evict with force=true"
                )
            del self.models[name]
            if served.llm is not None:
                await served.llm.shutdown()
            if served.embedder is not None:
                await asyncio.to_thread(served.embedder.close)
            return busy

    def generator(self, name: str) -> AsyncLLM:
        """The streaming engine of a resident decoder; NotFound / InvalidArgument otherwise."""
        served = self._resident(name)
        if served.llm is None:
            raise InvalidArgument("model", f"{name!r} is an embedding model; call Embed")
        return served.llm

    def embedder(self, name: str) -> EmbeddingEngine:
        """The encoder of a resident embedding model; NotFound / InvalidArgument otherwise."""
        served = self._resident(name)
        if served.embedder is None:
            raise InvalidArgument("model", f"{name!r} generates text; call Generate")
        return served.embedder

    async def close(self) -> None:
        for name in list(self.models):
            await self.evict(name, force=True)

    def _resident(self, name: str) -> ServedModel:
        if not name:
            raise InvalidArgument("model", "is empty; name the model to serve")
        served = self.models.get(name)
        if served is None:
            raise NotFound(f"model {name!r} is not resident on this worker")
        return served

    def _build(self, name: str, path: Path) -> ServedModel:
        s = self.settings
        if isinstance(load_model_config(path), EncoderConfig):
            embedder = EmbeddingEngine(path, dtype=s.dtype, device=s.device)
            return ServedModel(name, EMBED, _weight_bytes(embedder.model), embedder=embedder)
        engine = LLMEngine(
            path,
            EngineConfig(
                dtype=s.dtype,
                device=s.device,
                kv_cache_bytes=s.kv_cache_bytes,
                max_num_seqs=s.max_num_seqs,
                max_num_batched_tokens=s.max_num_batched_tokens,
                policy=s.policy_config(),
            ),
        )
        return ServedModel(name, GENERATE, _weight_bytes(engine.runner.model), llm=AsyncLLM(engine))


def _weight_bytes(model: object) -> int:
    params = {id(p): p for p in model.parameters()}  # type: ignore[attr-defined]  # tied weights once
    return sum(p.numel() * p.element_size() for p in params.values())
