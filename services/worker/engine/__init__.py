"""The worker's inference engine: continuous batching over a paged KV cache."""

from services.worker.engine.config import EngineConfig
from services.worker.engine.errors import EngineError, InvalidRequestError
from services.worker.engine.llm import LLM, CompletionOutput
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.outputs import RequestOutput
from services.worker.engine.sampling_params import SamplingParams

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
