"""The deploy files' secrets: Redis starts with a password and its probe logs in; every Redis client's URL
carries that password; every container of the mesh gets the internal token; compose requires both
variables and Kubernetes both Secrets (never optional); deploy/README.md creates them before the apply."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import pytest

from services.common.internal_auth import ENV as INTERNAL_TOKEN_ENV
from tests.deploy.manifests import (
    COMPOSE_SECRETS,
    DEPLOY,
    K8S_DOCS,
    UnsetVariableError,
    compose_env,
    compose_services,
    configmaps,
    containers,
    interpolate,
    k8s_argv,
    mesh_containers,
    mesh_services,
    module_of,
    redis_clients,
    required_variables,
    secret_refs,
    workloads,
)

README = (DEPLOY / "README.md").read_text()
REDIS_PASSWORD = ("hanzo-redis", "password")  # Secret, key
INTERNAL_TOKEN = ("hanzo-internal", "token")
COMPOSE_PASSWORD = COMPOSE_SECRETS["HANZO_REDIS_PASSWORD"]
EXPANSION = re.compile(r"\$\((\w+)\)")


def url_var(module: str) -> str:
    return "HANZO_" + module.removeprefix("services.").upper() + "_REDIS_URL"


def test_the_redis_clients_are_the_placer_and_the_gateway() -> None:
    assert redis_clients() == {"services.placer", "services.gateway"}


# ---------------------------------------------------------------- compose


def test_compose_requires_exactly_the_secrets_and_the_readme_says_how_to_set_them() -> None:
    text = (DEPLOY / "docker-compose.yml").read_text()
    assert required_variables(text) == set(COMPOSE_SECRETS)
    for name in COMPOSE_SECRETS:
        assert f"export {name}=$(openssl rand -hex 24)" in README, name


def compose_redis_users() -> set[str]:
    """The compose services that need Redis's password: Redis itself and the Redis clients."""
    return {"redis", *(name for module in redis_clients() for name in mesh_services(module))}


@pytest.mark.parametrize(
    ("unset", "refusing"),
    [(INTERNAL_TOKEN_ENV, set(mesh_services())), ("HANZO_REDIS_PASSWORD", compose_redis_users())],
)
def test_compose_refuses_to_start_without_a_secret(unset: str, refusing: set[str]) -> None:
    environ = {k: v for k, v in COMPOSE_SECRETS.items() if k != unset}
    refused = set()
    for name, svc in compose_services().items():
        try:
            compose_env(svc, environ)
            [interpolate(str(arg), environ) for arg in svc.get("command", [])]
        except UnsetVariableError as err:
            assert unset in str(err), name
            refused.add(name)
    assert refused == refusing


def test_compose_redis_requires_the_password_and_its_healthcheck_logs_in() -> None:
    redis = compose_services()["redis"]
    argv = [interpolate(str(a), COMPOSE_SECRETS) for a in redis["command"]]
    assert argv[argv.index("--requirepass") + 1] == COMPOSE_PASSWORD
    assert compose_env(redis)["REDISCLI_AUTH"] == COMPOSE_PASSWORD, "redis-cli reads its password here"
    probe = " ".join(redis["healthcheck"]["test"])
    # redis-cli exits 0 on NOAUTH: only a PONG means an authenticated, answering server.
    assert "redis-cli ping" in probe and "grep -q PONG" in probe, probe


@pytest.mark.parametrize("name", sorted(mesh_services()))
def test_compose_every_mesh_service_gets_the_internal_token(name: str) -> None:
    env = compose_env(compose_services()[name])
    assert env[INTERNAL_TOKEN_ENV] == COMPOSE_SECRETS[INTERNAL_TOKEN_ENV]


def compose_redis_urls() -> list[tuple[str, str]]:
    """(service, variable) of every *_REDIS_URL a compose service sets, the Redis clients' included."""
    found = [
        (n, k)
        for n, s in compose_services().items()
        for k in (s.get("environment") or {})
        if k.endswith("_REDIS_URL")
    ]
    for module in redis_clients():
        for name in mesh_services(module):
            assert (name, url_var(module)) in found, (
                f"{name} has no {url_var(module)}: it would use its default"
            )
    return found


@pytest.mark.parametrize(("name", "key"), compose_redis_urls())
def test_compose_redis_urls_carry_the_password(name: str, key: str) -> None:
    url = urlparse(compose_env(compose_services()[name])[key])
    assert (url.password, url.hostname, url.port) == (COMPOSE_PASSWORD, "redis", 6379), f"{name}.{key}"


# ---------------------------------------------------------------- kubernetes


