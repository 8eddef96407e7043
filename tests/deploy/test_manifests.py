"""deploy/ checked against the code: the Dockerfile, compose files and Kubernetes manifests name modules
that exist, set only env vars the services read, agree on ports, and gate on health. No Docker, no
cluster, no network."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.deploy.manifests import (
    CMD,
    COMPOSE,
    COMPOSE_CPU,
    DOCKERFILE,
    ENTRYPOINT,
    GRPC_PORTS,
    IMAGE_WORKDIR,
    K8S_DOCS,
    K8S_FILES,
    KUSTOMIZATION,
    ROOT,
    TELEMETRY,
    compose_argv,
    compose_env,
    compose_services,
    configmaps,
    container_port,
    containers,
    dockerfile_env,
    dockerfile_instructions,
    gpu_devices,
    grpc_port,
    interpolate,
    is_mesh,
    k8s_argv,
    k8s_env,
    mesh_containers,
    mesh_services,
    metrics_port,
    module_of,
    workloads,
)

# ---------------------------------------------------------------- modules and env vars


def command_modules() -> list[tuple[str, str]]:
    """(where, module) for every `python -m` module the deploy files start."""
    found = [("Dockerfile CMD", module_of([*ENTRYPOINT, *CMD]))]
    found += [(f"compose {n}", module_of(compose_argv(s))) for n, s in mesh_services().items()]
    found += [
        (f"k8s {w['metadata']['name']}/{c['name']}", module_of(k8s_argv(c))) for w, c in mesh_containers()
    ]
    protogen = re.search(r"python -m (\S+)", DOCKERFILE)
    assert protogen, "the Dockerfile generates the gRPC code with `python -m services.common.protogen`"
    found.append(("Dockerfile RUN", protogen.group(1)))
    return [(where, module or "(no -m module)") for where, module in found]


@pytest.mark.parametrize(("where", "module"), command_modules(), ids=lambda v: str(v))
def test_every_command_module_exists(where: str, module: str) -> None:
    path = ROOT.joinpath(*module.split("."))
    assert (path / "__main__.py").is_file() or path.with_suffix(".py").is_file(), (
        f"{where} runs `python -m {module}`, but {module.replace('.', '/')}/__main__.py does not exist"
    )


def hanzo_vars() -> dict[str, set[str]]:
    """Every HANZO_* variable the deploy files set -> where it is set."""
    where: dict[str, set[str]] = {}

    def add(names: Any, origin: str) -> None:
        for name in names:
            if name.startswith("HANZO_"):
                where.setdefault(name, set()).add(origin)

    add(dockerfile_env(), "Dockerfile")
    for origin, compose in (("compose", COMPOSE), ("compose.cpu", COMPOSE_CPU)):
        for name, svc in compose["services"].items():
            add(svc.get("environment") or {}, f"{origin}:{name}")
    for name, data in configmaps().items():
        add(data, f"k8s ConfigMap {name}")
    for w, c in containers():
        add((e["name"] for e in c.get("env", [])), f"k8s {w['metadata']['name']}/{c['name']}")
    return where


def reads_var(name: str) -> bool:
    """True when services/<svc>/ mentions the full name, or its prefix and the rest in one file.

    The settings modules build names (p = "HANZO_PLACER_"; p + "REDIS_URL"), and telemetry derives them
    from dataclass field names (ENV_PREFIX + "node_id".upper()), so the rest counts as a quoted
    string or, lower-cased, as a field name. A name of no service (HANZO_INTERNAL_TOKEN) is a setting
    they all share: services/common must name it in full.
    """
    service, rest = name.removeprefix("HANZO_").split("_", 1)
    prefix = f"HANZO_{service}_"
    package = ROOT / "services" / service.lower()
    if not package.is_dir():
        return any(name in path.read_text() for path in (ROOT / "services" / "common").rglob("*.py"))
    for path in package.rglob("*.py"):
        text = path.read_text()
        if name in text:
            return True
        if prefix in text and re.search(rf"[\"']{rest}[\"']|\b{rest.lower()}\b", text):
            return True
    return False


@pytest.mark.parametrize("name", sorted(hanzo_vars()))
def test_every_hanzo_env_var_is_read_by_its_service(name: str) -> None:
    service = name.split("_")[1].lower()
    assert reads_var(name), (
        f"{name} (set in {', '.join(sorted(hanzo_vars()[name]))}) is not read anywhere in services/{service}/"
    )


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_builds_one_image_for_every_service() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    text = " ".join(args for _, args in instructions)
    args = dict(a.split("=", 1) for name, a in instructions if name == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == "2.13.0"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu", "the default image is CPU"
    assert '"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"' in text
    copied = {a.split()[0].rstrip("/") for name, a in instructions if name == "COPY"}
    assert {"pyproject.toml", "protos", "services", "deploy/healthcheck.py"} <= copied
    assert 'pip install ".[build]"' in text
    assert "python -m services.common.protogen" in text
    workdir = [a for name, a in instructions if name == "WORKDIR"]
    assert workdir == [IMAGE_WORKDIR]
    user = [a for name, a in instructions if name == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0"), "the image runs as a non-root user"
    exposed = {int(p) for name, a in instructions if name == "EXPOSE" for p in a.split()}
    assert set(GRPC_PORTS.values()) <= exposed
    assert ENTRYPOINT == ["python", "-m"]
    # Inside a container, the loopback default would make every server unreachable.
    env = dockerfile_env()
    for module in GRPC_PORTS:
        assert env["HANZO_" + module.removeprefix("services.").upper() + "_HOST"] == "0.0.0.0"


# ---------------------------------------------------------------- compose


def test_compose_runs_every_service_with_two_workers_and_their_agents() -> None:
    assert COMPOSE["services"]["redis"]["image"].startswith("redis:7")
    assert "--save" in COMPOSE["services"]["redis"]["command"], "no persistence"
    assert len(mesh_services("services.placer")) >= 1
    assert len(mesh_services("services.gateway")) == 1
    assert len(mesh_services("services.worker")) == 2
    assert len(mesh_services(TELEMETRY)) == 2


def test_compose_healthchecks_use_the_script_or_a_native_check() -> None:
    for name, svc in compose_services().items():
        test = svc.get("healthcheck", {}).get("test")
        if test is None:
            continue
        assert test[0] == "CMD", name
        if is_mesh(svc):
            script = test[2]
            assert script.startswith(IMAGE_WORKDIR + "/")
            assert (ROOT / script.removeprefix(IMAGE_WORKDIR + "/")).is_file(), f"{name}: {script}"


def test_compose_depends_on_conditions_are_satisfiable() -> None:
    services = compose_services()
    for name, svc in services.items():
        depends = svc.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on with conditions"
        for target, rule in depends.items():
            assert target in services, f"{name} depends on unknown {target}"
            condition = rule["condition"]
            assert condition in ("service_started", "service_healthy", "service_completed_successfully")
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy"


def test_compose_mesh_services_start_after_what_they_call() -> None:
    for name, svc in mesh_services().items():
        env = compose_env(svc)
        depends = svc.get("depends_on") or {}
        for key, value in env.items():
            if key.endswith("_PLACER_ADDRESS") or key.endswith("_REDIS_URL"):
                host = urlparse(value).hostname if "://" in value else value.split(":")[0]
                assert depends.get(host, {}).get("condition") == "service_healthy", f"{name} -> {host}"


def test_compose_gpus_are_reserved_for_workers_and_their_agents_only() -> None:
    services = compose_services()
    for name, svc in services.items():
        devices = gpu_devices(svc)
        module = module_of(compose_argv(svc)) if is_mesh(svc) else None
        if module in ("services.worker", TELEMETRY):
            assert devices, f"{name} reserves no GPU"
        else:
            assert not devices, f"{name} reserves a GPU but is neither a worker nor a telemetry agent"
        for device in devices:
            assert device["driver"] == "nvidia"
            assert device["capabilities"] == ["gpu"]
            assert ("count" in device) != ("device_ids" in device)


def test_compose_telemetry_agents_share_their_workers_node_id_and_gpu() -> None:
    services = compose_services()
    worker_ids = set()
    for name, svc in mesh_services(TELEMETRY).items():
        workers = [t for t in svc.get("depends_on", {}) if t in mesh_services("services.worker")]
        assert len(workers) == 1, f"{name} sits beside exactly one worker"
        worker = services[workers[0]]
        node_id = compose_env(worker)["HANZO_WORKER_NODE_ID"]
        assert compose_env(svc)["HANZO_TELEMETRY_NODE_ID"] == node_id
        worker_ids.add(node_id)
        as_ids = [interpolate(str(i)) for d in gpu_devices(svc) for i in d.get("device_ids", [])]
        assert as_ids == [interpolate(str(i)) for d in gpu_devices(worker) for i in d.get("device_ids", [])]
    assert len(worker_ids) == 2, "each worker has its own node id"
    for name, svc in mesh_services("services.worker").items():
        env = compose_env(svc)
        host, port = env["HANZO_WORKER_ADVERTISE_ADDRESS"].split(":")
        assert host == name and int(port) == grpc_port("services.worker", env)


def test_compose_workers_read_models_from_the_mounted_volume() -> None:
    for name, svc in mesh_services("services.worker").items():
        targets = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in svc["volumes"]]
        for entry in compose_env(svc)["HANZO_WORKER_MODELS"].split(","):
            model, _, path = entry.partition("=")
            assert model and any(path.startswith(t.rstrip("/") + "/") for t in targets), f"{name}: {entry}"


def started_before(name: str) -> set[str]:
    """Every compose service that `name` waits for, directly or through the services it waits for."""
    seen: set[str] = set()
    todo = list(compose_services()[name].get("depends_on") or {})
    while todo:
        target = todo.pop()
        if target not in seen:
            seen.add(target)
            todo += list(compose_services()[target].get("depends_on") or {})
    return seen


def test_compose_traces_go_to_jaeger() -> None:
    jaeger = compose_services()["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/all-in-one")
    assert str(jaeger["environment"]["COLLECTOR_OTLP_ENABLED"]).lower() == "true"
    assert 16686 in {container_port(p) for p in jaeger["ports"]}
    for name, svc in mesh_services().items():
        env = compose_env(svc)
        endpoint = urlparse(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert (endpoint.hostname, endpoint.port) == ("jaeger", 4317), name
        assert env["OTEL_SERVICE_NAME"].startswith("hanzo-"), name
        assert "jaeger" in started_before(name), f"{name} starts before the collector it exports to"


def test_compose_cpu_override_drops_every_gpu_and_simulates_telemetry() -> None:
    overrides = COMPOSE_CPU["services"]
    assert set(overrides) <= set(compose_services())
    for name, svc in compose_services().items():
        if gpu_devices(svc):
            override = overrides.get(name, {})
            devices = override["deploy"]["resources"]["reservations"]["devices"]
            assert devices is None, f"{name}: the CPU override must `!reset` the GPU devices"
            assert "cpu" in override["build"]["args"]["TORCH_INDEX_URL"]
    for name in mesh_services("services.worker"):
        assert overrides[name]["environment"]["HANZO_WORKER_DEVICE"] == "cpu"
    for name in mesh_services(TELEMETRY):
        assert overrides[name]["environment"]["HANZO_TELEMETRY_SOURCE"] == "simulated"


# ---------------------------------------------------------------- kubernetes


def test_kustomization_lists_every_manifest() -> None:
    assert sorted(KUSTOMIZATION["resources"]) == sorted(p.name for p in K8S_FILES)


def test_k8s_runs_every_service() -> None:
    kinds = {(w["kind"], module_of(k8s_argv(c))) for w, c in mesh_containers()}
    assert {("Deployment", "services.placer"), ("Deployment", "services.gateway")} <= kinds
    assert ("DaemonSet", "services.worker") in kinds or ("Deployment", "services.worker") in kinds
    placer = next(w for w, _ in mesh_containers("services.placer"))
    assert placer["spec"]["replicas"] == 2
    assert any(d["kind"] == "Namespace" for d in K8S_DOCS)
    assert any(w["metadata"]["name"] == "redis" for w in workloads())


def test_k8s_grpc_containers_have_native_grpc_probes_on_their_port() -> None:
    for workload, container in mesh_containers():
        module = module_of(k8s_argv(container))
        where = f"{workload['metadata']['name']}/{container['name']}"
        if module == TELEMETRY:
            assert not any(k.endswith("Probe") for k in container), f"{where} serves no gRPC"
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            served = {"gpu-metrics": metrics_port(module, k8s_env(container))}
            assert ports == served, f"{where} serves /metrics only"
            continue
        env = k8s_env(container)
        port = grpc_port(module, env)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["grpc"] == port, where
        if metrics_port(module, env) is not None:
            assert ports["metrics"] == metrics_port(module, env), where
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port, f"{where} {probe}"


def test_k8s_services_select_pods_and_target_their_ports() -> None:
    for svc in (d for d in K8S_DOCS if d["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        pods = [
            w["spec"]["template"]
            for w in workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"Service {svc['metadata']['name']} selects no pod"
        declared = [p for pod in pods for c in pod["spec"]["containers"] for p in c.get("ports", [])]
        named = {p.get("name") for p in declared}
        numbered = {p["containerPort"] for p in declared}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in (named if isinstance(target, str) else numbered), svc["metadata"]["name"]


def test_k8s_addresses_point_at_services_on_the_right_ports() -> None:
    services = {
        d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]}
        for d in K8S_DOCS
        if d["kind"] == "Service"
    }
    settings = [(f"ConfigMap {n}", data) for n, data in configmaps().items()]
    settings += [(f"{w['metadata']['name']}/{c['name']}", k8s_env(c)) for w, c in containers()]
    for name, data in settings:
        for key, value in data.items():
            if not isinstance(value, str):
                continue  # valueFrom: the downward API or a Secret
            if key.endswith("_PLACER_ADDRESS"):
                host, port = value.split(":")
                assert host in services and int(port) in services[host], f"{name}.{key}"
                assert int(port) == GRPC_PORTS["services.placer"]
            if key.endswith("_REDIS_URL"):
                url = urlparse(value)
                assert url.hostname in services and url.port in services[url.hostname], f"{name}.{key}"


def test_k8s_workers_sit_on_gpu_nodes_with_a_telemetry_sidecar() -> None:
    pods = {id(w): w for w, _ in mesh_containers("services.worker")}
    assert pods
    for workload in pods.values():
        spec = workload["spec"]["template"]["spec"]
        assert any(t["key"] == "nvidia.com/gpu" for t in spec.get("tolerations", []))
        assert spec.get("nodeSelector") or spec.get("affinity"), "workers only on GPU nodes"
        by_module = {module_of(k8s_argv(c)): c for c in spec["containers"]}
        worker, telemetry = by_module["services.worker"], by_module[TELEMETRY]
        assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        worker_env, telemetry_env = k8s_env(worker), k8s_env(telemetry)
        node_id = worker_env["HANZO_WORKER_NODE_ID"]
        assert isinstance(node_id, dict)
        assert node_id["fieldRef"]["fieldPath"] in ("metadata.name", "spec.nodeName")
        assert telemetry_env["HANZO_TELEMETRY_NODE_ID"] == node_id, "the sidecar reports for its worker"
        assert worker_env["HANZO_WORKER_HOSTNAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        advertise = worker_env["HANZO_WORKER_ADVERTISE_ADDRESS"]
        var, port = re.fullmatch(r"\$\((\w+)\):(\d+)", advertise).groups()
        assert worker_env[var] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert int(port) == grpc_port("services.worker", worker_env)
        mounts = {m["mountPath"] for m in worker.get("volumeMounts", [])}
        for entry in worker_env["HANZO_WORKER_MODELS"].split(","):
            path = entry.partition("=")[2]
            assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), entry


def test_k8s_env_from_refers_to_existing_configmaps() -> None:
    for workload, container in containers():
        for source in container.get("envFrom", []):
            assert source["configMapRef"]["name"] in configmaps(), workload["metadata"]["name"]


def test_k8s_mesh_pods_run_as_the_images_non_root_user() -> None:
    for workload, _ in mesh_containers():
        security = workload["spec"]["template"]["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
