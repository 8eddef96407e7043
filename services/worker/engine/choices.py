"""Several choices from one prompt (SamplingParams.n), each its own engine request, with the prompt's KV
computed once.

Choice 0 goes first. Its first output means its prompt has been computed and the prompt's full blocks
are registered in the prefix cache; only then are choices 1 to n-1 added, so each finds those blocks
cached and computes only the prompt's last partial block before sampling. Added together, every choice
would compute the whole prompt in the same step, since a block enters the cache only once computed.
The price is that the later choices start a step after the first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from services.common.sampling import SamplingParams
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.outputs import RequestOutput
from services.worker.engine.policy.classes import DEFAULT_HINTS, SchedulingHints

_END = object()  # one choice's stream has ended


def choice_request_id(request_id: str, index: int, n: int) -> str:
    """The engine's id for one choice: the request's own id when there is one choice."""
    return request_id if n == 1 else f"{request_id}#{index}"


async def generate_choices(
    llm: AsyncLLM,
    prompt: str | list[int],
    params: SamplingParams,
    request_id: str,
    hints: SchedulingHints = DEFAULT_HINTS,
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, output) for each of params.n choices, interleaved as they come; the errors of
    AsyncLLM.generate, raised by whichever choice meets one (the others are then aborted). Leaving the
    iteration early aborts every choice at once."""
    n = params.n
    if n == 1:
        async for out in llm.generate(prompt, params, request_id=request_id, hints=hints):
            yield 0, out
        return
    first = llm.generate(prompt, params.choice(0), choice_request_id(request_id, 0, n), hints)
    try:
        opening = await anext(first)  # bad input or a refusal is raised here, before any other is added
    except BaseException:
        await first.aclose()
        raise
    try:
        yield 0, opening
    except BaseException:  # the caller left before the other choices were added: abort the first
        await first.aclose()
        raise
    queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | object] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    streams = [first] + [
        llm.generate(prompt, params.choice(i), choice_request_id(request_id, i, n), hints)
        for i in range(1, n)
    ]
    tasks = [
        asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams) if i or not opening.finished
    ]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()  # a choice still streaming aborts its request as its generator closes
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if opening.finished:
            await first.aclose()
