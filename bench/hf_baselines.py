"""The transformers baselines: static padded `generate` batches, and transformers' own continuous batching.

Continuous batching API (transformers 5.24, generation/continuous_batching/continuous_api.py):
`model.init_continuous_batching(generation_config, continuous_batching_config)` returns a
`ContinuousBatchingManager`; `manager.add_request(ids, max_new_tokens=n, eos_token_id=-1)` takes a per-request
length (`generate_batch` only takes one `max_new_tokens` for all, so it cannot run this workload) and
`eos_token_id=-1` disables EOS; a background thread steps the batch and `get_result()` hands back finished
`GenerationOutput`s. On CPU it supports attn_implementation "sdpa" (packed varlen batch + mask over the paged
cache) and "paged|eager"; flash kernels are CUDA only.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from bench.workload import RunResult, Workload

# Llama checkpoints without a pad token: any id works because the attention mask hides padded positions.
PAD_TOKEN_ID = 0
# Results are polled with this timeout so a crashed background thread is noticed, not waited on forever.
CB_POLL_S = 1.0


def load_hf_model(model_dir: Path, attn_implementation: str = "sdpa") -> torch.nn.Module:
    """Loads the checkpoint in fp32 on CPU, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn_implementation
    )
    return model.eval()


def run_hf_static(model: torch.nn.Module, workload: Workload, batch_size: int = 32) -> RunResult:
    """Static batching: requests in submission order, `batch_size` at a time, left-padded; each batch decodes
    to its longest requested output, and only each request's own requested tokens count as output."""
    mismatches = 0
    token_ids: list[list[int]] = []
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(workload.prompts), batch_size):
            prompts = workload.prompts[first : first + batch_size]
            wanted = workload.output_lens[first : first + batch_size]
            width, max_new = max(len(p) for p in prompts), max(wanted)
            input_ids = torch.full((len(prompts), width), PAD_TOKEN_ID, dtype=torch.long)  # [B, S]
            mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, S]
            for row, prompt in enumerate(prompts):
                input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
                mask[row, width - len(prompt) :] = 1
            # min_new_tokens == max_new_tokens masks EOS until the end, so every row decodes max_new tokens.
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                pad_token_id=PAD_TOKEN_ID,
            )  # [B, S + max_new]
            generated = out[:, width:]
            for row, n in enumerate(wanted):
                ids = generated[row, :n].tolist()
                mismatches += int(generated.shape[1] != max_new or len(ids) != n)
                token_ids.append(ids)
    wall = time.perf_counter() - start
    return RunResult(wall, workload.output_tokens, mismatches, token_ids)


class HfContinuousBatching:
    """transformers' continuous batching, with a KV cache sized to hold the whole workload at once.

    Sizing the cache (`num_blocks`) to the workload matters on CPU: left to itself the cache is sized from
    system memory, and the sdpa path builds masks over every cache slot: ~4x slower on this workload.
    """

    def __init__(self, model: torch.nn.Module, sizing: Workload, max_batch_tokens: int = 2048) -> None:
        self._model = model
        page_size = ContinuousBatchingConfig.page_size
        blocks = sum(
            math.ceil((len(p) + n) / page_size)
            for p, n in zip(sizing.prompts, sizing.output_lens, strict=True)
        )
        self._generation_config = GenerationConfig(
            do_sample=False,
            eos_token_id=-1,
            pad_token_id=PAD_TOKEN_ID,
            max_new_tokens=max(sizing.output_lens),
        )
        # Random prompts share no prefix, so block sharing would only add hashing and sorting work.
        self._cb_config = ContinuousBatchingConfig(
            num_blocks=blocks + 2, max_batch_tokens=max_batch_tokens, allow_block_sharing=False
        )

    def describe(self) -> dict[str, object]:
        """The settings that ran, for the JSON report."""
        return {
            "attn_implementation": self._model.config._attn_implementation,
            "num_blocks": self._cb_config.num_blocks,
            "page_size": self._cb_config.page_size,
            "max_batch_tokens": self._cb_config.max_batch_tokens,
        }

    def run(self, workload: Workload) -> RunResult:
        """Submits every request at t=0 and waits for all; the timer excludes cache allocation (done once)."""
        with torch.inference_mode():
            manager = self._model.init_continuous_batching(
                generation_config=self._generation_config, continuous_batching_config=self._cb_config
            )
            if not manager.warmed_up:
                manager.warmup()  # allocates the paged cache; kept across runs via keep_for_next_session
            manager.start()
            try:
                start = time.perf_counter()
                ids = [
                    manager.add_request(prompt, max_new_tokens=n, eos_token_id=-1)
                    for prompt, n in zip(workload.prompts, workload.output_lens, strict=True)
                ]
                results = {}
                while len(results) < len(ids):
                    result = manager.get_result(timeout=CB_POLL_S)
                    if result is None:
                        if not manager.is_running():
                            raise RuntimeError("transformers continuous batching thread stopped early")
                        continue
                    if result.error is not None:
                        raise RuntimeError(f"transformers continuous batching failed: {result.error}")
                    if result.is_finished():
                        results[result.request_id] = result
                wall = time.perf_counter() - start
            finally:
                manager.stop(block=True, keep_for_next_session=True)
        token_ids = [list(results[i].generated_tokens) for i in ids]
        mismatches = sum(len(t) != n for t, n in zip(token_ids, workload.output_lens, strict=True))
        return RunResult(wall, workload.output_tokens, mismatches, token_ids)
