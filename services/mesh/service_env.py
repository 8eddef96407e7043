"""The environment a service process reads its settings from (`HANZO_<SERVICE>_<SETTING>`, see
deploy/SERVICES.md), built in one place for the local stack, the benchmarks and the tests that start
services as processes. A setting is named as its settings field is, so a misspelt one fails here, at
the caller, instead of being ignored by the service."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from services.gateway.config import GatewaySettings
from services.placer.config import PlacerSettings
from services.telemetry.config import StreamSettings, TelemetrySettings
from services.worker.server.config import WorkerSettings

# The settings classes whose fields each service reads as HANZO_<SERVICE>_<FIELD> (the telemetry
# agent's stream settings sit beside its own, unprefixed).
_SETTINGS: dict[str, tuple[type, ...]] = {
    "gateway": (GatewaySettings,),
    "placer": (PlacerSettings,),
    "telemetry": (TelemetrySettings, StreamSettings),
    "worker": (WorkerSettings,),
}


# Settings every service reads from one shared variable rather than its own prefix.
_SHARED = {"internal_token": "HANZO_INTERNAL_TOKEN"}


def service_env(service: str, **settings: object) -> dict[str, str]:
    """HANZO_<SERVICE>_<NAME>=value for each setting given (None: left out, the service's default);
    a worker's `models` mapping becomes "name=path,...". ValueError naming an unknown setting."""
    fields = {f.name for kind in _SETTINGS[service] for f in dataclasses.fields(kind)} - set(_SHARED)
    env: dict[str, str] = {}
    for name, value in settings.items():
        if name in _SHARED:
            raise ValueError(f"{name} is shared by every service: set {_SHARED[name]}")
        if name not in fields:
            raise ValueError(f"{service} has no setting {name!r} (its settings: {', '.join(sorted(fields))})")
        if value is None:
            continue
        if isinstance(value, Mapping):
            value = ",".join(f"{key}={path}" for key, path in value.items())
        env[f"HANZO_{service.upper()}_{name.upper()}"] = str(value)
    return env
