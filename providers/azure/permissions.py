"""The Azure RBAC action each ARM call of the provider needs: the single list that the
error messages, ``spotring.providers.permissions`` (the docs' tables) and terraform/azure's
tests read."""

from __future__ import annotations

from collections.abc import Mapping

ACTION_BY_CALL: Mapping[str, str] = {
    "virtualMachineScaleSets.get": "Microsoft.Compute/virtualMachineScaleSets/read",
    "virtualMachineScaleSets.update": "Microsoft.Compute/virtualMachineScaleSets/write",
    "virtualMachineScaleSets.deleteInstances": (
        "Microsoft.Compute/virtualMachineScaleSets/delete/action"
    ),
    "virtualMachineScaleSetVMs.list": (
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
    ),
    "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces": (
        "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read"
    ),
    "virtualMachines.list": "Microsoft.Compute/virtualMachines/read",
    "virtualMachines.delete": "Microsoft.Compute/virtualMachines/delete",
    "networkInterfaces.list": "Microsoft.Network/networkInterfaces/read",
    "resourceSkus.list": "Microsoft.Compute/skus/read",
    # The status of a scale-out's long-running operation (its URL, from the update's
    # Azure-AsyncOperation header, is a subscription-level resource).
    "operations.get": "Microsoft.Compute/locations/operations/read",
}
"""The action each call (named as the provider names it to ``call_api``) needs."""

IAM_ACTIONS: tuple[str, ...] = tuple(dict.fromkeys(ACTION_BY_CALL.values()))
"""Every action the provider performs; a custom role with exactly these is enough
(terraform/azure gives it to the driver's managed identity)."""
