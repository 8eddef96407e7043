"""Arena: one buffer at construction, typed zero-copy views into it, and how it is sized per device."""

from __future__ import annotations

import math

import pytest
import torch

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena, cuda_arena_bytes
from services.worker.memory.errors import ArenaConfigError, InvalidViewError


def test_cpu_arena_has_its_budget() -> None:
    arena = Arena.for_device("cpu", byte_budget=4096)
    assert arena.total_bytes == 4096
    assert arena.device == torch.device("cpu")


def test_typed_view_shares_the_arena_bytes() -> None:
    arena = Arena(4096)
    weights = arena.view(ByteRange(256, 64), torch.float32, (4, 4))
    weights.fill_(1.5)
    raw = arena.view(ByteRange(256, 64), torch.uint8, (64,))
    assert torch.equal(raw, torch.full((16,), 1.5).view(torch.uint8))
    raw[:4] = torch.tensor([0, 0, 0x80, 0x3F], dtype=torch.uint8)  # 1.0 in little-endian float32
    assert weights[0, 0].item() == 1.0
    for view in (weights, raw):
        assert view.untyped_storage().data_ptr() == arena.data_ptr
        assert view.data_ptr() == arena.data_ptr + 256


@pytest.mark.parametrize(
    ("dtype", "shape", "offset"),
    [
        (torch.bfloat16, (3, 5), 2),
        (torch.float16, (8,), 512),
        (torch.int64, (2, 2, 2), 1024),
        (torch.float32, (0,), 0),  # an empty view is allowed
        (torch.uint8, (4096,), 0),  # the whole arena
    ],
)
def test_views_of_each_dtype_have_the_asked_shape(
    dtype: torch.dtype, shape: tuple[int, ...], offset: int
) -> None:
    arena = Arena(4096)
    nbytes = dtype.itemsize * math.prod(shape)
    view = arena.view(ByteRange(offset, nbytes), dtype, shape)
    assert view.dtype == dtype and tuple(view.shape) == shape and view.is_contiguous()


@pytest.mark.parametrize(
    ("byte_range", "dtype", "shape", "message"),
    [
        (ByteRange(4000, 256), torch.uint8, (256,), "ends past"),
        (ByteRange(4096, 4), torch.float32, (1,), "ends past"),
        (ByteRange(0, 64), torch.float32, (4, 5), "needs 80"),
        (ByteRange(0, 64), torch.float32, (4, 3), "needs 48"),
        (ByteRange(2, 16), torch.float32, (4,), "not a multiple"),
        (ByteRange(1, 2), torch.bfloat16, (1,), "not a multiple"),
        (ByteRange(4, 16), torch.int64, (2,), "not a multiple"),
        (ByteRange(0, 16), torch.float32, (-1, 4), "non-negative"),
    ],
)
def test_bad_views_are_refused(
    byte_range: ByteRange, dtype: torch.dtype, shape: tuple[int, ...], message: str
) -> None:
    arena = Arena(4096)
    with pytest.raises(InvalidViewError, match=message):
        arena.view(byte_range, dtype, shape)


def test_views_never_allocate_or_move_the_arena() -> None:
    arena = Arena(1 << 16)
    ptr, total = arena.data_ptr, arena.total_bytes
    for i in range(200):
        view = arena.view(ByteRange(256 * (i % 64), 256), torch.float16, (8, 16))
        view.add_(1)
        assert view.untyped_storage().data_ptr() == ptr
        assert view.untyped_storage().nbytes() == total  # a view's storage is the whole arena, not a copy
    assert (arena.data_ptr, arena.total_bytes) == (ptr, total)


@pytest.mark.parametrize(
    ("device", "kwargs", "message"),
    [
        ("cpu", {}, "needs a byte budget"),
        ("cpu", {"fraction": 0.5}, "only measured on CUDA"),
        ("cpu", {"fraction": 0.5, "byte_budget": 1024}, "not both"),
        ("cpu", {"byte_budget": 0}, "must be positive"),
        ("cpu", {"fraction": 0.0}, r"\(0, 1\]"),
        ("cuda", {"fraction": 1.5}, r"\(0, 1\]"),
        ("cuda", {"fraction": -0.1}, r"\(0, 1\]"),
    ],
)
def test_for_device_rejects_bad_sizing(device: str, kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ArenaConfigError, match=message) as info:
        Arena.for_device(device, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)  # config errors are ValueErrors too


def test_constructor_rejects_an_empty_arena() -> None:
    with pytest.raises(ArenaConfigError):
        Arena(0)


class _SizeRecorder(Arena):
    """Records the size for_device chose instead of allocating, so the CUDA sizing runs without a GPU."""

    def __init__(self, total_bytes: int, device: torch.device | str = "cpu") -> None:
        self.chosen = (total_bytes, torch.device(device))


FREE, TOTAL = 3_000_000, 4_000_000  # a GPU of which another process holds a quarter


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"fraction": 0.5}, 2_000_000),  # shares of the total, not of what is free
        ({"fraction": 0.75}, 3_000_000),
        ({"fraction": 0.25}, 1_000_000),
        ({"byte_budget": 4096}, 4096),
    ],
)
def test_cuda_sizing_takes_shares_of_total_memory(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, float], expected: int
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (FREE, TOTAL))
    arena = _SizeRecorder.for_device("cuda:0", **kwargs)  # type: ignore[arg-type]
    assert arena.chosen == (expected, torch.device("cuda:0"))  # type: ignore[attr-defined]


def test_two_workers_sharing_a_gpu_get_the_same_arenas_in_either_start_order() -> None:
    first = cuda_arena_bytes(0.45, free=TOTAL, total=TOTAL)
    second = cuda_arena_bytes(0.45, free=TOTAL - first, total=TOTAL)  # the first one's arena is taken
    assert first == second == 1_800_000  # shares of free memory gave 1.8 MB and 0.99 MB, by who came first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs a fraction"),
        ({"byte_budget": 3_500_000}, "exceeds"),
        ({"fraction": 0.9}, "another process holds the rest"),
        ({"fraction": 1e-9}, "no memory"),
    ],
)
def test_cuda_sizing_errors(monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, float], message: str) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (FREE, TOTAL))
    with pytest.raises(ArenaConfigError, match=message):
        _SizeRecorder.for_device("cuda:0", **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_arena_views() -> None:
    arena = Arena.for_device("cuda", fraction=0.01)
    view = arena.view(ByteRange(512, 1024), torch.bfloat16, (16, 32))
    view.fill_(2.0)
    assert view.untyped_storage().data_ptr() == arena.data_ptr
    assert arena.view(ByteRange(512, 2), torch.bfloat16, (1,)).item() == 2.0
