"""Build a model from a checkpoint directory or GGUF file: config -> meta-device module -> weights -> eval."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from services.worker.models.checkpoint import iter_safetensors
from services.worker.models.config import load_model_config
from services.worker.models.config_types import DecoderConfig, EncoderConfig
from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_file import is_gguf_path, read_gguf
from services.worker.models.tokenizer import Tokenizer
from services.worker.models.weight_order import column_major_on

# config.json architecture -> (module, class). Imported on use so loading a BERT never imports the
# decoder and vice versa. Keys must cover config.DECODER_ARCHITECTURES | ENCODER_ARCHITECTURES.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("services.worker.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("services.worker.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("services.worker.models.llama", "LlamaForCausalLM"),
    "BertModel": ("services.worker.models.bert", "BertEncoder"),
    "BertForMaskedLM": ("services.worker.models.bert", "BertEncoder"),
    "BertForPreTraining": ("services.worker.models.bert", "BertEncoder"),
}
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class LoadedModel:
    """A model ready for inference. tokenizer is None only for a decoder shipped without tokenizer.json."""

    model: nn.Module
    config: DecoderConfig | EncoderConfig
    tokenizer: Tokenizer | None
    model_dir: Path
    dtype: torch.dtype
    device: torch.device


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch dtype for "float32" / "bfloat16" / "float16" (or those torch dtypes); ValueError otherwise."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unsupported dtype {dtype!r}; allowed: {', '.join(DTYPES)}")


def model_class(architecture: str) -> type[nn.Module]:
    """The nn.Module class serving a config.json architecture name; KeyError if none does."""
    module_name, class_name = ARCHITECTURES[architecture]
    return getattr(importlib.import_module(module_name), class_name)


def build_on_meta(config: DecoderConfig | EncoderConfig, dtype: torch.dtype) -> nn.Module:
    """config's model on the meta device in dtype: every tensor's shape and dtype, no storage."""
    with torch.device("meta"):
        model = model_class(config.architecture)(config)
    return model.to(dtype=dtype)


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    materialize: Callable[[nn.Module], None] | None = None,
) -> LoadedModel:
    """Load a Hugging Face-format checkpoint directory, or a GGUF file (config, tokenizer and weights
    all from it, dequantized), onto device in dtype, in eval mode.

    materialize: gives the model, built on meta in dtype, real storage on device by pointing every
    parameter and buffer at memory the caller owns (e.g. views of the arena); None allocates each tensor
    with to_empty. Raises CheckpointError (naming the file) for anything wrong with the checkpoint,
    ValueError for a dtype outside DTYPES.
    """
    torch_dtype = parse_dtype(dtype)
    model_dir = Path(model_dir)
    device = torch.device(device)
    if is_gguf_path(model_dir):
        config, tokenizer, weights = _open_gguf(model_dir)
    else:
        config, tokenizer = _open_hf_dir(model_dir)
        weights = iter_safetensors(model_dir)  # a generator: reads nothing until load_weights pulls
    # Building on meta allocates nothing; to_empty then allocates each tensor once, already in dtype.
    model = build_on_meta(config, torch_dtype)
    if materialize is None:
        model = model.to_empty(device=device)
        column_major_on(model, device)
    else:
        materialize(model)  # binding storage applies the weights' memory order itself (bind_to_arena)
    with torch.no_grad():
        model.load_weights(weights)
        # Non-persistent buffers (e.g. RoPE tables) are not in the checkpoint and were left
        # uninitialised; the model recomputes them in place.
        init_buffers = getattr(model, "init_buffers", None)
        if callable(init_buffers):
            init_buffers()
    model.eval()
    return LoadedModel(model, config, tokenizer, model_dir, torch_dtype, device)


def _open_hf_dir(model_dir: Path) -> tuple[DecoderConfig | EncoderConfig, Tokenizer | None]:
    """config and tokenizer of a Hugging Face checkpoint directory (without tokenizer.json: None, decoders
    only)."""
    config = load_model_config(model_dir)
    has_tokenizer = (model_dir / "tokenizer.json").is_file()
    if isinstance(config, EncoderConfig) and not has_tokenizer:
        raise CheckpointError(model_dir / "tokenizer.json", "file not found (an embedding model needs one)")
    return config, Tokenizer(model_dir) if has_tokenizer else None


def _open_gguf(
    path: Path,
) -> tuple[DecoderConfig, Tokenizer | None, Iterator[tuple[str, str, torch.Tensor]]]:
    """config, tokenizer and lazy weight iterator of a GGUF file, its header parsed once for all three.
    Every tensor's name and type is checked here, before the caller reserves memory for the model."""
    # Imported on use, so loading a safetensors checkpoint never imports the gguf package.
    from services.worker.models.gguf_config import gguf_decoder_config
    from services.worker.models.gguf_tokenizer import gguf_tokenizer
    from services.worker.models.gguf_weights import check_gguf_tensors, iter_gguf

    gguf = read_gguf(path)
    config = gguf_decoder_config(gguf)
    check_gguf_tensors(gguf)
    return config, gguf_tokenizer(gguf), iter_gguf(gguf)
