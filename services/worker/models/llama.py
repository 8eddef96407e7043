"""Llama-family decoder (Llama 2/3, Mistral, Qwen2): RMSNorm, RoPE, grouped-query attention, SwiGLU.

Plain modules over flattened tokens: every step is one forward over [T] tokens of many sequences; the
paged attention context decides which keys each token sees. q/k/v and gate/up are fused into single
matmuls, which on small models saves most of the per-layer call overhead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.models.checkpoint import check_shape, require_all
from services.worker.models.config_types import DecoderConfig
from services.worker.models.errors import CheckpointError
from services.worker.models.linear import (
    Linear,
    linear,
    pack,
    pack_linears,
    packable,
    packed_linear,
    unpack_linears,
)
from services.worker.models.paged_attention import PagedAttention
from services.worker.models.preemption import VOCAB_PER_SLICE, PreemptionPoints, in_row_slices
from services.worker.models.rope import apply_rope, rope_cos_sin, rope_inv_freq

# HF tensor suffix -> (our parameter suffix, which shard of the fused parameter it fills)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", "gate"),
    "mlp.up_proj": ("mlp.gate_up_proj", "up"),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF computes the norm in float32 and casts back before the weight multiply; match it exactly.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * normed


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: PagedAttention,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = in_row_slices(self.qkv_proj, x, attn.preemption)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(tokens, self.num_heads, self.head_dim), cos, sin)  # [T, H, D]
        k = apply_rope(k.view(tokens, self.num_kv_heads, self.head_dim), cos, sin)  # [T, Hkv, D]
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        out = attn.forward(self.layer_idx, q, k, v)  # [T, H * D]
        return in_row_slices(self.o_proj, out, attn.preemption)


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: PagedAttention
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        points = attn.preemption
        if points is None:
            return x + self.mlp(self.post_attention_layernorm(x))
        points()
        return x + in_row_slices(self.mlp, self.post_attention_layernorm(x), points)


class LlamaModel(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Causal LM over flattened tokens; serves Llama, Mistral and Qwen2 checkpoints."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer(
            "rope_cache", torch.empty(config.max_position_embeddings, config.head_dim), persistent=False
        )
        self._head_slices: list[torch.Tensor] = []  # packed vocabulary slices (pack_weights)

    def pack_weights(self) -> int:
        """CPU: packed copies of every product's weight (linear.py), the LM head's also in the
        vocabulary slices compute_logits takes under preemption points; the bytes they add."""
        added = pack_linears(self)
        weight = self.lm_head.weight
        if packable(weight) and weight.shape[0] > VOCAB_PER_SLICE:
            vocab = weight.shape[0]
            self._head_slices = [
                pack(weight[s : s + VOCAB_PER_SLICE]) for s in range(0, vocab, VOCAB_PER_SLICE)
            ]
            added += weight.numel() * weight.element_size()
        return added

    def unpack_weights(self) -> None:
        unpack_linears(self)
        self._head_slices = []

    def init_buffers(self) -> None:
        """Fill non-checkpoint buffers (the RoPE table) in place, on the model's device; call after loading.
        In place because the buffer may be a view of memory the caller owns (the arena)."""
        device = self.rope_cache.device
        inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_theta, self.config.rope_scaling)
        # Computed in float32 as HF does; the table holds the model dtype, which is exactly the cast
        # forward() applies anyway, so outputs are the same as with a float32 table.
        self.rope_cache.copy_(rope_cos_sin(inv_freq.to(device), self.config.max_position_embeddings))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: PagedAttention) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm for tokens [T] at positions [T].

        attn.preemption, when given, is called after every attention and every MLP block (so at most
        half a layer apart) and inside the long ones (preemption.py)."""
        # The table was computed in float32 and rounded to the model dtype, as HF does, so low-precision
        # runs round the same way (the cast below is then a no-op).
        cos, sin = self.rope_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2] each
        x = self.model.embed_tokens(input_ids)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        points = attn.preemption
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
            if points is not None:
                points()
        return self.model.norm(x)

    def column_major_weights(self) -> list[str]:
        """Weights better stored transposed on CPU (weight_order): the untied LM head. A decode step
        multiplies a few hidden states by it, and MKL runs that vocab-wide product 1.3-3x faster from a
        column-major weight (1.3 ms instead of 4.4 for one row of a 32000 x 256 head; the same for 64
        rows). A tied head is the embedding table, whose lookups want rows contiguous."""
        return [] if self.config.tie_word_embeddings else ["lm_head.weight"]

    def compute_logits(
        self, hidden: torch.Tensor, preemption: PreemptionPoints | None = None
    ) -> torch.Tensor:
        """Logits [N, vocab] in float32 for the N hidden states that sample a token. With preemption
        points, in vocabulary slices with a point between them: the head of a wide step is its longest
        single product, and a slice of the vocabulary keeps every row, so the product stays as
        efficient (slicing rows would not)."""
        weight = self.lm_head.weight
        vocab = weight.shape[0]
        if preemption is None or vocab <= VOCAB_PER_SLICE:
            return self.lm_head(hidden).float()
        logits = torch.empty(hidden.shape[0], vocab, dtype=torch.float32, device=hidden.device)
        for i, start in enumerate(range(0, vocab, VOCAB_PER_SLICE)):
            if start:
                preemption()
            end = min(start + VOCAB_PER_SLICE, vocab)
            if self._head_slices and hidden.dtype == weight.dtype:
                logits[:, start:end] = packed_linear(hidden, self._head_slices[i])
            else:
                logits[:, start:end] = linear(hidden, weight[start:end])
        return logits

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, str, torch.Tensor]]) -> None:
        """Copy HF-named tensors (file, name, tensor) into the fused parameters, checking every shape."""
        tied = self.config.tie_word_embeddings
        if tied:
            # Moving the module (to_empty, .to) replaces each parameter separately and unties them.
            self.lm_head.weight = self.model.embed_tokens.weight
        params = dict(self.named_parameters(remove_duplicate=False))
        expected_hf = {
            hf for name in params if not (tied and name == "lm_head.weight") for hf in _hf_names_of(name)
        }
        seen: set[str] = set()
        file = ""
        for file, name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints still store the head; the embedding is the source of truth
            target, rows = self._locate(name)
            if target is None or target not in params:
                raise CheckpointError(file, f"unexpected tensor {name!r} for {self.config.architecture}")
            param = params[target]
            dest = param if rows is None else param.narrow(0, rows[0], rows[1])
            check_shape(file, name, tensor, tuple(dest.shape))
            dest.copy_(tensor.to(dest.dtype))
            seen.add(name)
        # A GGUF checkpoint is one file, named as is; safetensors shards are named by their directory.
        source = Path(file)
        require_all(source if source.suffix.lower() == ".gguf" else source.parent, expected_hf, seen)

    def _locate(self, name: str) -> tuple[str | None, tuple[int, int] | None]:
        """Our parameter name and (row offset, rows) inside it for a HF tensor name."""
        for hf_suffix, (our_suffix, shard) in _FUSED.items():
            marker = f".{hf_suffix}."
            if marker in name:
                prefix, leaf = name.split(marker)
                return f"{prefix}.{our_suffix}.{leaf}", self._shard_rows(shard)
        return name, None

    def _shard_rows(self, shard: str) -> tuple[int, int]:
        c = self.config
        q, kv, inter = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        )
        return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv), "gate": (0, inter), "up": (inter, inter)}[shard]


def _hf_names_of(param_name: str) -> set[str]:
    """The checkpoint tensor names that together fill one of our parameters."""
    for our_suffix in {ours for ours, _ in _FUSED.values()}:
        marker = f".{our_suffix}."
        if marker in param_name:
            prefix, leaf = param_name.split(marker)
            return {f"{prefix}.{s}.{leaf}" for s, (o, _) in _FUSED.items() if o == our_suffix}
    return {param_name}
