"""The ``aws`` provider: an EC2 Auto Scaling group.

spotring lists the group's members with one DescribeAutoScalingGroups call (lifecycle
and health), then DescribeInstances in batches (address, EC2 state, spot or on-demand,
type, zone, tags). It steers the group with SetDesiredCapacity and replaces a failed
host by marking it Unhealthy, so the group itself terminates and relaunches it.

A job may span several groups (``--group`` given more than once, ``NAME`` or
``REGION/NAME``): one provider per group, in the user's order of preference. For the
capacity controller each reports what it launches (spot or on-demand, from the group's
configuration), the launches the group's scaling activities say failed for capacity,
quota or price, and hands a fallback host back with TerminateInstanceInAutoScalingGroup.

boto3 is imported on first use, so importing this package (and ``spotring --help``) costs
nothing when the ``aws`` extra is not installed.

Rooms:

- :mod:`.permissions`: the IAM action of each API call, and the least-privilege policy
- :mod:`.errors`: AWS's error codes and their translation into ProviderError
- :mod:`.states`: Auto Scaling's and EC2's states -> InstanceState, and a member's state
- :mod:`.capacity`: what the group launches, and its failed launches -> CapacityShortage
- :mod:`.records`: the fields an answer must hold, and one member read into an Instance
- :mod:`.options`: the command-line options and ``--group [REGION/]NAME``
- :mod:`.client`: the SDK's clients, one counted call, the paginated and batched reads
- :mod:`.provider`: :class:`AwsProvider`, composing the rooms, and its registration
"""

from spotring.providers.aws.capacity import (
    SCALING_ACTIVITIES_PAGE,
    SCALING_ACTIVITIES_PAGES,
    SHORTAGE_CODES,
    shortage_from_activity,
)
from spotring.providers.aws.client import DESCRIBE_INSTANCE_TYPES_BATCH, DESCRIBE_INSTANCES_BATCH
from spotring.providers.aws.options import DEFAULT_SLOTS_TAG, parse_group
from spotring.providers.aws.permissions import (
    IAM_ACTION_BY_OPERATION,
    IAM_ACTIONS,
    IAM_STEERING_ACTIONS,
    iam_policy,
)
from spotring.providers.aws.provider import AwsProvider, spotring_register_providers
from spotring.providers.aws.states import (
    EC2_STATE_MAP,
    HEALTH_STATUS_MAP,
    LIFECYCLE_STATE_MAP,
    member_state,
)

__all__ = [
    "DEFAULT_SLOTS_TAG",
    "DESCRIBE_INSTANCES_BATCH",
    "DESCRIBE_INSTANCE_TYPES_BATCH",
    "EC2_STATE_MAP",
    "HEALTH_STATUS_MAP",
    "IAM_ACTIONS",
    "IAM_ACTION_BY_OPERATION",
    "IAM_STEERING_ACTIONS",
    "LIFECYCLE_STATE_MAP",
    "SCALING_ACTIVITIES_PAGE",
    "SCALING_ACTIVITIES_PAGES",
    "SHORTAGE_CODES",
    "AwsProvider",
    "iam_policy",
    "member_state",
    "parse_group",
    "shortage_from_activity",
    "spotring_register_providers",
]
