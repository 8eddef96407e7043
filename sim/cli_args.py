"""argparse types the simulator's command lines share: a bad value is refused by argparse with a message
naming it (exit status 2), never a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type) -> Callable[[str], object]:
    """A number of kind (int or float) above 0."""

    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def count(text: str) -> int:
    """An int of 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def counts(text: str) -> list[int]:
    """Comma-separated ints of 0 or more, at least one."""
    values = [count(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one number")
    return values
