"""redact_url: a URL's password and credential parameters become ***, everything else stays."""

from __future__ import annotations

import pytest

from services.common.redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://default:s3cret@redis:6379/0", "redis://default:***@redis:6379/0"),
        ("rediss://:p%40ss%3Aw%2Frd@cache.example:6380/1", "rediss://:***@cache.example:6380/1"),
        ("redis://:a@b@host:1/0", "redis://:***@host:1/0"),  # the host is after the last @
        ("redis://:@host:1/0", "redis://:***@host:1/0"),  # an empty password is still one
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),  # a user name alone is no secret
        ("redis://host/0?password=s3cret&db=2", "redis://host/0?password=***&db=2"),
        ("redis://host/0?socket_timeout=2", "redis://host/0?socket_timeout=2"),
        ("redis://:s3cret@host:notaport/0", "***"),  # does not parse: it may still hold the secret
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
