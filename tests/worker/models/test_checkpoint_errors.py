"""Broken checkpoints fail with a CheckpointError naming the file and the problem; good ones load."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.worker.models.checkpoint import iter_safetensors
from services.worker.models.errors import CheckpointError
from services.worker.models.loader import load_model, parse_dtype
from services.worker.models.synthetic import make_decoder_checkpoint

# Per model kind: the fixture with its checkpoint and a tensor in it to damage.
KINDS = {
    "decoder": ("llama_gqa_dir", "model.layers.1.mlp.up_proj.weight"),
    "encoder": ("minilm_dir", "encoder.layer.1.intermediate.dense.weight"),
}


def clone(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint made of symlinks (cheap for the 90 MB MiniLM); replace files to edit."""
    dst.mkdir()
    for item in src.iterdir():
        (dst / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    return dst


def rewrite(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Rewrite one safetensors file (behind its symlink) with edit applied to its tensors."""
    tensors = load_file(path)
    edit(tensors)
    path.unlink()
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.fixture(params=sorted(KINDS))
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """(an editable clone of a good checkpoint, the name of a tensor in it), for each model kind."""
    fixture, tensor = KINDS[request.param]
    return clone(request.getfixturevalue(fixture), tmp_path / "m"), tensor


def load_error(model_dir: Path) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_model(model_dir)
    print(info.value)  # shown with -s: the message a person would read
    return info.value


def test_missing_config(broken: tuple[Path, str]) -> None:
    model_dir, _ = broken
    (model_dir / "config.json").unlink()
    err = load_error(model_dir)
    assert err.path == model_dir / "config.json" and "file not found" in str(err)


def test_unknown_architecture(broken: tuple[Path, str]) -> None:
    model_dir, _ = broken
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").unlink()
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    err = load_error(model_dir)
    assert err.path.name == "config.json" and "GPT2LMHeadModel" in str(err) and "supported" in str(err)


def test_missing_safetensors(broken: tuple[Path, str]) -> None:
    model_dir, _ = broken
    (model_dir / "model.safetensors").unlink()
    err = load_error(model_dir)
    assert err.path == model_dir and "no *.safetensors file" in str(err)


def test_wrong_shape(broken: tuple[Path, str]) -> None:
    model_dir, name = broken
    rewrite(model_dir / "model.safetensors", lambda t: t.update({name: t[name][:-1].clone()}))
    err = load_error(model_dir)
    assert err.path.name == "model.safetensors"
    assert f"tensor '{name}' has shape" in str(err) and "expected" in str(err)


def test_missing_tensor(broken: tuple[Path, str]) -> None:
    model_dir, name = broken
    rewrite(model_dir / "model.safetensors", lambda t: t.pop(name))
    err = load_error(model_dir)
    assert err.path == model_dir and f"missing tensor '{name}'" in str(err)


def test_unexpected_tensor(broken: tuple[Path, str]) -> None:
    model_dir, _ = broken
    alien = "transformer.h.0.attn.c_attn.weight"  # a GPT-2 tensor: the checkpoint is not what config says
    rewrite(model_dir / "model.safetensors", lambda t: t.update({alien: torch.ones(2)}))
    err = load_error(model_dir)
    assert err.path.name == "model.safetensors" and alien in str(err)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(broken: tuple[Path, str], damage: str) -> None:
    model_dir, _ = broken
    path = model_dir / "model.safetensors"
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(b"\x00not a safetensors file" if damage == "garbage" else data[: len(data) // 2])
    err = load_error(model_dir)
    assert err.path == path and "safetensors" in str(err)


def test_encoder_needs_tokenizer(minilm_dir: Path, tmp_path: Path) -> None:
    model_dir = clone(minilm_dir, tmp_path / "m")
    (model_dir / "tokenizer.json").unlink()
    err = load_error(model_dir)
    assert err.path == model_dir / "tokenizer.json"


def test_decoder_loads_without_tokenizer(llama_gqa_dir: Path, tmp_path: Path) -> None:
    model_dir = clone(llama_gqa_dir, tmp_path / "m")
    (model_dir / "tokenizer.json").unlink()
    assert load_model(model_dir).tokenizer is None


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Same arguments as conftest's llama_gqa_dir, so the weights are identical, just split up.
    return make_decoder_checkpoint(
        tmp_path_factory.mktemp("sharded") / "model",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        max_shard_size="100KB",
    )


def test_sharded_loads_like_single_file(sharded_dir: Path, llama_gqa_dir: Path) -> None:
    index = json.loads((sharded_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (sharded_dir / "model.safetensors").exists()
    sharded, single = load_model(sharded_dir).model.state_dict(), load_model(llama_gqa_dir).model.state_dict()
    assert sharded.keys() == single.keys()
    for key, value in single.items():
        torch.testing.assert_close(sharded[key], value, rtol=0, atol=0)


def test_shard_listed_but_missing(sharded_dir: Path, tmp_path: Path) -> None:
    model_dir = clone(sharded_dir, tmp_path / "m")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (model_dir / shard).unlink()
    err = load_error(model_dir)
    assert err.path == model_dir / shard
    assert "model.safetensors.index.json" in str(err) and "missing" in str(err)


def test_iter_safetensors_names_each_file(sharded_dir: Path) -> None:
    index = json.loads((sharded_dir / "model.safetensors.index.json").read_text())
    seen = {name: Path(file).name for file, name, _ in iter_safetensors(sharded_dir)}
    assert seen == index["weight_map"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), (torch.float16, torch.float16)],
)
def test_dtype(value: str | torch.dtype, expected: torch.dtype) -> None:
    assert parse_dtype(value) == expected


@pytest.mark.parametrize("value", ["fp8", "int8", torch.int8, "auto"])
def test_bad_dtype(value: str | torch.dtype, llama_gqa_dir: Path) -> None:
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        load_model(llama_gqa_dir, dtype=value)


def test_make_checkpoint_is_idempotent(llama_gqa_dir: Path, tmp_path: Path) -> None:
    before = (llama_gqa_dir / "model.safetensors").stat().st_mtime_ns
    tiny = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2}  # as conftest
    make_decoder_checkpoint(llama_gqa_dir, **tiny)
    assert (llama_gqa_dir / "model.safetensors").stat().st_mtime_ns == before
    foreign = tmp_path / "not_ours"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        make_decoder_checkpoint(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
