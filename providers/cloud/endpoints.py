"""``--endpoint``: a URL that never sends the credentials' token in clear."""

from __future__ import annotations

from urllib.parse import urlsplit

from spotring.providers.base import ConfigurationError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_endpoint(endpoint: str) -> bool:
    """Check an ``--endpoint`` URL; returns whether it is plain http.

    https anywhere; plain http only to a test server on loopback, since the calls
    carry the credentials' access token, which must not cross a network in clear.
    Raises :class:`ConfigurationError` (one line) otherwise.
    """
    parts = urlsplit(endpoint)
    try:
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        raise ConfigurationError(f"--endpoint must be an http(s) URL, got {endpoint!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or _has_space(endpoint):
        raise ConfigurationError(f"--endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
        raise ConfigurationError("--endpoint over plain http is only for a test server on loopback")
    return parts.scheme == "http"


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)