def expanded_secret(env: list[dict[str, Any]], value: str) -> tuple[str, str] | None:
    """(Secret, key) that `value` comes from when it is `$(VAR)` and VAR, set in env (the variables
    above it), comes from that Secret, directly or through another `$(...)`; else None."""
    expansion = EXPANSION.fullmatch(value)
    index = next((i for i, e in enumerate(env) if expansion and e["name"] == expansion.group(1)), None)
    if index is None:
        return None
    ref = (env[index].get("valueFrom") or {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else expanded_secret(env[:index], env[index].get("value", ""))


def secret_of(container: dict[str, Any], name: str) -> tuple[str, str] | None:
    """(Secret, key) behind the container's env var `name`, or None."""
    return expanded_secret(container.get("env", []), f"$({name})")


def container_name(workload: dict[str, Any], container: dict[str, Any]) -> str:
    return f"{workload['metadata']['name']}/{container['name']}"


ALL = {container_name(w, c): c for w, c in containers()}
MESH = {container_name(w, c): c for w, c in mesh_containers()}


@pytest.mark.parametrize("name", sorted(MESH))
def test_k8s_every_mesh_container_gets_the_internal_token(name: str) -> None:
    assert secret_of(MESH[name], INTERNAL_TOKEN_ENV) == INTERNAL_TOKEN


@pytest.mark.parametrize("name", sorted(MESH))
def test_k8s_redis_urls_carry_the_password_from_its_secret(name: str) -> None:
    env = MESH[name].get("env", [])
    urls = {item["name"]: i for i, item in enumerate(env) if item["name"].endswith("_REDIS_URL")}
    module = module_of(k8s_argv(MESH[name]))
    if module in redis_clients():
        assert url_var(module) in urls, f"{name} would use its default Redis URL, without the password"
    for key, index in urls.items():
        url = urlparse(env[index]["value"])
        # The password is $(VAR) and VAR, defined above the URL, comes from the Secret.
        assert expanded_secret(env[:index], url.password or "") == REDIS_PASSWORD, f"{name}.{key}"
        assert (url.hostname, url.port) == ("redis", 6379), f"{name}.{key}"


def test_k8s_no_configmap_holds_a_redis_url() -> None:
    # envFrom values are not expanded: a $(REDIS_PASSWORD) there would reach the service verbatim.
    for name, data in configmaps().items():
        assert not [k for k in data if k.endswith("_REDIS_URL")], name


def test_k8s_redis_requires_the_password_and_its_probe_logs_in() -> None:
    (workload,) = [w for w in workloads() if w["metadata"]["name"] == "redis"]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    argv = k8s_argv(container) if "command" in container else container["args"]
    password = EXPANSION.fullmatch(argv[argv.index("--requirepass") + 1])
    assert password and secret_of(container, password.group(1)) == REDIS_PASSWORD
    assert secret_of(container, "REDISCLI_AUTH") == REDIS_PASSWORD, "redis-cli reads its password here"
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert "redis-cli ping" in probe and "grep -q PONG" in probe, probe


@pytest.mark.parametrize("name", sorted(ALL))
def test_k8s_expansions_name_variables_defined_above_them(name: str) -> None:
    # Kubernetes leaves a $(VAR) it cannot resolve as the literal text: a silent wrong password.
    container = ALL[name]
    env = container.get("env", [])
    for i, item in enumerate(env):
        for var in EXPANSION.findall(item.get("value", "")):
            assert var in {e["name"] for e in env[:i]}, (
                f"{name}: {item['name']} uses $({var}) before it is set"
            )
    for arg in [*container.get("command", []), *container.get("args", [])]:
        for var in EXPANSION.findall(arg):
            assert var in {e["name"] for e in env}, f"{name}: $({var}) in its command is never set"


def k8s_secret_refs() -> list[tuple[str, str, str, bool]]:
    return [(name, *ref) for name, c in ALL.items() for ref in secret_refs(c).values()]


@pytest.mark.parametrize(("where", "secret", "key", "optional"), k8s_secret_refs())
def test_k8s_secrets_are_required_and_created_before_the_apply(
    where: str, secret: str, key: str, optional: bool
) -> None:
    assert optional is False, f"{where}: an optional {secret} would start the pod without it"
    create = re.search(rf"kubectl -n hanzo create secret generic {secret} --from-literal={key}=", README)
    assert create, f"deploy/README.md does not create the Secret {secret} (key {key})"
    assert create.start() < README.index("kubectl apply -k deploy/k8s"), f"create {secret} before the apply"


def test_k8s_uses_the_three_secrets() -> None:
    used = {(s, k) for _, s, k, _ in k8s_secret_refs()}
    assert used == {("hanzo-gateway", "api-keys"), REDIS_PASSWORD, INTERNAL_TOKEN}
    assert not [d for d in K8S_DOCS if d["kind"] == "Secret"], "secret values do not belong in the repository"
