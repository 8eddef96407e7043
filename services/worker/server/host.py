"""The models one worker serves, in the arena it reserved at start: load (from disk, or from the host copy
kept at eviction), evict, least-recently-used eviction when a load needs room, and the lookups requests
make (which mark a model as used)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.kv_cache import KVPoolTooSmallError
from services.worker.engine.kv_repartition import take_kv_if_short
from services.worker.memory.arena import Arena
from services.worker.memory.errors import KVTransferError, ModelBusyError, OutOfMemoryError, format_bytes
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from services.worker.models.catalog import resolve_model_source
from services.worker.models.config_types import EncoderConfig
from services.worker.server.config import WorkerSettings
from services.worker.server.model_builder import ModelKind, ServedModel, build_model

__all__ = ["ModelHost", "ModelKind", "ServedModel"]

log = logging.getLogger(__name__)


class ModelHost:
    """Loads models from the worker's catalog into its arena and hands out the one a request names.

    memory is None only when the worker runs without an arena (HANZO_WORKER_ARENA_BYTES=0 on CPU):
    then each model allocates its own memory, and nothing is evicted to make room.
    """

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.models: dict[str, ServedModel] = {}
        self.memory = _reserve_arena(settings)
        # Weights of evicted models, least recently evicted first: a reload is one bulk copy.
        self.host_copies: OrderedDict[str, HostCopy] = OrderedDict()
        self.evictions: dict[str, int] = {"request": 0, "lru": 0}
        self.kv_bytes_moved = 0  # by rebalance_kv, since start
        self._lock = asyncio.Lock()  # one load/evict at a time: they change what is resident

    @property
    def catalog(self) -> dict[str, Path]:
        return self.settings.models

    async def load(self, name: str, make_room: bool = True) -> tuple[ServedModel, float]:
        """Make `name` resident (no-op if it is); returns it and the seconds loading took. When the arena
        lacks room and make_room, the least recently used idle models are evicted first (their weights
        kept on the host); ResourceExhausted if it cannot fit even then (or at all, without make_room).
        CheckpointError for a bad checkpoint. Resident models keep serving throughout."""
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
            served = await self._build_making_room(name, path, make_room)
            self.host_copies.pop(name, None)  # resident again: the copy would only go stale
            if served.llm is not None:
                served.llm.start()
            self.models[name] = served
            took = time.monotonic() - start
            log.info(
                "loaded %s (%s, %s) from %s in %.3f s",
                name, served.kind, format_bytes(served.weight_bytes), served.source, took,
            )  # fmt: skip
            return served, took

    async def evict(self, name: str, force: bool) -> int:
        """Free `name`, keeping its weights on the host (settings.keep_host_copies); with force, abort its
        requests, else refuse while any runs. Returns the number of requests aborted."""
        if not name:
            raise InvalidArgument("model", "is empty; name a resident model")
        async with self._lock:
            if name not in self.models:
                raise NotFound(f"model {name!r} is not resident on this worker")
            aborted = await self._evict_locked(name, force)
            self.evictions["request"] += 1
            return aborted

    async def rebalance_kv(self) -> int:
        """KV repartitioning: each decoder short of KV blocks (its unfinished requests want more than
        its pool holds) takes them from idle decoders, least recently used first, each keeping at least
        settings.kv_donor_min_blocks; nothing is reloaded. Returns the bytes moved (0 without an arena)."""
        if self.memory is None:
            return 0
        async with self._lock:
            decoders = {name: s.llm for name, s in self.models.items() if s.llm is not None}
            moved = 0
            for name, taker in decoders.items():
                busy = {n for n, s in self.models.items() if s.in_flight} | {name}
                for donor_name in self.memory.eviction_candidates(busy):  # idle ones, LRU first
                    donor = decoders.get(donor_name)
                    if donor is None:
                        continue  # an encoder: no KV pool
                    floor = self.settings.kv_donor_min_blocks
                    try:
                        nbytes = await take_kv_if_short(donor, taker, min_donor_blocks=floor)
                    except (ModelBusyError, KVPoolTooSmallError, KVTransferError, OutOfMemoryError) as exc:
                        log.info("no KV moved from %s to %s: %s", donor_name, name, exc)  # it got busy
                        continue
                    if nbytes:
                        moved += nbytes
                        self.kv_bytes_moved += nbytes
                        log.info("moved %s of KV from idle %s to %s", format_bytes(nbytes), donor_name, name)
            return moved

    async def reload_if_evicted(self, name: str) -> None:
        """A request names a model evicted with its weights kept on the host: reload it first (one bulk
        copy; idle models make room if needed, ResourceExhausted if none can). The placer routes a
        request to such a node (a host copy counts as loadable there), so the worker must honour it.
        Requests for the same model wait on the one load. Anything else is left to generator /
        embedding (resident: served; unknown: NotFound)."""
        if name in self.models or name not in self.host_copies or name not in self.catalog:
            return
        _, took = await self.load(name)
        if took:
            log.info("reloaded %s from its host copy for a request (%.3f s)", name, took)

    def generator(self, name: str) -> AsyncLLM:
        """The streaming engine of a resident decoder, marked as just used; NotFound / InvalidArgument
        otherwise."""
        served = self._resident(name)
        if served.llm is None:
            raise InvalidArgument("model", f"{name!r} is an embedding model; call Embed")
        return served.llm

    @contextlib.contextmanager
    def embedding(self, name: str) -> Iterator[EmbeddingEngine]:
        """The encoder of a resident embedding model, counted in flight while the block runs (so LRU
        eviction passes it over); NotFound / InvalidArgument otherwise."""
        served = self._resident(name)
        if served.embedder is None:
            raise InvalidArgument("model", f"{name!r} generates text; call Generate")
        served.in_flight_embeds += 1
        try:
            yield served.embedder
        finally:
            served.in_flight_embeds -= 1

    async def close(self) -> None:
        """Evict every model (aborting what runs) and give the arena and host copies back at once, not
        whenever the garbage collector gets to a cycle that holds them."""
        for name in list(self.models):
            await self.evict(name, force=True)
        self.host_copies.clear()
        self.memory = None

    @staticmethod
    def kind_of(copy: HostCopy) -> ModelKind:
        """What the model a host copy holds would serve once reloaded."""
        return ModelKind.EMBED if isinstance(copy.config, EncoderConfig) else ModelKind.GENERATE

    def _resident(self, name: str) -> ServedModel:
        if not name:
            raise InvalidArgument("model", "is empty; name the model to serve")
        served = self.models.get(name)
        if served is None:
            hint = " (evicted; LoadModel brings it back from host memory)" if name in self.host_copies else ""
            raise NotFound(f"model {name!r} is not resident on this worker{hint}")
        if self.memory is not None:
            self.memory.touch(name)
        return served

    async def _build_making_room(self, name: str, path: Path, make_room: bool) -> ServedModel:
        """Build from the host copy if there is one, else from disk; on OutOfMemoryError (and make_room)
        evict the fewest least-recently-used idle models that make room, none if even all of them would
        not, and retry."""
        # A named model ("smollm2") is the checkpoint its package installed; CheckpointError if absent.
        source: Path | HostCopy = self.host_copies.get(name) or resolve_model_source(path)
        try:
            # Reading weights and building the engine block for seconds: keep them off the event loop.
            return await asyncio.to_thread(build_model, name, source, self.settings, self.memory)
        except OutOfMemoryError as oom:
            if self.memory is None or oom.weight_bytes is None or oom.kv_bytes is None:
                raise
            if not make_room:
                raise ResourceExhausted(f"model {name!r} does not fit the arena now: {oom}") from None
            busy = set() if self.settings.evict_busy else {m for m, s in self.models.items() if s.in_flight}
            plan = self.memory.eviction_plan(oom.weight_bytes, oom.kv_bytes, busy)
            if plan is None:
                held = ", ".join(f"{m} ({'busy' if m in busy else 'idle'})" for m in self.models) or "none"
                raise ResourceExhausted(
                    f"model {name!r} needs {format_bytes(oom.needed)} of the worker's "
                    f"{format_bytes(self.memory.arena.total_bytes)} arena and does not fit even after "
                    f"evicting every idle model (resident: {held}); {oom}"
                ) from None
            for victim in plan:
                log.info("evicting %s (least recently used) to make room for %s", victim, name)
                await self._evict_locked(victim, force=self.settings.evict_busy)
                self.evictions["lru"] += 1
            return await asyncio.to_thread(build_model, name, source, self.settings, self.memory)

    async def _evict_locked(self, name: str, force: bool) -> int:
        served = self.models[name]
        busy = served.in_flight
        if busy and not force:
            raise ResourceExhausted(f"model {name!r} has {busy} requests in flight; evict with force=true")
        del self.models[name]  # new requests get NOT_FOUND from here on
        host: HostCopy | None = None
        keep = self.settings.keep_host_copies
        if served.llm is not None:
            await served.llm.shutdown()  # aborts what is in flight and joins the engine thread
            if self.memory is not None:
                host = served.llm.engine.evict(abort_running=True, keep_host_copy=keep)
        elif served.embedder is not None:
            if self.memory is not None:
                host = await asyncio.to_thread(served.embedder.evict, keep_host_copy=keep)
            else:
                await asyncio.to_thread(served.embedder.close)
        if host is not None:
            self.host_copies[name] = host
            self._trim_host_copies()
        return busy

    def _trim_host_copies(self) -> None:
        """Drop the oldest host copies beyond settings.host_copy_bytes (None: keep every copy)."""
        budget = self.settings.host_copy_bytes
        if budget is None:
            return
        while self.host_copies and sum(c.nbytes for c in self.host_copies.values()) > budget:
            dropped, _ = self.host_copies.popitem(last=False)
            log.info("dropped the host copy of %s: over the %s budget", dropped, format_bytes(budget))


def _reserve_arena(settings: WorkerSettings) -> MemoryManager | None:
    """The worker's one arena: settings.arena_fraction of the GPU's total memory, or arena_bytes; None
    when arena_bytes is 0 (no arena)."""
    fraction, byte_budget = settings.arena_size()
    if fraction is None and byte_budget is None:
        return None
    arena = Arena.for_device(settings.device, fraction, byte_budget)
    log.info("reserved a %s arena on %s", format_bytes(arena.total_bytes), arena.device)
    return MemoryManager(arena)
