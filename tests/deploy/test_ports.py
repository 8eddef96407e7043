"""Compose publishes what each service listens on and nothing else; the gateway's OpenAI-compatible HTTP
front is reachable where the manifests deploy it (published by compose, exposed by the pod and its
Service)."""

from __future__ import annotations

from tests.deploy.manifests import (
    IMAGE_WORKDIR,
    K8S_DOCS,
    TELEMETRY,
    compose_argv,
    compose_env,
    compose_services,
    container_port,
    grpc_port,
    http_port,
    interpolate,
    k8s_env,
    mesh_containers,
    mesh_services,
    metrics_port,
    module_of,
)


def test_compose_ports_match_the_services_settings() -> None:
    for name, svc in mesh_services().items():
        module = module_of(compose_argv(svc))
        env = compose_env(svc)
        published = {container_port(p) for p in svc.get("ports", [])}
        if module == TELEMETRY:
            assert not published, f"{name}: telemetry listens on nothing"
            continue
        port = grpc_port(module, env)
        health_target = interpolate(" ".join(svc["healthcheck"]["test"]))
        assert f"{IMAGE_WORKDIR}/deploy/healthcheck.py 127.0.0.1:{port}" in health_target, name
        allowed = {port, metrics_port(module, env), http_port(module, env)}
        assert published <= allowed, f"{name} publishes {published}, it listens on {allowed}"
        if metrics_port(module, env) is not None:
            assert metrics_port(module, env) in published, f"{name}: publish the metrics port"
    gateway = next(iter(mesh_services("services.gateway").values()))
    assert grpc_port("services.gateway", compose_env(gateway)) in {
        container_port(p) for p in gateway["ports"]
    }, "the gateway is the public endpoint"
    host_ports = [p.split(":")[0] for s in compose_services().values() for p in map(str, s.get("ports", []))]
    assert len(host_ports) == len(set(host_ports)), f"a host port is published twice: {host_ports}"


def test_compose_publishes_the_gateways_http_front() -> None:
    gateway = next(iter(mesh_services("services.gateway").values()))
    port = http_port("services.gateway", compose_env(gateway))
    assert port is not None, "the gateway serves no HTTP front"
    assert port in {container_port(p) for p in gateway["ports"]}


def test_k8s_exposes_the_gateways_http_front_through_its_service() -> None:
    _, container = next(iter(mesh_containers("services.gateway")))
    port = http_port("services.gateway", k8s_env(container))
    assert port is not None, "the gateway serves no HTTP front"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["http"] == port
    service = next(d for d in K8S_DOCS if d["kind"] == "Service" and d["metadata"]["name"] == "gateway")
    assert {"name": "http", "port": port, "targetPort": "http"} in service["spec"]["ports"]
