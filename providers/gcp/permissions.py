"""The IAM permission each Compute Engine call of the ``gcp`` provider needs: the one
list terraform/gcp's role, the docs' table (:mod:`spotring.providers.permissions`)
and the provider's own permission errors are made from."""

from __future__ import annotations

from collections.abc import Mapping

PERMISSION_BY_CALL: Mapping[str, str] = {
    "instanceGroupManagers.get": "compute.instanceGroupManagers.get",
    "instanceGroupManagers.listManagedInstances": "compute.instanceGroupManagers.get",
    "instanceGroupManagers.resize": "compute.instanceGroupManagers.update",
    "instanceGroupManagers.recreateInstances": "compute.instanceGroupManagers.update",
    # Both on the group: see the methods' REST reference pages ("Authorization requires
    # the following IAM permission on the specified resource instanceGroupManager").
    "instanceGroupManagers.deleteInstances": "compute.instanceGroupManagers.update",
    "instanceGroupManagers.listErrors": "compute.instanceGroupManagers.get",
    "instances.list": "compute.instances.list",
    # Global and regional templates alike (instanceTemplates.get and
    # regionInstanceTemplates.get reference pages).
    "instanceTemplates.get": "compute.instanceTemplates.get",
    # The vCPUs and memory a member's price is counted from (machineTypes.get).
    "machineTypes.get": "compute.machineTypes.get",
}
"""The IAM permission each API call the provider makes needs, by the call's name in
errors (regional groups: the same calls of regionInstanceGroupManagers and
regionInstanceTemplates). The docs' table is made from it
(:mod:`spotring.providers.permissions`)."""

IAM_PERMISSIONS: tuple[str, ...] = tuple(dict.fromkeys(PERMISSION_BY_CALL.values()))
"""Every IAM permission the provider needs; a custom role holding exactly these is
enough (terraform/gcp grants them to the driver's service account)."""

__all__ = ["IAM_PERMISSIONS", "PERMISSION_BY_CALL"]
