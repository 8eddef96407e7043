"""Model runner: owns every tensor of a decoder (weights, KV cache) and runs one batched step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.engine.kv_cache import KVCaches, KVCacheSpec
from services.worker.engine.logprobs import StepLogprobs
from services.worker.engine.sampler import Sampler
from services.worker.engine.scheduled_batch import ScheduledBatch
from services.worker.engine.sequence import Sequence
from services.worker.models.cpu_kernels import PagedDecode, paged_decode_kernel
from services.worker.models.paged_attention import (
    AttentionMetadata,
    DecodeGroup,
    PagedAttention,
    PrefillChunk,
)
from services.worker.models.preemption import PreemptionPoints

_CPU_DECODE_GROUP = 8  # measured: 8 groups of 4 or 4 of 8 beat 1 of 32 about 4x (paged_attention.py)
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what cpu_kernels' paged_decode is built for


@dataclass
class StepInputs:
    """Flat inputs of one step: decodes first, then prefill chunks."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    metadata: AttentionMetadata
    sample_rows: torch.Tensor  # [S] flat index of each sampling sequence's last token
    sample_batch_index: list[int]  # batch index of each of those S rows


class ModelRunner:
    """Turns a ScheduledBatch into one forward pass over all of its tokens, and samples."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: KVCacheSpec,
        kv_caches: KVCaches,
        device: torch.device,
        seed: int | None = None,
    ) -> None:
        """kv_caches: per layer (K, V) of spec.block_shape(num_blocks), allocated by the caller (on their
        own or as views of an arena pool), so the runner itself never allocates cache memory."""
        self.model = model
        self.spec = spec
        self.device = device
        self.kv_caches = kv_caches
        self.num_blocks = kv_caches[0][0].shape[0]
        self.decode_kernel: PagedDecode | None = None
        self.sampler = Sampler(device, seed)
        self._pin = device.type == "cuda"
        self.decode_group_size: int | None = None
        self._choose_decode_path()

    def set_kv_caches(self, kv_caches: KVCaches) -> None:
        """Attend over kv_caches (this spec, any block count) from the next step on: the engine's KV pool
        was resized or moved. Call between steps."""
        self.kv_caches = kv_caches
        self.num_blocks = kv_caches[0][0].shape[0]
        self._choose_decode_path()

    def _choose_decode_path(self) -> None:
        """CPU: the worker's kernel where it is built and can address these caches (one dense
        [N, bs, Hkv, D] tensor each, float32 or bfloat16), all decodes in one call with no mask; else
        decodes in groups of _CPU_DECODE_GROUP (see paged_attention). CUDA: all in one SDPA."""
        k, v = self.kv_caches[0]
        kernel = None
        if (
            self.device.type == "cpu"
            and k.dtype in _KERNEL_DTYPES
            and k.is_contiguous()
            and v.is_contiguous()
        ):
            kernel = paged_decode_kernel()
        self.decode_kernel = kernel
        cpu_groups = self.device.type == "cpu" and kernel is None
        self.decode_group_size = _CPU_DECODE_GROUP if cpu_groups else None

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, preemption: PreemptionPoints | None = None) -> list[int | None]:
        """Run the batch; the sampled token per sequence (None for a prefill chunk that samples nothing).
        preemption: the forward's preemption points (models/preemption.py); what runs there may call
        execute() for another batch. Also called once the logits are computed (the LM head of a wide
        batch is a long stretch on its own)."""
        inputs = self.prepare(batch)
        logits = self.forward(inputs, preemption)
        if preemption is not None:
            preemption()
        sampled: list[int | None] = [None] * len(batch.seqs)
        if inputs.sample_batch_index:
            seqs = [batch.seqs[i] for i in inputs.sample_batch_index]
            logprobs = StepLogprobs.capture(logits, seqs)  # the model's own, before anything changes them
            _ban_early_stops(logits, seqs)
            tokens = self.sampler.sample(logits, seqs)
            if logprobs is not None:
                logprobs.record(tokens)
            for i, token in zip(inputs.sample_batch_index, tokens, strict=True):
                sampled[i] = token
        return sampled

    @torch.inference_mode()
    def forward(self, inputs: StepInputs, preemption: PreemptionPoints | None = None) -> torch.Tensor:
        """Logits [S, vocab] (float32) for the sampling rows of a prepared step."""
        attention = PagedAttention(self.kv_caches, inputs.metadata, self.decode_kernel, preemption)
        hidden = self.model(inputs.input_ids, inputs.positions, attention)
        return self.model.compute_logits(hidden.index_select(0, inputs.sample_rows), preemption)

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """Flatten the batch, decodes first, and build every index tensor the attention needs."""
        bs = self.spec.block_size
        decodes = [i for i, n in enumerate(batch.num_tokens) if n == 1]
        decodes.sort(key=lambda i: batch.seqs[i].num_computed_tokens)  # similar lengths share a group
        prefills = [i for i, n in enumerate(batch.num_tokens) if n > 1]
        order = decodes + prefills
        token_ids: list[int] = []
        positions: list[int] = []
        seq_of_token: list[int] = []
        sample_rows: list[int] = []
        sample_batch_index: list[int] = []
        for row, i in enumerate(order):
            seq, n = batch.seqs[i], batch.num_tokens[i]
            start = seq.num_computed_tokens
            token_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            seq_of_token.extend([row] * n)
            if batch.will_sample[i]:
                sample_rows.append(len(token_ids) - 1)
                sample_batch_index.append(i)
        max_blocks = max(len(batch.seqs[i].block_table) for i in order)
        tables = torch.tensor(
            [_padded(batch.seqs[i].block_table, max_blocks) for i in order], dtype=torch.long
        )
        positions_t = torch.tensor(positions, dtype=torch.long)
        rows_t = torch.tensor(seq_of_token, dtype=torch.long)
        slot_mapping = tables[rows_t, positions_t // bs] * bs + positions_t % bs

        num_decodes = len(decodes)
        to = self._to_device
        groups = []
        size = self.decode_group_size or max(1, num_decodes)
        masked = self.decode_kernel is None
        for start in range(0, num_decodes, size):
            end = min(start + size, num_decodes)
            context_lens = positions_t[start:end] + 1
            blocks = -(-int(context_lens[-1]) // bs)  # sorted: the last is the longest
            mask = None
            if masked:
                mask = to((torch.arange(blocks * bs) < context_lens.unsqueeze(1)).view(end - start, 1, 1, -1))
            groups.append(DecodeGroup(start, end, to(tables[start:end, :blocks]), to(context_lens), mask))
        chunks = []
        offset = num_decodes
        for row, i in enumerate(prefills, start=num_decodes):
            seq, n = batch.seqs[i], batch.num_tokens[i]
            start = seq.num_computed_tokens
            blocks = mask = None
            if start > 0:  # continues a prompt (chunked prefill or a prefix-cache hit): attend to the cache
                context = start + n
                blocks = to(tables[row, : -(-context // bs)])
                query_pos = torch.arange(start, context).unsqueeze(1)
                mask = to(torch.arange(context).unsqueeze(0) <= query_pos)
            chunks.append(PrefillChunk(offset, n, blocks, start + n, mask))
            offset += n
        metadata = AttentionMetadata(
            slot_mapping=to(slot_mapping),
            num_decodes=num_decodes,
            decode_groups=groups,
            prefills=chunks,
        )
        return StepInputs(
            input_ids=to(torch.tensor(token_ids, dtype=torch.long)),
            positions=to(positions_t),
            metadata=metadata,
            sample_rows=to(torch.tensor(sample_rows, dtype=torch.long)),
            sample_batch_index=sample_batch_index,
        )

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensor -> model device; pinned and asynchronous on CUDA so the copy overlaps the launch."""
        if self.device.type == "cpu":
            return t
        if self._pin:
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)


def _padded(values: list[int], length: int) -> list[int]:
    return values + [0] * (length - len(values))


def _ban_early_stops(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Mask (in place) the ids that would end a sequence still short of its min_tokens: its EOS ids
    (unless it ignores EOS) and its stop_token_ids. Costs nothing when no request asks for min_tokens."""
    for row, seq in enumerate(seqs):
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            continue
        banned = set(params.stop_token_ids)
        if not params.ignore_eos:
            banned |= seq.eos_token_ids
        vocab = logits.shape[1]
        banned_ids = [t for t in banned if t < vocab]  # a stop id past the vocabulary is never sampled
        if banned_ids:
            logits[row, banned_ids] = float("-inf")
