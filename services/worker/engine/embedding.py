"""Embedding engine: BERT-family encoder with concurrent `encode` calls batched into shared forwards.

Callers (threads or coroutines) submit texts; one batching thread drains everything submitted so far,
sorts it by length so padding stays small, runs forwards of at most max_batch_tokens padded tokens and
hands each caller its rows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from services.worker.engine.errors import EngineDeadError, InvalidRequestError
from services.worker.models.config import EncoderConfig
from services.worker.models.loader import load_model


@dataclass
class _Job:
    token_ids: list[list[int]]
    done: concurrent.futures.Future[np.ndarray]


class EmbeddingEngine:
    """encode(texts) -> float32 [N, D]; safe to call from many threads at once."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_tokens: int = 8192,
    ) -> None:
        loaded = load_model(model_dir, dtype=dtype, device=device)
        if not isinstance(loaded.config, EncoderConfig):
            raise InvalidRequestError("model", f"{model_dir} is a decoder; serve it with LLMEngine")
        assert loaded.tokenizer is not None  # the loader requires one for encoders
        self.model = loaded.model
        self.config: EncoderConfig = loaded.config
        self.tokenizer = loaded.tokenizer
        self.device = torch.device(device)
        self.max_batch_tokens = max_batch_tokens
        self.dim = self.config.hidden_size
        self.num_batches = 0  # forwards run; with concurrent callers fewer than calls (tests read it)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="embedding-batcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the batching thread after the work already submitted."""
        self._jobs.put(None)
        self._thread.join()

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
        if not self._thread.is_alive():
            raise EngineDeadError("embedding engine is closed")
        token_ids = self._tokenize(texts)
        job = _Job(token_ids, concurrent.futures.Future())
        self._jobs.put(job)
        return job.done, sum(len(ids) for ids in token_ids)

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
            vectors = self._embed(rows)
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
