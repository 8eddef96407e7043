"""The worker's inference engine: continuous batching over a paged KV cache.

Names are resolved on first use (PEP 562), so a process that only needs the light modules (the gateway
validates with the errors and sampling parameters) does not import torch and carry its objects."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.worker.engine.config import EngineConfig
    from services.worker.engine.errors import EngineError, InvalidRequestError
    from services.worker.engine.llm import LLM, CompletionOutput
    from services.worker.engine.llm_engine import LLMEngine
    from services.worker.engine.outputs import RequestOutput
    from services.worker.engine.sampling_params import SamplingParams

_HOMES = {
    "LLM": "llm",
    "CompletionOutput": "llm",
    "EngineConfig": "config",
    "EngineError": "errors",
    "InvalidRequestError": "errors",
    "LLMEngine": "llm_engine",
    "RequestOutput": "outputs",
    "SamplingParams": "sampling_params",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "EngineError",
    "InvalidRequestError",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
