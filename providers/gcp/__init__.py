"""The ``gcp`` provider: Compute Engine managed instance groups (MIGs), zonal or regional.

A job spans one group or several, in order of preference (``--group`` given more than
once; ``ZONE/NAME`` or ``REGION/NAME`` places a group outside ``--zone``/``--region``):
one provider object per group, sharing the clients and credentials.

spotring lists the group's members with ``listManagedInstances`` (the group's action on
each member, the VM's status, health, the last creation attempt's errors), then, for
members not seen running before, the VMs themselves with one filtered
``instances.list`` per zone (address, machine type, SPOT or preemptible, accelerators,
labels). It steers the group with ``resize``, replaces a failed host with
``recreateInstances`` (same name, new VM, group size unchanged) and hands a host back
with ``deleteInstances`` (the group's target size drops by one).

For the capacity policy it reads what the group launches from its instance template
(``instanceTemplates.get``, once per template) and why members cannot be created from
the members' ``lastAttempt.errors`` (already in the listing) or, when no member shows
one, ``listErrors`` (every page, up to a bound: the errors come in no documented order).

A member whose row or VM lacks what the API always sends (a state, a running VM's IPv4
address, as an IPv6-only VM has none) is listed as not usable, with one warning while
it stays so; only an answer broken as a whole fails a listing.

A steady group costs one call per refresh. google-cloud-compute is imported on first
use, so importing this package costs nothing without the ``gcp`` extra.

Rooms:

* :mod:`.permissions`: the IAM permission each API call needs;
* :mod:`.states`: Compute Engine's member states -> :class:`InstanceState`;
* :mod:`.records`: what each answer holds, a member and its VM read into an Instance;
* :mod:`.capacity`: error codes -> :class:`CapacityShortage`;
* :mod:`.errors`: which errors are retried, each failed call's one-line error;
* :mod:`.groups`: ``--group`` values and what a job calls each group;
* :mod:`.options`: the provider's command-line options;
* :mod:`.client`: the library, credentials, clients, call bounds and one group's calls;
* :mod:`.provider`: :class:`GcpProvider`, composed of the above, and its registration.
"""

from spotring.providers.gcp.capacity import SHORTAGE_CAUSES, shortage_cause
from spotring.providers.gcp.groups import GroupSpec, group_specs, parse_group
from spotring.providers.gcp.permissions import IAM_PERMISSIONS, PERMISSION_BY_CALL
from spotring.providers.gcp.provider import GcpProvider, spotring_register_providers
from spotring.providers.gcp.states import (
    CURRENT_ACTION_MAP,
    HEALTH_STATE_MAP,
    INSTANCE_STATUS_MAP,
    member_state,
)

__all__ = [
    "CURRENT_ACTION_MAP",
    "HEALTH_STATE_MAP",
    "IAM_PERMISSIONS",
    "INSTANCE_STATUS_MAP",
    "PERMISSION_BY_CALL",
    "SHORTAGE_CAUSES",
    "GcpProvider",
    "GroupSpec",
    "group_specs",
    "member_state",
    "parse_group",
    "shortage_cause",
    "spotring_register_providers",
]
