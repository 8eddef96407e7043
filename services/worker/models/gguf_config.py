"""A DecoderConfig derived from a GGUF file's metadata (llama.cpp's key names) and its tensor table."""

from __future__ import annotations

from typing import Any

from services.worker.models.config_types import DecoderConfig
from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_file import GGUFFile

# general.architecture -> the HF architecture our loader builds. Both use llama.cpp's Llama tensor names;
# Mistral 7B files say 'llama' too. ('mistral3' and the rest are different models.)
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's when rope.freq_base is absent


def gguf_decoder_config(gguf: GGUFFile) -> DecoderConfig:
    """The decoder config gguf describes. CheckpointError naming the file for an architecture we do not
    serve, a missing or ill-typed key, or an option we do not implement (MoE, RoPE scaling, partial RoPE)."""
    arch = gguf.architecture
    if arch not in GGUF_ARCHITECTURES:
        supported = ", ".join(GGUF_ARCHITECTURES)
        raise CheckpointError(gguf.path, f"unsupported GGUF architecture {arch!r}; supported: {supported}")
    key = _Keys(gguf, arch)
    if key.int_or_none("expert_count"):
        raise CheckpointError(gguf.path, f"{arch}.expert_count is set: mixture-of-experts is not supported")
    hidden, heads = key.positive("embedding_length"), key.positive("attention.head_count")
    kv_heads = key.int_or_none("attention.head_count_kv") or heads
    if heads % kv_heads:
        problem = f"{arch}.attention.head_count {heads} is not a multiple of head_count_kv {kv_heads}"
        raise CheckpointError(gguf.path, problem)
    head_dim = _head_dim(gguf, key, hidden, heads)
    max_pos = key.positive("context_length")
    attention_bias = "blk.0.attn_q.bias" in gguf.tensors or arch == "qwen2"
    eos = {key.token_id(name) for name in ("eos_token_id", "eot_token_id", "eom_token_id")}
    return DecoderConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        model_type=arch,
        vocab_size=_vocab_size(gguf, key),
        hidden_size=hidden,
        intermediate_size=key.positive("feed_forward_length"),
        num_hidden_layers=key.positive("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=key.number("attention.layer_norm_rms_epsilon"),
        rope_theta=key.number("rope.freq_base", _DEFAULT_ROPE_THETA),
        rope_scaling=_rope_scaling(gguf, key),
        max_position_embeddings=max_pos,
        max_model_len=max_pos,
        # llama.cpp leaves output.weight out when the LM head is the embedding table.
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias=attention_bias,
        o_proj_bias="blk.0.attn_output.bias" in gguf.tensors,
        mlp_bias="blk.0.ffn_gate.bias" in gguf.tensors,
        sliding_window=None,  # llama.cpp writes no window for these architectures
        torch_dtype=None,  # a GGUF's tensors have per-tensor (quantized) types, no single dtype
        eos_token_ids=frozenset(i for i in eos if i is not None),
        bos_token_id=key.token_id("bos_token_id"),
    )


class _Keys:
    """Typed reads of '<arch>.<name>' (and 'tokenizer.ggml.<name>') metadata; CheckpointError naming the
    file and the full key for a missing or ill-typed value."""

    def __init__(self, gguf: GGUFFile, arch: str) -> None:
        self._gguf, self._arch = gguf, arch

    def _raw(self, full_key: str) -> Any:
        return self._gguf.metadata.get(full_key)

    def int_or_none(self, name: str, prefix: str | None = None) -> int | None:
        full_key = f"{prefix or self._arch}.{name}"
        value = self._raw(full_key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problem = f"metadata {full_key!r} must be a non-negative integer, got {value!r}"
            raise CheckpointError(self._gguf.path, problem)
        return value

    def positive(self, name: str) -> int:
        value = self.int_or_none(name)
        if not value:
            full_key = f"{self._arch}.{name}"
            problem = f"missing metadata {full_key!r}" if value is None else f"metadata {full_key!r} is 0"
            raise CheckpointError(self._gguf.path, problem)
        return value

    def number(self, name: str, default: float | None = None) -> float:
        full_key = f"{self._arch}.{name}"
        value = self._raw(full_key)
        if value is None and default is None:
            raise CheckpointError(self._gguf.path, f"missing metadata {full_key!r}")
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise CheckpointError(self._gguf.path, f"metadata {full_key!r} must be positive, got {value!r}")
        return float(value)

    def text(self, name: str) -> str | None:
        value = self._raw(f"{self._arch}.{name}")
        return None if value is None else str(value)

    def token_id(self, name: str) -> int | None:
        return self.int_or_none(name, prefix="tokenizer.ggml")


def _head_dim(gguf: GGUFFile, key: _Keys, hidden: int, heads: int) -> int:
    """attention.key_length if given, else hidden / heads; RoPE must rotate the whole head."""
    arch = gguf.architecture
    head_dim = key.int_or_none("attention.key_length")
    if head_dim is None:
        if hidden % heads:
            problem = f"{arch}.embedding_length {hidden} is not a multiple of attention.head_count {heads}"
            raise CheckpointError(gguf.path, problem)
        head_dim = hidden // heads
    value_dim = key.int_or_none("attention.value_length") or head_dim
    if value_dim != head_dim:
        problem = f"attention.value_length {value_dim} differs from key_length {head_dim} (not supported)"
        raise CheckpointError(gguf.path, problem)
    rotary = key.int_or_none("rope.dimension_count") or head_dim
    if rotary != head_dim:
        problem = f"{arch}.rope.dimension_count {rotary} is not the head size {head_dim}: partial RoPE"
        raise CheckpointError(gguf.path, f"{problem} is not supported")
    return head_dim


def _vocab_size(gguf: GGUFFile, key: _Keys) -> int:
    """<arch>.vocab_size, else the embedding table's rows, else the tokenizer's token count."""
    size = key.int_or_none("vocab_size")
    if size:
        return size
    embedding = gguf.tensors.get("token_embd.weight")
    if embedding is not None and len(embedding.shape) == 2:
        return embedding.shape[0]
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    raise CheckpointError(gguf.path, f"cannot tell the vocabulary size (no {gguf.architecture}.vocab_size)")


def _rope_scaling(gguf: GGUFFile, key: _Keys) -> dict[str, Any] | None:
    """None for plain RoPE: the only kind llama.cpp metadata can state that our RoPE implements.
    Llama 3.1-style files carry their scaling as per-frequency factors (a rope_freqs tensor) instead."""
    kind = key.text("rope.scaling.type")
    if kind not in (None, "none"):
        problem = f"unsupported RoPE scaling {gguf.architecture}.rope.scaling.type {kind!r}; supported: none"
        raise CheckpointError(gguf.path, problem)
    if "rope_freqs.weight" in gguf.tensors:
        problem = "per-frequency RoPE factors (tensor 'rope_freqs.weight', Llama 3.1-style) are not supported"
        raise CheckpointError(gguf.path, problem)
    return None
