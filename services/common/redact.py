"""URLs as they may be shown: a Redis URL carries its password (`redis://:PASSWORD@host:port/0`, as
redis-py's from_url reads it), and process tables, logs and benchmark output must not repeat it."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# Query parameters redis-py (and most clients) take a credential from: `redis://host/0?password=...`.
SECRET_PARAMS = frozenset({"password", "pass", "passwd", "token", "secret"})


def redact_url(url: str) -> str:
    """`url` with its password and any credential query value replaced by ***; the user name, host, port,
    path and other parameters stay, so the redacted URL still says where it points. A URL without a
    credential comes back unchanged; one that does not parse comes back as *** (it may hold one)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        return MASK
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else netloc
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key.lower() in SECRET_PARAMS for key, _ in pairs):
        query = urlencode([(k, MASK if k.lower() in SECRET_PARAMS else v) for k, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))
