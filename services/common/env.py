"""Reading typed settings from environment variables, with errors that name the variable."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

_E = TypeVar("_E", bound=enum.StrEnum)


def env_str(environ: Mapping[str, str], name: str, default: str) -> str:
    return environ.get(name, default)


def env_float(environ: Mapping[str, str], name: str, default: float, minimum: float | None = None) -> float:
    """float(environ[name]) or default; ValueError naming the variable when malformed or too small."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={raw!r} must be >= {minimum}")
    return value


def env_int(environ: Mapping[str, str], name: str, default: int, minimum: int | None = None) -> int:
    """int(environ[name]) or default; ValueError naming the variable when malformed or too small."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={raw!r} must be >= {minimum}")
    return value


def env_optional_int(environ: Mapping[str, str], name: str) -> int | None:
    """An integer if the variable is set, else None."""
    return env_int(environ, name, 0) if environ.get(name) not in (None, "") else None


def env_enum(environ: Mapping[str, str], name: str, default: _E) -> _E:
    """The member of default's StrEnum whose value is environ[name] (case-insensitive), or default;
    ValueError naming the variable and the choices when it is none of them."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    members = list(type(default))
    wanted = raw.strip().lower()
    for member in members:
        if member.value.lower() == wanted:
            return member
    raise ValueError(f"{name}={raw!r}: use {'|'.join(m.value for m in members)}")


def env_optional_float(environ: Mapping[str, str], name: str, minimum: float | None = None) -> float | None:
    """A float if the variable is set, else None; ValueError naming it when malformed or too small."""
    return env_float(environ, name, 0.0, minimum) if environ.get(name) not in (None, "") else None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """1/true/yes/on or 0/false/no/off (any case), else default when unset; ValueError otherwise."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{name}={raw!r}: use one of {'|'.join(_TRUE + _FALSE)}")
