"""The OpenAI-compatible HTTP API's routes (FastAPI): chat and text completions, embeddings, models,
health and metrics. Every route runs the gateway's own request path (router.py) through Front."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from services.gateway.openai import embeddings
from services.gateway.openai.errors import HttpError
from services.gateway.openai.front import Front
from services.gateway.openai.generation import CHAT, COMPLETIONS, generate
from services.gateway.openai.schemas import ModelCard, ModelList
from services.gateway.router import Timeout

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"
EMBEDDINGS_ROUTE = "/v1/embeddings"
MODELS_ROUTE = "/v1/models"
MODEL_ROUTE = MODELS_ROUTE + "/{model}"
ROUTES = frozenset({CHAT_ROUTE, COMPLETIONS_ROUTE, EMBEDDINGS_ROUTE, MODELS_ROUTE})
UNTRACED_PATHS = "/health$,/metrics$"  # probes and scrapes: regular expressions on the URL


def build_app(front: Front) -> FastAPI:
    """The ASGI app; routes read their bodies themselves (size limit, OpenAI-shaped 400s), so FastAPI
    only routes: no OpenAPI schema or docs to serve."""
    app = FastAPI(title="Hanzo inference mesh", openapi_url=None, docs_url=None, redoc_url=None)

    @app.post(CHAT_ROUTE)
    async def chat_completions(request: Request) -> Response:
        return await front.respond(CHAT_ROUTE, request, lambda r: generate(front, CHAT, r))

    @app.post(COMPLETIONS_ROUTE)
    async def text_completions(request: Request) -> Response:
        return await front.respond(COMPLETIONS_ROUTE, request, lambda r: generate(front, COMPLETIONS, r))

    @app.post(EMBEDDINGS_ROUTE)
    async def create_embeddings(request: Request) -> Response:
        return await front.respond(EMBEDDINGS_ROUTE, request, lambda r: embeddings.create(front, r))

    @app.get(MODELS_ROUTE)
    async def list_models(request: Request) -> Response:
        return await front.respond(MODELS_ROUTE, request, lambda r: _models(front, r, None))

    @app.get(MODELS_ROUTE + "/{model:path}")
    async def retrieve_model(request: Request, model: str) -> Response:
        return await front.respond(MODELS_ROUTE, request, lambda r: _models(front, r, model))

    @app.get("/health")
    async def health() -> Response:
        """No key needed (probes): 200 while serving, 503 once the gateway is stopping."""
        return Response(status_code=200 if front.serving else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        """The gateway's Prometheus registry, as vLLM serves its own on the API port."""
        return Response(generate_latest(front.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own errors (unknown path, wrong method) in OpenAI's shape too."""
        status = exc.status_code if isinstance(exc, HTTPException) else 400
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        error = HttpError(status, f"{request.method} {request.url.path}: {detail}")
        return Response(error.json(), status, getattr(exc, "headers", None), "application/json")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, http_error)
    if front.recording:  # without a recording tracer Front carries a caller's trace itself, for less
        app.add_middleware(
            OpenTelemetryMiddleware,
            tracer=front.tracer,
            excluded_urls=UNTRACED_PATHS,
            default_span_details=span_details,
            exclude_spans=["receive", "send"],  # a span per SSE event would outnumber the rest
        )
    return app


def span_details(scope: Scope) -> tuple[str, dict[str, str]]:
    """The SERVER span's name and route, `POST /v1/chat/completions` as OpenTelemetry's HTTP conventions
    name it: the route's template, never the path (one model's card is GET /v1/models/{model})."""
    method, path = scope.get("method", "HTTP"), scope.get("path", "")
    route = MODEL_ROUTE if path.startswith(MODELS_ROUTE + "/") else path if path in ROUTES else None
    if route is None:  # an unknown path: the method alone, so a scan cannot mint span names
        return method, {}
    return f"{method} {route}", {"http.route": route}


async def _models(front: Front, request: Request, model: str | None) -> Response:
    """Every model the mesh serves (OpenAI's list), or the one named (404 when none serves it)."""
    front.authorize(request)
    listed = await front.router.list_models(Timeout(front.settings.pick_timeout_s))
    cards = [ModelCard.model_construct(id=m.name, object="model", created=front.started, owned_by="hanzo")
             for m in listed.models if model is None or m.name == model]  # fmt: skip
    if model is None:
        body = ModelList.model_construct(object="list", data=cards).model_dump_json()
    elif cards:
        body = cards[0].model_dump_json()
    else:
        raise HttpError(404, f"model {model!r} is not served here", param="model", code="model_not_found")
    return Response(body, 200, media_type="application/json")
