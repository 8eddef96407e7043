"""GGUF files converted from the tiny synthetic checkpoints as llama.cpp converts them: the tensors come
back exactly as the safetensors hold them (q/k permutation undone under GQA, Qwen2 left alone), the
engine serves them token for token as it serves the directory (alone and in the arena), and the
tokenizer built from the metadata encodes as tokenizer.json does."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from services.common.sampling import SamplingParams
from services.worker.engine.config import EngineConfig
from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.arena import Arena
from services.worker.memory.manager import MemoryManager
from services.worker.memory.weights import checkpoint_tensor_specs, weight_bytes_of
from services.worker.models.checkpoint import iter_safetensors
from services.worker.models.config import load_model_config
from services.worker.models.gguf_weights import iter_gguf, unpermute_rope_rows
from services.worker.models.loader import load_model
from services.worker.models.tokenizer import Tokenizer
from tests.worker.engine.reference import mixed_prompts
from tests.worker.models.gguf_builders import gguf_from_hf_dir, llama_cpp_permute

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
CHECKPOINTS = {"llama_gqa_dir": "llama", "llama_tied_dir": "llama", "qwen2_dir": "qwen2"}
TEXTS = ["hello world", "  two leading spaces", "digits 12345 and code: f(x) = x**2", "héllo 😀", ""]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, Path]:
    """{fixture name: its F32 GGUF conversion}, written once for the module."""
    out = tmp_path_factory.mktemp("gguf")
    return {
        name: gguf_from_hf_dir(request.getfixturevalue(name), out / f"{name}.gguf", arch=arch)
        for name, arch in CHECKPOINTS.items()
    }


@pytest.mark.parametrize(("rows", "cols", "n_head"), [(64, 64, 4), (32, 64, 2), (24, 8, 3), (12, 1, 6)])
def test_unpermute_inverts_llama_cpp_permute(rows: int, cols: int, n_head: int) -> None:
    weight = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols).squeeze(-1 if cols == 1 else ())
    permuted = torch.from_numpy(llama_cpp_permute(weight, n_head))
    assert torch.equal(unpermute_rope_rows(permuted, n_head), torch.from_numpy(weight))


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_tensors_equal_the_safetensors(
    name: str, converted: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    expected = {n: t for _, n, t in iter_safetensors(request.getfixturevalue(name))}
    got = {}
    for file, hf_name, tensor in iter_gguf(converted[name]):
        assert file == str(converted[name])
        assert tensor.dtype == torch.float32
        got[hf_name] = tensor
    assert got.keys() == expected.keys()
    for hf_name, tensor in got.items():
        assert torch.equal(tensor, expected[hf_name]), hf_name


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_config_equals_the_directory_s(
    name: str, converted: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    from_dir = load_model_config(request.getfixturevalue(name))
    from_gguf = load_model_config(converted[name])
    assert from_gguf == from_dir.__class__(**{**from_dir.__dict__, "torch_dtype": None})


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_engine_serves_the_gguf_as_the_directory(
    name: str, converted: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    prompts = mixed_prompts(4, vocab=512, seed=5, lengths=[1, 17, 64, 150])
    config = EngineConfig(kv_cache_bytes=64 * 8192, max_num_batched_tokens=64)
    expected = _generate(LLMEngine(request.getfixturevalue(name), config), prompts)
    assert _generate(LLMEngine(converted[name], config), prompts) == expected
    # In the arena: named after the file's stem, weights sized and placed from the GGUF.
    in_arena = LLMEngine(converted[name], config, memory=MemoryManager(Arena(8 * 1024**2)))
    assert in_arena.model_name == name
    assert _generate(in_arena, prompts) == expected


def test_quantized_weights_load_close_to_the_originals(llama_gqa_dir: Path, tmp_path: Path) -> None:
    path = gguf_from_hf_dir(llama_gqa_dir, tmp_path / "q8.gguf", quant=gguf.GGMLQuantizationType.Q8_0)
    expected = {n: t for _, n, t in iter_safetensors(llama_gqa_dir)}
    for _, name, tensor in iter_gguf(path):
        # Q8_0: 8-bit values with one scale per 32, so within 1/127 of each block's largest magnitude.
        torch.testing.assert_close(
            tensor, expected[name], atol=float(expected[name].abs().max()) / 100, rtol=0
        )
    loaded = load_model(path, dtype="bfloat16")
    assert loaded.model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_weight_specs_match_the_directory_s(converted: dict[str, Path], llama_gqa_dir: Path) -> None:
    by_name = {s.name: s for s in checkpoint_tensor_specs(converted["llama_gqa_dir"], "bfloat16")}
    assert by_name == {s.name: s for s in checkpoint_tensor_specs(llama_gqa_dir, "bfloat16")}
    assert weight_bytes_of(converted["llama_gqa_dir"]) == weight_bytes_of(llama_gqa_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_from_metadata_encodes_as_tokenizer_json(
    text: str, converted: dict[str, Path], llama_gqa_dir: Path
) -> None:
    ours = load_model(converted["llama_gqa_dir"]).tokenizer
    assert ours is not None
    reference = Tokenizer(llama_gqa_dir)
    ids = ours.encode(text)
    assert ids == reference.encode(text)
    assert ids[0] == 1  # tokenizer.ggml.add_bos_token: <s> added, as the HF tokenizer adds it
    assert ours.decode(ids) == text
    assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)


def _generate(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY, detokenize=False)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens
