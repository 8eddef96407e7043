"""POST /v1/embeddings: texts embedded by the gateway's Embed path, in OpenAI's list shape, as float
lists or (encoding_format=base64, what OpenAI's SDKs ask for by default) base64 of float32 bytes."""

from __future__ import annotations

import base64
import sys
from array import array

from starlette.requests import Request
from starlette.responses import Response

from hanzo.inference.v1 import inference_pb2
from services.gateway.openai.errors import invalid
from services.gateway.openai.front import Front
from services.gateway.openai.schemas import EmbeddingData, EmbeddingList, EmbeddingRequest, Usage


async def create(front: Front, request: Request) -> Response:
    """The embeddings of the body's input (typed errors raised, answered by Front.respond)."""
    body = await front.parse(request, EmbeddingRequest)
    if body.dimensions is not None:
        raise invalid("dimensions", "is not supported: the model's own size is served")
    message = inference_pb2.EmbedRequest(model=body.model, inputs=_texts(body.input))
    deadline = front.deadline(request)
    embedding = front.router.embed(message, deadline, front.tallies["Embed"])
    reply = await front.guarded(request, embedding, deadline)
    encode = _base64 if body.encoding_format == "base64" else list
    listed = EmbeddingList.model_construct(
        object="list",
        data=[
            EmbeddingData.model_construct(object="embedding", index=e.index, embedding=encode(e.values))
            for e in reply.data
        ],
        model=body.model,
        usage=Usage.model_construct(
            prompt_tokens=reply.usage.prompt_tokens,
            completion_tokens=0,
            total_tokens=reply.usage.prompt_tokens,
            prompt_tokens_details=None,
        ),
    )
    return Response(listed.model_dump_json(exclude_none=True), 200, media_type="application/json")


def _texts(value: str | list) -> list[str]:
    """The texts to embed; token-id input is refused (workers embed text)."""
    if isinstance(value, str):
        return [value]
    if any(not isinstance(item, str) for item in value):
        raise invalid("input", "token ids are not supported; send text (a string or a list of strings)")
    return value


def _base64(values: object) -> str:
    """OpenAI's base64 encoding: the vector's little-endian float32 bytes."""
    floats = array("f", values)  # type: ignore[call-overload]
    if sys.byteorder == "big":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode()
