"""Compute Engine's errors: which are worth retrying (and after how long), and each
failed call's one-line :class:`ProviderError` (:class:`ConfigurationError` for what the
user must fix)."""

from __future__ import annotations

import re
from typing import Any

from spotring.providers.base import ConfigurationError, ProviderError
from spotring.providers.cloud import one_line
from spotring.providers.gcp.permissions import PERMISSION_BY_CALL

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})


def retry_after(error: Exception) -> float | None:
    """Seconds to wait before retrying ``error`` (0: the backoff decides), or None
    when retrying cannot help."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    if isinstance(error, auth.RefreshError):
        return None
    if isinstance(error, auth.TransportError):
        return 0.0
    if isinstance(error, api.GoogleAPICallError):
        reasons = {e.get("reason") for e in error.errors or () if isinstance(e, dict)}
        if error.code not in _RETRYABLE_STATUS and not (
            error.code == 403 and reasons & _RATE_LIMIT_REASONS
        ):
            return None
        header = getattr(getattr(error, "response", None), "headers", {}).get("Retry-After")
        try:
            return min(60.0, float(header)) if header else 0.0
        except ValueError:
            return 0.0
    import requests
    from google.protobuf.json_format import ParseError

    # Connection refused or reset, a timeout, a truncated or malformed response.
    if isinstance(error, (requests.RequestException, OSError, ValueError, ParseError)):
        return 0.0
    return None


def _api_message(error: Any) -> str:
    """The API's own message, without the method and URL the library prepends."""
    for detail in error.errors or ():
        if isinstance(detail, dict) and detail.get("message"):
            return one_line(detail["message"])
    return one_line(str(error.message).split(": ", 1)[-1])


def translate_error(
    call_name: str,
    error: Exception,
    *,
    project: str,
    location: str,
    group: str,
    endpoint: str | None,
) -> ProviderError:
    """A one-line ProviderError for a failed call: ConfigurationError (exit 2)
    for what the user must fix, a retryable ProviderError for the rest.

    :param project: the group's project; :param location: ``zone Z`` or ``region R``;
    :param group: the group's name; :param endpoint: ``--endpoint`` (None: Google's).
    """
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    permission = PERMISSION_BY_CALL[call_name]
    where = f"project {project}, {location}"
    if isinstance(error, auth.RefreshError):
        return ConfigurationError(
            f"Google rejected the credentials: {one_line(error)}: run"
            " 'gcloud auth application-default login' or check GOOGLE_APPLICATION_CREDENTIALS"
        )
    if isinstance(error, auth.TransportError):
        return ProviderError(f"cannot reach Google's token service: {one_line(error)}")
    if not isinstance(error, api.GoogleAPICallError):
        import requests

        if isinstance(error, (requests.ConnectionError, requests.Timeout, OSError)):
            shown = endpoint or "https://compute.googleapis.com"
            return ProviderError(
                f"cannot reach Compute Engine at {shown} for {call_name}: {type(error).__name__}"
            )
        # A truncated or malformed answer: the last good inventory stays in use.
        return ProviderError(f"{call_name} failed: {type(error).__name__}: {one_line(error, 120)}")
    message = _api_message(error)
    if retry_after(error) is not None:
        return ProviderError(f"{call_name} failed after retries: {error.code}: {message}")
    if isinstance(error, api.Unauthorized):
        return ConfigurationError(
            f"Compute Engine rejected the credentials ({message}): refresh them with"
            " 'gcloud auth application-default login'"
        )
    if isinstance(error, api.Forbidden):
        named = re.search(r"'(compute\.[A-Za-z]+\.[A-Za-z]+)'", message)
        return ConfigurationError(
            f"permission {named.group(1) if named else permission} denied on {call_name}"
            f" ({where}): grant it to the account spotring runs as"
            " (see IAM_PERMISSIONS in spotring.providers.gcp)"
        )
    if isinstance(error, api.NotFound):
        return ConfigurationError(
            _not_found(message, where, project=project, location=location, group=group)
        )
    return ConfigurationError(f"{call_name} failed ({where}): {error.code}: {message}")


def _not_found(message: str, where: str, *, project: str, location: str, group: str) -> str:
    resource = re.search(r"'([^']+)'", message)
    path = resource.group(1) if resource else ""
    if path.rstrip("/") == f"projects/{project}":
        return f"project {project} not found (or not visible to these credentials)"
    if re.fullmatch(r"projects/[^/]+/(zones|regions)/[^/]+", path):
        return f"{location} not found in project {project}"
    return f"managed instance group '{group}' not found ({where})"


__all__ = ["retry_after", "translate_error"]
