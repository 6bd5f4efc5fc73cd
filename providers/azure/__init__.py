"""The ``azure`` provider: Azure VM scale sets (Uniform or Flexible), one room per concern.

    permissions  the RBAC action each ARM call needs (ACTION_BY_CALL, IAM_ACTIONS)
    states       provisioning, power and health states -> InstanceState (member_state)
    answers      what ARM's answers must hold; a VM read into a Member; a set's lifecycle
    capacity     shortage error codes -> ShortageCause; the newest failed VM or refusal
    errors       whether an ARM error is retried, and the one-line ProviderError it ends in
    client       the management clients (shared by a job's sets); paged and JSON calls
    groups       ``--group [RG/]NAME`` read into ScaleSetSpecs
    options      the provider's command-line options
    provider     AzureProvider, composing the rooms, and its registration

The package re-exports what users, plugins and tests import from it. The Azure SDKs are
imported on first use.
"""

from spotring.providers.azure.answers import set_lifecycle
from spotring.providers.azure.capacity import (
    CAPACITY_ERRORS,
    PRICE_ERRORS,
    QUOTA_ERRORS,
    is_refusal,
    shortage_cause,
)
from spotring.providers.azure.client import (
    COMPUTE_API_VERSION,
    CONNECTION_TIMEOUT,
    DEFAULT_ENDPOINT,
    READ_TIMEOUT,
    SharedClients,
    client_options,
)
from spotring.providers.azure.groups import ScaleSetSpec, scale_set_specs
from spotring.providers.azure.options import DEFAULT_SLOTS_TAG
from spotring.providers.azure.permissions import ACTION_BY_CALL, IAM_ACTIONS
from spotring.providers.azure.provider import AzureProvider, spotring_register_providers
from spotring.providers.azure.states import (
    HEALTH_STATE_MAP,
    POWER_STATE_MAP,
    PROVISIONING_STATE_MAP,
    TRANSIENT_STOP_PROVISIONING,
    creation_failed,
    member_state,
)

__all__ = [
    "ACTION_BY_CALL",
    "CAPACITY_ERRORS",
    "COMPUTE_API_VERSION",
    "CONNECTION_TIMEOUT",
    "DEFAULT_ENDPOINT",
    "DEFAULT_SLOTS_TAG",
    "HEALTH_STATE_MAP",
    "IAM_ACTIONS",
    "POWER_STATE_MAP",
    "PRICE_ERRORS",
    "PROVISIONING_STATE_MAP",
    "QUOTA_ERRORS",
    "READ_TIMEOUT",
    "TRANSIENT_STOP_PROVISIONING",
    "AzureProvider",
    "ScaleSetSpec",
    "SharedClients",
    "client_options",
    "creation_failed",
    "is_refusal",
    "member_state",
    "scale_set_specs",
    "set_lifecycle",
    "shortage_cause",
    "spotring_register_providers",
]
