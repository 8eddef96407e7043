"""The deploy files parsed once, and the questions the tests ask of them: which module a container runs,
its environment, its ports. Compose and Kubernetes semantics (entrypoint/command, envFrom) as the
tools apply them, so the tests see what would run."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
IMAGE_WORKDIR = "/app"  # WORKDIR of deploy/Dockerfile: the repo root inside the image
MESH_IMAGE = "hanzo-mesh"
# Default gRPC port of each serving module (deploy/SERVICES.md); telemetry serves nothing.
GRPC_PORTS = {"services.gateway": 50050, "services.placer": 50051, "services.worker": 50061}
TELEMETRY = "services.telemetry"
# The secrets compose requires (`${X:?...}`), as the tests set them; deploy/README.md has the user set them.
COMPOSE_SECRETS: Mapping[str, str] = MappingProxyType(
    {"HANZO_INTERNAL_TOKEN": "test-internal-token", "HANZO_REDIS_PASSWORD": "test-redis-password"}
)
NOTHING_SET: Mapping[str, str] = MappingProxyType({})


class ComposeLoader(yaml.SafeLoader):
    """SafeLoader that also reads Compose's merge tags (!reset, !override) as plain values."""


ComposeLoader.add_constructor("!reset", lambda loader, node: None)
ComposeLoader.add_constructor(
    "!override",
    lambda loader, node: (
        loader.construct_sequence(node)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node)
    ),
)


def load_compose(name: str) -> dict[str, Any]:
    return yaml.load((DEPLOY / name).read_text(), Loader=ComposeLoader)


COMPOSE = load_compose("docker-compose.yml")
COMPOSE_CPU = load_compose("docker-compose.cpu.yml")
K8S_FILES = sorted(p for p in K8S.glob("*.y*ml") if p.name != "kustomization.yaml")
K8S_DOCS = [doc for path in K8S_FILES for doc in yaml.safe_load_all(path.read_text()) if doc]
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


class UnsetVariableError(ValueError):
    """A `${X:?message}` (or `${X?message}`) variable is unset: compose refuses to start."""


VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, environ: Mapping[str, str] = NOTHING_SET) -> str:
    """Compose's variable syntax: ${X:-d} gives d where X is unset or empty, ${X-d} where it is unset,
    ${X:?msg} / ${X?msg} raise UnsetVariableError likewise, ${X} gives X or "", $$ gives $."""

    def value(match: re.Match[str]) -> str:
        name, operator, argument = match.groups()
        if name is None:
            return "$"
        given = environ.get(name)
        missing = given is None or (given == "" and operator in (":-", ":?"))
        if operator in ("?", ":?") and missing:
            raise UnsetVariableError(f"{name}: {argument}")
        if operator in ("-", ":-") and missing:
            return argument
        return given or ""

    return VARIABLE.sub(value, text)


def required_variables(text: str) -> set[str]:
    """The variables text requires (`${X:?...}` or `${X?...}`)."""
    return {m.group(1) for m in VARIABLE.finditer(text) if m.group(2) in ("?", ":?")}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [ln for ln in DOCKERFILE.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for ln in joined.splitlines()
        if (parts := ln.strip().split(None, 1))
    ]


def dockerfile_exec_form(instruction: str) -> list[str]:
    values = [json.loads(args) for name, args in dockerfile_instructions() if name == instruction]
    assert values, f"deploy/Dockerfile has no exec-form {instruction}"
    return values[-1]


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for name, args in dockerfile_instructions():
        if name == "ENV":
            env.update(token.split("=", 1) for token in shlex.split(args))
    return env


ENTRYPOINT = dockerfile_exec_form("ENTRYPOINT")
CMD = dockerfile_exec_form("CMD")


def module_of(argv: list[str]) -> str | None:
    """The X of `python -m X ...`, or None."""
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None


# ---------------------------------------------------------------- compose model


def compose_services() -> dict[str, dict[str, Any]]:
    return COMPOSE["services"]


def is_mesh(service: dict[str, Any]) -> bool:
    return str(service.get("image", "")).startswith(MESH_IMAGE)


def compose_argv(service: dict[str, Any]) -> list[str]:
    entrypoint = service.get("entrypoint", ENTRYPOINT)
    command = service.get("command", CMD if "entrypoint" not in service else [])
    return [*entrypoint, *command]


def compose_env(service: dict[str, Any], environ: Mapping[str, str] = COMPOSE_SECRETS) -> dict[str, str]:
    """The service's environment as compose gives it, with the required secrets set as in environ."""
    env = service.get("environment") or {}
    assert isinstance(env, dict), "write environment as a mapping, so overrides merge by name"
    return {k: interpolate(str(v), environ) for k, v in env.items()}


def mesh_services(module: str | None = None) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose_services().items()
        if is_mesh(svc) and (module is None or module_of(compose_argv(svc)) == module)
    }


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    deploy = service.get("deploy") or {}
    return ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []


def container_port(mapping: str) -> int:
    """The container side of a compose port mapping ("HOST:CONTAINER" or "CONTAINER")."""
    return int(interpolate(str(mapping)).split(":")[-1].split("/")[0])


def redis_clients() -> set[str]:
    """The modules whose settings read a *_REDIS_URL (services/<name>/**/config.py)."""
    return {
        module
        for module in (*GRPC_PORTS, TELEMETRY)
        if any('"REDIS_URL"' in p.read_text() for p in ROOT.joinpath(*module.split(".")).rglob("config.py"))
    }


def grpc_port(module: str, env: dict[str, str]) -> int:
    """The port the module listens on: its *_PORT variable, else the contract's default."""
    prefix = "HANZO_" + module.removeprefix("services.").upper() + "_"
    return int(env.get(prefix + "PORT", GRPC_PORTS[module]))


def metrics_port(module: str, env: dict[str, str]) -> int | None:
    value = env.get("HANZO_" + module.removeprefix("services.").upper() + "_METRICS_PORT")
    return int(value) if value else None


def http_port(module: str, env: dict[str, str]) -> int | None:
    """The gateway's OpenAI HTTP port as GatewaySettings reads it (None: no HTTP front, or not a gateway)."""
    if module != "services.gateway":
        return None
    from services.gateway.config import GatewaySettings

    literal = {k: v for k, v in env.items() if isinstance(v, str)}  # not the Secret references
    return GatewaySettings.from_env(literal).http_port


# ---------------------------------------------------------------- kubernetes model


def workloads() -> list[dict[str, Any]]:
    return [d for d in K8S_DOCS if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


def containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for workload in workloads():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            yield workload, container


def k8s_argv(container: dict[str, Any]) -> list[str]:
    # Kubernetes: `command` replaces ENTRYPOINT and then drops CMD; `args` replaces CMD.
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    return [*ENTRYPOINT, *container.get("args", CMD)]


def configmaps() -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data", {}) for d in K8S_DOCS if d["kind"] == "ConfigMap"}


def k8s_env(container: dict[str, Any]) -> dict[str, Any]:
    """Literal values as strings, valueFrom sources as their dicts; envFrom ConfigMaps resolved first."""
    env: dict[str, Any] = {}
    maps = configmaps()
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


def secret_refs(container: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    """Env var -> (Secret, key, optional) for every variable the container takes from a Secret."""
    refs = {}
    for item in container.get("env", []):
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            refs[item["name"]] = (ref["name"], ref["key"], ref.get("optional", False))
    return refs


def mesh_containers(module: str | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (w, c)
        for w, c in containers()
        if c["image"].split(":")[0] == MESH_IMAGE and (module is None or module_of(k8s_argv(c)) == module)
    ]
