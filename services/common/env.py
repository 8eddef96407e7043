"""Reading typed settings from environment variables, with errors that name the variable."""

from __future__ import annotations

from collections.abc import Mapping


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
