"""The worker's inference engine: continuous batching over a paged KV cache.

The facade below (vLLM's names: LLM, SamplingParams, ...) is resolved on first use (PEP 562): the
scheduler, the policy, sequences and errors are torch-free, and code that needs only them (the policy's
tests, the fleet simulator) must not import torch through this package. SamplingParams lives in
services/common/sampling.py (the gateway validates with it) and is part of the engine's API as vLLM's
is of vLLM's."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.common.sampling import SamplingParams
    from services.worker.engine.config import EngineConfig
    from services.worker.engine.errors import EngineError, InvalidRequestError
    from services.worker.engine.llm import LLM, CompletionOutput
    from services.worker.engine.llm_engine import LLMEngine
    from services.worker.engine.outputs import RequestOutput

_HOMES = {
    "LLM": "llm",
    "CompletionOutput": "llm",
    "EngineConfig": "config",
    "EngineError": "errors",
    "InvalidRequestError": "errors",
    "LLMEngine": "llm_engine",
    "RequestOutput": "outputs",
    "SamplingParams": "services.common.sampling",
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
    return getattr(importlib.import_module(home if "." in home else f"{__name__}.{home}"), name)
