"""The RESOURCE_EXHAUSTED retry hint: one format written by every service and read back by the gateway."""

from __future__ import annotations

import pytest

from services.common.errors import ResourceExhausted, retry_hint, split_retry_hint


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("queue is full (retry after 0.4 s)", ("queue is full", 0.4)),
        ("queue is full (retry after 12 s)", ("queue is full", 12.0)),
        ("queue is full", ("queue is full", None)),
        (
            "(retry after 1.0 s) said earlier, not at the end",
            ("(retry after 1.0 s) said earlier, not at the end", None),
        ),
        ("", ("", None)),
    ],
)
def test_split_retry_hint(message: str, expected: tuple[str, float | None]) -> None:
    assert split_retry_hint(message) == expected


@pytest.mark.parametrize("seconds", [0.05, 1.0, 2.25, 60.0])
def test_hint_round_trips_to_a_tenth_of_a_second(seconds: float) -> None:
    text, parsed = split_retry_hint(str(ResourceExhausted("busy", retry_after_s=seconds)))
    assert text == "busy" and parsed == pytest.approx(seconds, abs=0.05)
    assert retry_hint(None) == ""
