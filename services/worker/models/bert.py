"""BERT-family sentence encoder (e.g. all-MiniLM-L6-v2): post-LayerNorm transformer + pooling."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.models.checkpoint import check_duplicate, check_shape, reject_unexpected, require_all
from services.worker.models.config_types import EncoderConfig

# BertModel's pooler and BertForMaskedLM's / BertForPreTraining's heads are not used for embeddings.
_IGNORED_PREFIXES = ("pooler.", "cls.")
_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # BERT's "gelu" is the exact erf form
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertLayer(nn.Module):
    """Self-attention then MLP, each followed by residual add and LayerNorm (post-LN, as in BERT)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.n_heads = config.num_attention_heads
        self.act = _ACTIVATIONS[config.hidden_act]
        # q, k and v fused into one matmul; load_weights fills the three row blocks.
        self.wqkv = nn.Linear(d, 3 * d)
        self.wo = nn.Linear(d, d)
        self.attn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.w_in = nn.Linear(d, config.intermediate_size)
        self.w_out = nn.Linear(config.intermediate_size, d)
        self.mlp_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.wqkv(x).view(b, s, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, S, Dh]
        x = self.attn_norm(x + self.wo(attn.transpose(1, 2).reshape(b, s, d)))
        return self.mlp_norm(x + self.w_out(self.act(self.w_in(x))))


class BertEncoder(nn.Module):
    """Token ids -> one embedding per sequence, pooled and normalised as config says."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.tok_embeddings = nn.Embedding(config.vocab_size, d)
        self.pos_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.emb_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: [B, S] (mask 1 for real tokens, 0 for padding; every row needs at
        least one real token, S <= max_position_embeddings). Returns float32 [B, hidden_size]."""
        s = input_ids.shape[1]
        positions = torch.arange(s, device=input_ids.device)
        # Single-segment input: token type 0 everywhere, as sentence-transformers does.
        x = self.tok_embeddings(input_ids) + self.pos_embeddings(positions) + self.type_embeddings.weight[0]
        x = self.emb_norm(x)  # [B, S, D]
        keep = attention_mask.bool()
        mask = keep[:, None, None, :]  # [B, 1, 1, S]: every query may attend to every real key
        for layer in self.layers:
            x = layer(x, mask)
        return self._pool(x.float(), keep)

    def _pool(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        pooling = self.config.pooling
        if pooling == "cls":
            pooled = x[:, 0]
        elif pooling == "max":
            pooled = x.masked_fill(~keep[..., None], float("-inf")).amax(dim=1)
        else:
            weights = keep[..., None].to(x.dtype)  # [B, S, 1]
            pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return F.normalize(pooled, p=2.0, dim=-1) if self.config.normalize else pooled

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, str, torch.Tensor]]) -> None:
        """Copy (file, HF tensor name, tensor) triples in, with or without the "bert." prefix.
        CheckpointError for a wrong shape, an unknown or duplicate tensor, or a missing one."""
        targets = self._targets()
        seen: set[str] = set()
        model_dir: Path | None = None
        for file, name, tensor in weights:
            model_dir = model_dir or Path(file).parent
            key = name.removeprefix("bert.")
            if key not in targets:
                reject_unexpected(file, name, _IGNORED_PREFIXES)
                continue
            param, rows = targets[key]
            dest = param if rows is None else param[rows]
            check_shape(file, name, tensor, dest.shape)
            check_duplicate(file, key, seen)
            dest.copy_(tensor)
        require_all(model_dir or Path("<no tensors>"), set(targets), seen)

    def _targets(self) -> dict[str, tuple[torch.Tensor, slice | None]]:
        """HF name (no "bert." prefix) -> (our parameter, row slice of it or None for all of it)."""
        t: dict[str, tuple[torch.Tensor, slice | None]] = {
            "embeddings.word_embeddings.weight": (self.tok_embeddings.weight, None),
            "embeddings.position_embeddings.weight": (self.pos_embeddings.weight, None),
            "embeddings.token_type_embeddings.weight": (self.type_embeddings.weight, None),
            "embeddings.LayerNorm.weight": (self.emb_norm.weight, None),
            "embeddings.LayerNorm.bias": (self.emb_norm.bias, None),
        }
        d = self.config.hidden_size
        for i, layer in enumerate(self.layers):
            hf = f"encoder.layer.{i}."
            for j, part in enumerate(("query", "key", "value")):
                t[f"{hf}attention.self.{part}.weight"] = (layer.wqkv.weight, slice(j * d, (j + 1) * d))
                t[f"{hf}attention.self.{part}.bias"] = (layer.wqkv.bias, slice(j * d, (j + 1) * d))
            modules = (
                ("attention.output.dense", layer.wo),
                ("attention.output.LayerNorm", layer.attn_norm),
                ("intermediate.dense", layer.w_in),
                ("output.dense", layer.w_out),
                ("output.LayerNorm", layer.mlp_norm),
            )
            for hf_mod, ours in modules:
                t[f"{hf}{hf_mod}.weight"] = (ours.weight, None)
                t[f"{hf}{hf_mod}.bias"] = (ours.bias, None)
        return t
