"""Clients of a test mesh's OpenAI-compatible HTTP front: the official SDK and raw httpx (openai's own
httpx2), an SSE reader, and the checks that a worker's KV is back to idle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import openai
from prometheus_client import CollectorRegistry

from tests.mesh_e2e.conftest import API_KEY, Mesh, running_mesh
from tests.placer.cluster_helpers import eventually

AUTH_HEADER = {"authorization": f"Bearer {API_KEY}"}
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Tell me about the sea."},
]


def sdk(mesh: Mesh, api_key: str = API_KEY) -> openai.AsyncOpenAI:
    """The official async client on the mesh's HTTP front; no retries, so each status is seen as sent."""
    return openai.AsyncOpenAI(
        base_url=f"http://{mesh.gateway.http_address}/v1", api_key=api_key, max_retries=0
    )


def http(mesh: Mesh, headers: dict[str, str] | None = None) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        base_url=f"http://{mesh.gateway.http_address}", headers=AUTH_HEADER if headers is None else headers
    )


def sse_data(text: str) -> list[str]:
    """The data fields of an SSE body, checking its framing: every event is one `data: ` line followed
    by a blank line, nothing else."""
    assert text.endswith("\n\n"), text[-80:]
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]


def chunks_of(data: list[str]) -> list[dict[str, Any]]:
    """The JSON chunks before [DONE] (which must end the stream)."""
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def requests_counted(registry: CollectorRegistry, method: str, workload: str, code: str = "OK") -> float:
    labels = {"method": method, "workload_class": workload, "code": code, "transport": "http"}
    return registry.get_sample_value("hanzo_gateway_requests_total", labels) or 0.0


async def kv_idle(mesh: Mesh, what: str) -> None:
    """Waits (bounded) until no worker holds KV blocks or running sequences for any model."""

    async def idle() -> bool:
        return all(
            m.kv_blocks_used == 0 and m.running == 0 for w in mesh.workers for m in w.servicer.stats().models
        )

    await eventually(idle, 10, what)


def shared_mesh(redis_url: str, model_dirs: dict[str, Path], **gateway: object) -> Any:
    """The mesh one module's tests share: two workers, the HTTP front on a free port."""
    return running_mesh(redis_url, model_dirs, gateway_overrides=gateway or None)
