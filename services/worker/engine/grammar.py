"""Structured output for one model: requests' StructuredOutput compiled into token grammars with
xgrammar (the library vLLM uses), cached per spec, and each step a bitmask over the vocabulary for the
rows that follow one.

Compiling takes milliseconds to seconds for a large schema, so it never runs on the engine thread:
AsyncLLM compiles on COMPILE_EXECUTOR before it hands a request to the thread (compile() is
thread-safe; xgrammar releases the GIL), and a step only fills and applies masks, a few microseconds
a row. Whatever the compiler
refuses is InvalidRequestError with its reason.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from services.common.sampling import SamplingParams
from services.common.structured import FIELD, StructuredOutput, StructureKind
from services.worker.engine.errors import InvalidRequestError

if TYPE_CHECKING:
    from services.worker.models.tokenizer import Tokenizer

CACHE_SIZE = 256  # compiled grammars kept per model (a schema is typically reused by many requests)
COMPILE_NICENESS = 19  # the compiling thread's nice value: a step's threads come first on a busy CPU


def _lower_priority() -> None:
    """Run the calling thread (Linux: each thread has its own nice value) after everything else."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not permitted: full priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)


# Where AsyncLLM compiles grammars: one thread, at the lowest priority. xgrammar releases the GIL while
# it compiles, but it still takes a core; on this 2-core machine a compiling thread at normal priority
# made concurrent decode steps 3x slower (bench/sampling_controls.py), so it yields to them instead:
# under a saturated CPU a new schema waits for idle time, while cached ones cost nothing.
COMPILE_EXECUTOR = concurrent.futures.ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="grammar-compile", initializer=_lower_priority
)


@functools.cache
def _xgrammar() -> Any:
    """The xgrammar module, imported on first use (the engine runs without it until a request asks)."""
    import xgrammar

    return xgrammar


class GrammarCompiler:
    """Compiles and caches grammars for one tokenizer and vocabulary."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        from transformers import PreTrainedTokenizerFast

        xgr = _xgrammar()
        wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
        info = xgr.TokenizerInfo.from_huggingface(
            wrapped, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: OrderedDict[StructuredOutput, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutput) -> Any:
        """spec's compiled grammar (an xgrammar CompiledGrammar); InvalidRequestError with the
        compiler's reason when it cannot be compiled."""
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
                return compiled
        compiled = self._compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: StructuredOutput) -> Any:
        compiler = self._compiler
        try:
            if spec.kind is StructureKind.JSON_OBJECT:
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind is StructureKind.JSON_SCHEMA:
                # Compact JSON (no free whitespace between tokens): a weak model could otherwise emit
                # whitespace until max_tokens, as vLLM's disable-any-whitespace option guards against.
                return compiler.compile_json_schema(spec.spec, any_whitespace=False, strict_mode=spec.strict)
            if spec.kind is StructureKind.REGEX:
                return compiler.compile_regex(spec.spec)
            ebnf = "root ::= " + " | ".join(_ebnf_string(choice) for choice in spec.choices)
            return compiler.compile_grammar(ebnf)
        except (RuntimeError, ValueError) as err:
            reason = str(err).splitlines()[-1] if str(err) else type(err).__name__
            raise InvalidRequestError(FIELD, f"cannot be compiled into a grammar: {reason}") from None

    def matcher(self, compiled: Any) -> Any:
        """A fresh matcher (one per request: it follows that request's output)."""
        return _xgrammar().GrammarMatcher(compiled)


class ModelGrammars:
    """One model's grammars: the compiler, built on the first structured request (xgrammar reads the
    whole vocabulary, a fifth of a second for SmolLM2's)."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = tuple(stop_token_ids)
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def compile(self, params: SamplingParams) -> Any:
        """params.structured compiled (cached per spec), None without one; thread-safe. InvalidRequestError
        when the model has no tokenizer or the spec cannot compile."""
        if params.structured is None:
            return None
        return self._compiler_once().compile(params.structured)

    def matcher(self, params: SamplingParams, compiled: Any = None) -> Any:
        """A new matcher for a request with params (compiled: its grammar if compiled already), or None
        for free text."""
        if params.structured is None:
            return None
        return self._compiler_once().matcher(compiled if compiled is not None else self.compile(params))

    def _compiler_once(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                if self._tokenizer is None:
                    raise InvalidRequestError(
                        FIELD, "this model has no tokenizer.json to build a grammar for"
                    )
                self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size, self._stop_token_ids)
            return self._compiler


class GrammarMasks:
    """The step's bitmask buffer, and the two steps a constrained row takes around sampling."""

    def __init__(self) -> None:
        self._bitmask: torch.Tensor | None = None
        self._width = 0  # the logits' width the bitmask was allocated for

    def apply(self, logits: torch.Tensor, matchers: list[tuple[int, Any]]) -> None:
        """Mask (to -inf) every token that would leave a row's grammar; matchers: (row, matcher)."""
        xgr = _xgrammar()
        rows, width = logits.shape
        if self._bitmask is None or self._bitmask.shape[0] < rows or self._width != width:
            self._bitmask = xgr.allocate_token_bitmask(max(rows, 8), width)
            self._width = width
        for row, matcher in matchers:
            matcher.fill_next_token_bitmask(self._bitmask, row)
        indices = [row for row, _ in matchers]
        xgr.apply_token_bitmask_inplace(logits, self._bitmask[:rows], indices=indices)

    @staticmethod
    def accept(matchers: list[tuple[int, Any]], tokens: list[int]) -> None:
        """Advance each row's matcher past its sampled token."""
        for row, matcher in matchers:
            if not matcher.is_terminated():
                matcher.accept_token(tokens[row])


def _ebnf_string(text: str) -> str:
    """text as an EBNF string literal (xgrammar's escapes are JSON's)."""
    return json.dumps(text)
