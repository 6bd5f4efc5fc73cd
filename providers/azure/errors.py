"""ARM's errors: whether a failed call is worth retrying (:func:`retry_after`), and
the one-line :class:`ProviderError` it ends with (:func:`translate_arm_error`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from spotring.providers.azure.capacity import is_refusal
from spotring.providers.azure.client import DEFAULT_ENDPOINT
from spotring.providers.azure.permissions import ACTION_BY_CALL
from spotring.providers.base import ConfigurationError, ProviderError
from spotring.providers.cloud import one_line


def translate_arm_error(
    call_name: str,
    error: Exception,
    *,
    group: str,
    resource_group: str,
    subscription: str,
    endpoint: str | None,
    note_refusal: Callable[[str, str], None],
) -> ProviderError:
    """The one-line :class:`ProviderError` (:class:`ConfigurationError` for what the
    user must fix) a failed call about scale set ``group`` ends with. A scale-out
    refused for capacity, price or quota is also given to ``note_refusal`` (its code
    and whole message), for the capacity shortage to report."""
    from azure.core import exceptions as core

    action = ACTION_BY_CALL[call_name]
    if _is_credential_error(error):
        return ConfigurationError(
            "no usable Azure credentials: run 'az login', set AZURE_CLIENT_ID /"
            " AZURE_TENANT_ID / AZURE_CLIENT_SECRET, or use a managed identity"
            f" ({type(error).__name__})"
        )
    # An answer that broke off has no status: not the server's refusal.
    if (
        isinstance(error, core.DecodeError)
        or not isinstance(error, core.HttpResponseError)
        or error.status_code is None
    ):
        if isinstance(error, (core.ServiceRequestError, core.ServiceResponseError, OSError)):
            shown = endpoint or DEFAULT_ENDPOINT
            return ProviderError(
                f"cannot reach Azure at {shown} for {call_name}: {type(error).__name__}"
            )
        return ProviderError(f"{call_name} failed: {type(error).__name__}: {one_line(error, 120)}")
    code, raw = _arm_error(error)
    message = one_line(raw)
    if retry_after(error) is not None:
        return ProviderError(f"{call_name} failed after retries: {error.status_code} {code}")
    if code in ("AuthorizationFailed", "LinkedAuthorizationFailed") or error.status_code == 403:
        named = re.search(r"perform action '([^']+)'", message)
        return ConfigurationError(
            f"Azure denied {named.group(1) if named else action} ({code or 403}): allow it in"
            " the role of the identity spotring runs as (see IAM_ACTIONS in"
            " spotring.providers.azure)"
        )
    if error.status_code == 401:
        return ConfigurationError(f"Azure rejected the credentials ({code}): {message}")
    if code == "ResourceGroupNotFound":
        return ConfigurationError(
            f"resource group '{resource_group}' not found in subscription {subscription}"
        )
    if is_refusal(code, raw):
        # A capacity, price or quota refusal: the job trains on what it has,
        # spotring asks again later, and capacity_shortage reports it.
        if call_name == "virtualMachineScaleSets.update":
            # Whole: the quota's limit, usage and what more it needs come last.
            note_refusal(code, one_line(raw, 600))
        return ProviderError(f"scale set '{group}' cannot grow: {message}")
    if code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
        return ConfigurationError(f"subscription {subscription} not found")
    if error.status_code == 404:
        return ConfigurationError(
            f"scale set '{group}' not found in resource group '{resource_group}'"
        )
    return ConfigurationError(f"{call_name} failed: {error.status_code} {code}: {message}")


def _is_credential_error(error: Exception) -> bool:
    from azure.core.exceptions import ClientAuthenticationError

    # Raised by the credential while getting a token, before any request is sent
    # (azure-identity's CredentialUnavailableError is a ClientAuthenticationError).
    return isinstance(error, ClientAuthenticationError) and getattr(error, "response", None) is None


def _arm_error(error: Any) -> tuple[str, str]:
    """The ARM error code and (whole) message of an azure-core HttpResponseError."""
    if error.error is not None:
        return str(error.error.code or ""), str(error.error.message or "")
    return "", str(error.message or "")


def retry_after(error: Exception) -> float | None:
    """Seconds to wait before retrying ``error`` (0: the backoff decides), or None."""
    from azure.core import exceptions as core

    if isinstance(error, core.DecodeError):  # a truncated or malformed answer
        return 0.0
    if isinstance(error, core.HttpResponseError) and not isinstance(
        error, core.ClientAuthenticationError
    ):
        if error.status_code is None:  # the answer broke off (a stream cut short)
            return 0.0
        status = error.status_code
        # 409: another operation on the set is still running, or a VM is marked for
        # deletion; but not a refusal, which asking again at once does not change.
        if is_refusal(*_arm_error(error)):
            return None
        if status not in (408, 409, 429) and status < 500:
            return None
        headers = getattr(getattr(error, "response", None), "headers", None) or {}
        try:
            return min(60.0, float(headers.get("Retry-After", 0) or 0))
        except ValueError:
            return 0.0
    if isinstance(error, (core.ServiceRequestError, core.ServiceResponseError)):
        return 0.0
    if isinstance(error, (OSError, ValueError)):
        return 0.0
    return None
