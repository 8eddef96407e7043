"""What a model's architecture is, as the loaders and the model code read it: one frozen dataclass per
family, filled from a Hugging Face config.json (config.py) or a GGUF file's metadata (gguf_config.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DecoderConfig:
    """A Llama-family decoder (Llama, Mistral, Qwen2).

    head_dim: per-head width (config's head_dim, else hidden_size / num_attention_heads).
    rope_scaling: None (plain RoPE) or a dict with rope_type "llama3" and its four keys.
    attention_bias: q/k/v projections have a bias (Qwen2 always). o_proj_bias: o_proj has one too
    (Llama's attention_bias covers all four projections, Qwen2's bias covers q/k/v only).
    sliding_window: the checkpoint's window, None when none is active. We do not implement sliding
    windows, so max_model_len is capped at the window where the two would differ.
    eos_token_ids: generation_config.json's eos ids if given, else config.json's; empty if neither.
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = field(hash=False)
    max_position_embeddings: int
    max_model_len: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    torch_dtype: str | None
    eos_token_ids: frozenset[int]
    bos_token_id: int | None


@dataclass(frozen=True)
class EncoderConfig:
    """A BERT-family sentence encoder.

    pooling: "mean" (over non-pad tokens), "cls" or "max". normalize: L2-normalise the pooled vector.
    max_seq_length: longest input in tokens (sentence-transformers' limit if given, else positions).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int
    pooling: str
    normalize: bool
    max_seq_length: int
