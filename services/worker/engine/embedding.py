"""Embedding engine: BERT-family encoder with concurrent `encode` calls batched into shared forwards.

Callers (threads or coroutines) submit texts; one batching thread drains everything submitted so far,
sorts it by length so padding stays small, runs forwards of at most max_batch_tokens padded tokens and
hands each caller its rows. Built with a MemoryManager, the encoder's weights are views of a partition of
the arena (a weights slot, no KV pool), which evict() gives back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from services.worker.engine.errors import EngineDeadError, InvalidRequestError
from services.worker.engine.model_placement import place_model
from services.worker.engine.step_log import StepLog
from services.worker.memory.errors import ModelEvictedError
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition
from services.worker.memory.placement import (
    evict_to_host,
    module_tensor_specs,
)
from services.worker.models.config_types import DecoderConfig, EncoderConfig


@dataclass
class _Job:
    token_ids: list[list[int]]
    done: concurrent.futures.Future[np.ndarray]


class EmbeddingEngine:
    """encode(texts) -> float32 [N, D]; safe to call from many threads at once."""

    def __init__(
        self,
        model_dir: str | Path | HostCopy,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_tokens: int = 8192,
        memory: MemoryManager | None = None,
        model_name: str | None = None,
        step_log: StepLog | None = None,
    ) -> None:
        """model_dir: an encoder checkpoint directory, or the HostCopy an earlier engine's evict() returned
        (then memory is required, dtype must be the copy's, and nothing is read from disk).
        memory: None loads the weights on their own. A MemoryManager builds the encoder in a new partition
        of its arena named model_name (None: the directory's name, or the name the copy was evicted
        under), with no KV pool; device must be the arena's. InvalidRequestError for a decoder,
        ModelAlreadyResidentError / OutOfMemoryError from the arena (nothing reserved then).
        step_log: where the batching thread records each batch's tokens and time (step_log.py)."""
        self._step_log = step_log
        self.device = torch.device(device)
        self.max_batch_tokens = max_batch_tokens
        self.memory = memory
        placement = place_model(
            model_dir, _encoder_config, dtype=dtype, device=self.device, memory=memory, model_name=model_name
        )
        self.model_name, self._placed = placement.name, placement.placed
        # None: not in an arena, or evicted.
        self.partition: Partition | None = self._placed.partition if self._placed else None
        loaded = placement.loaded
        self.config: EncoderConfig = placement.config
        assert loaded.tokenizer is not None  # the loader requires one for encoders; a host copy keeps it
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.dim = self.config.hidden_size
        self.num_batches = 0  # forwards run; with concurrent callers fewer than calls (tests read it)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Held while deciding whether a job may still be queued, so that none lands behind the stop
        # sentinel (where the batching thread would never serve it and its caller would wait forever).
        self._accepting = threading.Lock()
        self._closed = False
        self._evicted = False
        self._thread = threading.Thread(target=self._run, name="embedding-batcher", daemon=True)
        self._thread.start()

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights hold: in an arena the partition's weights slot (aligned, tensor padding
        included), else the distinct parameters and buffers; 0 once evicted."""
        if self._evicted:
            return 0
        if self.partition is not None:
            return self.partition.weight_bytes
        return sum(spec.nbytes for spec in module_tensor_specs(self.model))

    def close(self) -> None:
        """Stop the batching thread after the work already submitted; later submits raise EngineDeadError.
        An arena partition stays held: evict() gives it back. Idempotent."""
        self._stop()

    def evict(self, *, keep_host_copy: bool = True) -> HostCopy | None:
        """Give the encoder's partition back to the arena: stop accepting work (submit then raises
        ModelEvictedError), let the jobs already submitted finish (blocks until they have: their
        forwards read the bytes being released), stop the batching thread, then release the partition,
        first copying the weights to host memory (pinned on CUDA) when keep_host_copy. Returns that
        HostCopy, to rebuild with EmbeddingEngine(host_copy, memory=...), or None. ValueError for an
        engine not in an arena; ModelEvictedError if already evicted."""
        with self._accepting:  # checked and set together: of two concurrent evicts, one releases
            if self._evicted:
                raise ModelEvictedError(self.model_name or "")
            if self.memory is None or self._placed is None:
                raise ValueError("only an engine built in an arena (memory=...) can be evicted")
            self._evicted = True
        self._stop()
        host = evict_to_host(self.memory, self._placed, keep_host_copy=keep_host_copy)
        self.partition = None
        self._placed = None
        return host

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings float32 [len(texts), dim], in input order; InvalidRequestError on bad input."""
        return self.submit(texts).result()

    async def encode_async(self, texts: list[str]) -> np.ndarray:
        """encode() for the event loop: waits without blocking it."""
        return await asyncio.wrap_future(self.submit(texts))

    async def encode_with_usage(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """(embeddings [N, dim], input tokens counted after truncation), without blocking the loop."""
        future, num_tokens = self._submit(texts)
        return await asyncio.wrap_future(future), num_tokens

    def submit(self, texts: list[str]) -> concurrent.futures.Future[np.ndarray]:
        """Queue texts for the next batch; the future resolves to their embeddings."""
        return self._submit(texts)[0]

    def _submit(self, texts: list[str]) -> tuple[concurrent.futures.Future[np.ndarray], int]:
        self._check_accepting()
        token_ids = self._tokenize(texts)  # outside the lock: tokenizing a large batch takes a while
        job = _Job(token_ids, concurrent.futures.Future())
        with self._accepting:
            self._check_accepting()  # evict() or close() may have run while we tokenized
            self._jobs.put(job)
        return job.done, sum(len(ids) for ids in token_ids)

    def _check_accepting(self) -> None:
        if self._evicted:
            raise ModelEvictedError(self.model_name or "")
        if self._closed or not self._thread.is_alive():
            raise EngineDeadError("embedding engine is closed")

    def _stop(self) -> None:
        """Refuse new jobs, then wait for the batching thread to serve the queued ones and exit."""
        with self._accepting:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        self._thread.join()
        if self._step_log is not None:
            self._step_log.close()

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if isinstance(texts, str) or not isinstance(texts, list | tuple):
            raise InvalidRequestError("inputs", "must be a list of strings")
        if not texts:
            raise InvalidRequestError("inputs", "is empty; send at least one text")
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise InvalidRequestError(f"inputs[{i}]", "must be a non-empty string")
        limit = self.config.max_seq_length
        # Truncation, not an error: sentence-transformers truncates to max_seq_length, and clients expect it.
        return self.tokenizer.encode_batch(texts, max_length=limit)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs = [job]
            stop = False
            while True:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.append(more)
            self._serve(jobs)
            if stop:
                return

    def _serve(self, jobs: list[_Job]) -> None:
        try:
            rows = [ids for job in jobs for ids in job.token_ids]
            started, forwards = time.perf_counter(), self.num_batches
            vectors = self._embed(rows)
            if self._step_log is not None:
                seconds = time.perf_counter() - started
                tokens = sum(len(r) for r in rows)
                self._step_log.write(
                    {"batches": self.num_batches - forwards, "rows": 0, "context": 0, "prefill": tokens,
                     "attention": 0, "inputs": len(rows), "seconds": seconds, "execute_s": seconds}
                )  # fmt: skip
        except Exception as exc:  # a failed forward fails these callers, not the engine
            for job in jobs:
                job.done.set_exception(exc)
            return
        start = 0
        for job in jobs:
            end = start + len(job.token_ids)
            job.done.set_result(vectors[start:end])
            start = end

    @torch.inference_mode()
    def _embed(self, rows: list[list[int]]) -> np.ndarray:
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        pad = self.config.pad_token_id
        i = 0
        while i < len(order):
            longest = len(rows[order[i]])
            j = i
            # Rows are sorted by length, so the batch's padded size is (count x its last row's length).
            while j < len(order) and (j - i + 1) * len(rows[order[j]]) <= max(self.max_batch_tokens, longest):
                j += 1
            chunk = order[i:j]
            width = len(rows[chunk[-1]])
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, idx in enumerate(chunk):
                ids[r, : len(rows[idx])] = torch.tensor(rows[idx])
                mask[r, : len(rows[idx])] = 1
            vectors = self.model(ids.to(self.device), mask.to(self.device))
            out[chunk] = vectors.float().cpu().numpy()
            self.num_batches += 1
            i = j
        return out


def _encoder_config(config: DecoderConfig | EncoderConfig, model_dir: str | Path) -> EncoderConfig:
    """config if it is an encoder's; InvalidRequestError naming model_dir otherwise."""
    if not isinstance(config, EncoderConfig):
        raise InvalidRequestError("model", f"{model_dir} is a decoder; serve it with LLMEngine")
    return config
