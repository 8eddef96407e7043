"""A real Prometheus (`hanzo-mesh serve --prometheus`) scraping a running mesh: after chat, completion
and refused requests over gRPC and HTTP, every dashboard panel's and rule's query parses and, where the
traffic makes its series, answers; every family they read is one the services export; no alert of a
healthy mesh fires; and vLLM's own dashboard queries answer with their families swapped by the
documented mapping."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from hanzo.inference.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.deploy.observability import (
    Expression,
    dashboard_expressions,
    from_vllm,
    metric_families,
    recorded_names,
    rule_expressions,
    vllm_dashboard_queries,
)
from tests.mesh.test_serve import served

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is missing")

MODEL = "tiny"
# Panels whose series only an event this traffic never causes creates: a preemption, a queue refusal.
EVENT_ONLY = {"Preemptions and queue refusals per second by class"}
# Alerts a healthy mesh must not fire (the SLO burns depend on this machine's speed; throttling on the
# simulated GPU's temperature).
QUIET_WHEN_HEALTHY = {"WorkerNotHeartbeating", "RedisUnreachable", "MeshTargetDown"}
SCRAPED_S = 60  # a few scrapes and rule evaluations at one a second, on a loaded machine


def _api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return body["data"]


def _query(base: str, expression: Expression) -> list[dict[str, Any]]:
    try:
        return _api(base, "query", query=expression.promql)["result"]
    except urllib.error.HTTPError as err:  # 400: the expression does not parse or cannot be evaluated
        pytest.fail(f"{expression.where}: {err.read().decode()} in {expression.promql}")


def _send_traffic(gateway: str, openai_url: str, api_key: str) -> None:
    """Streamed chat over gRPC, chat and completions over HTTP, and refusals on both: a missing key, an
    unknown model."""
    openai = pytest.importorskip("openai")
    auth = (("authorization", f"Bearer {api_key}"),)
    chat = common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
    with grpc.insecure_channel(gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for i in range(4):
            request = inference_pb2.GenerateRequest(
                model=MODEL, prompt=f"Hello number {i}", workload_class=chat,
                sampling=inference_pb2.SamplingParams(max_tokens=6),
            )  # fmt: skip
            assert len(list(stub.Generate(request, metadata=auth, timeout=60))) >= 1
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(inference_pb2.GenerateRequest(model=MODEL, prompt="hi"), timeout=60))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=openai_url, api_key=api_key, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    [_ for _ in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, stream=True)]
    client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=6)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    stranger = openai.OpenAI(base_url=openai_url, api_key="wrong-key", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        stranger.completions.create(model=MODEL, prompt="hi", max_tokens=2)


def _wait_until_scraped(base: str) -> None:
    """Until Prometheus holds the traffic's last series and has evaluated the rules on them."""
    wanted = [
        Expression("the HTTP 401", 'hanzo_gateway_http_responses_total{status="401"}'),
        Expression("the chat error ratio", "hanzo:chat_ttft_slo_errors:ratio_rate5m"),
        Expression("the telemetry agent", "DCGM_FI_DEV_GPU_TEMP"),
        Expression(
            "the iteration tokens", f'hanzo_worker_iteration_tokens_total_count{{model_name="{MODEL}"}}'
        ),
        # Scraped twice: a rate over a window needs two samples of a series, and on a fast machine the
        # traffic's last series (created by its second token) can be one scrape old when the rest show.
        Expression(
            "the inter-token latencies, scraped twice",
            "count_over_time(hanzo_worker_inter_token_latency_seconds_count[15s]) >= 2",
        ),
    ]
    deadline = time.monotonic() + SCRAPED_S
    while missing := [w.where for w in wanted if not _query(base, w)]:
        assert time.monotonic() < deadline, f"Prometheus never showed {missing}"
        time.sleep(0.5)  # polling Prometheus: its scrapes and rule evaluations run on its own clock


def test_every_dashboard_and_alert_query_answers_against_the_running_mesh(
    tmp_path: Path, llama_gqa_dir: Path
) -> None:
    argv = [str(llama_gqa_dir), "--name", MODEL, "--port", "0", "--http-port", "0", "--max-model-len", "512"]
    with served(tmp_path, *argv, "--prometheus", "0") as lines:
        base = lines["prometheus"]
        _send_traffic(lines["gateway"], lines["openai"], lines["api key"])
        _wait_until_scraped(base)

        targets = _api(base, "targets")["activeTargets"]
        assert {t["labels"]["job"] for t in targets} == {
            "hanzo-gateway", "hanzo-placer", "hanzo-worker", "hanzo-telemetry"
        }  # fmt: skip
        assert all(t["health"] == "up" for t in targets), [(t["scrapeUrl"], t["lastError"]) for t in targets]

        # Refusals before any pick are counted by code on both fronts.
        for promql in (
            'grpc_server_handled_total{job="hanzo-gateway",grpc_code="UNAUTHENTICATED"}',
            'hanzo_gateway_http_responses_total{status="404"}',
        ):
            assert _query(base, Expression("refusal", promql)), promql

        # Prometheus keys a counter's metadata by its name without `_total`.
        exported = set(_api(base, "metadata")) | {"up"}
        for expression in dashboard_expressions() + rule_expressions():
            families = metric_families(expression.promql)
            unknown = {f for f in families if f not in exported and f.removesuffix("_total") not in exported}
            assert not unknown, f"{expression.where} reads {unknown}, which no service exports"

        answered = 0
        for expression in dashboard_expressions():
            result = _query(base, expression)
            answered += bool(result)
            if not any(title in expression.where for title in EVENT_ONLY):
                assert result, f"{expression.where} returned no series: {expression.promql}"

        recorded = {f"rule {name}" for name in recorded_names()}
        for expression in rule_expressions():
            result = _query(base, expression)
            if expression.where in recorded:
                assert result, f"{expression.where} recorded nothing from the chat traffic"
            if expression.where.removeprefix("rule ") in QUIET_WHEN_HEALTHY:
                assert not result, f"{expression.where} fires on a healthy mesh: {result}"

        groups = _api(base, "rules")["groups"]
        evaluated = [r for g in groups for r in g["rules"]]
        assert len(evaluated) == len(rule_expressions())
        assert all(r["health"] == "ok" for r in evaluated), [
            (r["name"], r.get("lastError")) for r in evaluated
        ]

        for vllm_query in vllm_dashboard_queries():
            expression = Expression(f"vLLM's {vllm_query}", from_vllm(vllm_query, MODEL))
            assert _query(base, expression), f"{expression.where} returned nothing as {expression.promql}"
        # What `pytest -s` shows of the run (the closing notes quote it).
        summary = {
            "targets_up": len(targets),
            "dashboard_queries": len(dashboard_expressions()),
            "dashboard_queries_answering": answered,
            "rules_evaluated_ok": len(evaluated),
            "vllm_queries_answering": len(vllm_dashboard_queries()),
        }
        print(json.dumps(summary))
