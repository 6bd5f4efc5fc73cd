"""AWS's error codes, and how a failed call becomes one line of :class:`ProviderError`
(:class:`ConfigurationError` for what the user must fix; a plain ProviderError for what
retrying may cure)."""

from __future__ import annotations

from typing import Any

from spotring.providers.aws.permissions import iam_action
from spotring.providers.base import ConfigurationError, ProviderError
from spotring.providers.cloud import one_line

_RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "TooManyRequestsException",
        "ResourceContention",
        "ScalingActivityInProgress",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    }
)
ACCESS_DENIED_CODES = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
)
"""The codes of a call the caller's IAM policy does not allow."""
_BAD_CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidAccessKeyId",
        "MissingAuthenticationToken",
        "OptInRequired",
    }
)
_EXPIRED_CREDENTIAL_CODES = frozenset({"ExpiredToken", "ExpiredTokenException"})


def aws_code(error: ProviderError) -> str:
    """The AWS error code behind a translated error ("" for a non-AWS failure)."""
    return getattr(error, "aws_code", "")


def member_not_found(error: ProviderError) -> bool:
    """Whether ``error`` is Auto Scaling's ValidationError for an instance id it does
    not have (one that left the group between a check and the call)."""
    return aws_code(error) == "ValidationError" and "not found" in str(error).lower()


def client_error(operation: str, error: Any, group: str, region: str) -> ProviderError:
    """What botocore's ``ClientError`` on ``operation``, a call about ``group`` in
    ``region``, means."""
    details = error.response.get("Error", {})
    code = details.get("Code", "Unknown")
    message = one_line(details.get("Message", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    action = iam_action(operation)
    if code in ACCESS_DENIED_CODES:
        # EC2's message carries a long encoded authorization blob: leave it out.
        return ConfigurationError(
            f"AWS denied {action} ({code}): allow it in the IAM policy of the role or"
            " user spotring runs as (see IAM_ACTIONS in spotring.providers.aws)"
        )
    if code in _EXPIRED_CREDENTIAL_CODES:
        return ConfigurationError(
            f"AWS credentials have expired ({code}): refresh them (aws sso login, a new"
            " session token) or use an instance role"
        )
    if code in _BAD_CREDENTIAL_CODES:
        return ConfigurationError(
            f"AWS rejected the credentials ({code}) on {action}: check AWS_PROFILE /"
            " AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the region"
        )
    if code == "RequestExpired":
        return ConfigurationError(
            "AWS says the request expired (RequestExpired): check this machine's clock"
        )
    if code in _RETRYABLE_CODES or status >= 500 or status == 429:
        return ProviderError(f"{action} failed after retries: {code}: {message}")
    if "not found" in message.lower() and "autoscalinggroup" in message.lower():
        return ConfigurationError(f"auto scaling group '{group}' not found in region {region}")
    return ConfigurationError(f"{action} failed: {code}: {message}")


def botocore_error(operation: str, error: Exception, client: Any) -> ProviderError:
    """What a failure of botocore's own on ``operation`` of ``client`` (no credentials,
    a request it refuses to send, no connection: no error answer from AWS) means."""
    import botocore.exceptions as bce

    action = iam_action(operation)
    if isinstance(error, bce.NoCredentialsError):
        return ConfigurationError(
            "no AWS credentials: set AWS_PROFILE / AWS_ACCESS_KEY_ID or use an instance role"
        )
    if isinstance(error, bce.PartialCredentialsError):
        return ConfigurationError(f"incomplete AWS credentials: {one_line(error)}")
    sso_errors = tuple(
        getattr(bce, name)
        for name in ("TokenRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError")
        if hasattr(bce, name)
    )
    if sso_errors and isinstance(error, sso_errors):
        return ConfigurationError(
            f"AWS SSO credentials are not usable ({type(error).__name__}): run aws sso login"
        )
    if isinstance(error, bce.ParamValidationError):
        return ConfigurationError(f"bad {action} request: {one_line(error)}")
    if isinstance(
        error,
        (
            bce.EndpointConnectionError,
            bce.ConnectTimeoutError,
            bce.ReadTimeoutError,
            bce.ConnectionClosedError,
        ),
    ):
        return ProviderError(
            f"cannot reach AWS at {client.meta.endpoint_url} for {action}: {type(error).__name__}"
        )
    return ProviderError(f"{action} failed: {type(error).__name__}: {one_line(error)}")
