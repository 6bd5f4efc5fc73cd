# The driver's custom roles: exactly the actions spotring's Azure provider performs
# (spotring.providers.azure.IAM_ACTIONS; tests/terraform/test_terraform_azure.py keeps them
# equal), each assigned at the narrowest scope its calls are authorized at. The
# provider starts long-running operations and never waits on them; it reads a
# scale-out's operation status only for its error (ZonalAllocationFailed and the like).
#
# | role        | actions                                          | assigned at    |
# |-------------|--------------------------------------------------|----------------|
# | scale set   | the set: read, write (capacity), delete/action   | the scale set  |
# |             | (deleteInstances), its VMs' and NICs' lists      |                |
# |             | (Uniform sets)                                   |                |
# | members     | virtualMachines read/delete, networkInterfaces   | resource group |
# |             | read (a Flexible set's members are ordinary VMs) |                |
# | sizes       | skus/read (GPU count of a VM size),              | subscription   |
# |             | locations/operations/read (a scale-out's result) |                |

locals {
  # Custom role names are unique in the tenant: name the subscription and group too.
  role_name_prefix = "spotring ${var.name} (${local.resource_group_name}, ${var.subscription_id})"

  subscription_scope = "/subscriptions/${var.subscription_id}"
  driver_principal   = azurerm_linux_virtual_machine.driver.identity[0].principal_id
}

# Calls on the scale set itself: get, update (capacity), deleteInstances, and for a
# Uniform set the lists of its VMs and network interfaces (children of the set).
# Assigned on the set, so they reach no other set.
resource "azurerm_role_definition" "driver_set" {
  name        = "${local.role_name_prefix}: scale set"
  scope       = azurerm_resource_group.cluster.id
  description = "What spotring's Azure provider calls on the scale set ${var.name}."

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachineScaleSets/read",
      "Microsoft.Compute/virtualMachineScaleSets/write",
      "Microsoft.Compute/virtualMachineScaleSets/delete/action",
      "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
      "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read",
    ]
    not_actions = []
  }

  assignable_scopes = [azurerm_resource_group.cluster.id]
}

resource "azurerm_role_assignment" "driver_set" {
  scope              = azurerm_orchestrated_virtual_machine_scale_set.workers.id
  role_definition_id = azurerm_role_definition.driver_set.role_definition_resource_id
  principal_id       = local.driver_principal
  principal_type     = "ServicePrincipal"
  description        = "spotring ${var.name} driver: read and steer the scale set"
}

# The members of a Flexible set are ordinary VMs with ordinary network interfaces,
# resources of the resource group rather than children of the set: the provider lists
# the group's VMs (filtered to the set) and network interfaces, and deletes a failed or
# evicted member. Azure RBAC has no conditions for Compute actions, so the resource
# group is the narrowest scope; that is why the module makes a group of its own. The
# driver VM is in it too: the identity could delete its own VM, and nothing else.
resource "azurerm_role_definition" "driver_members" {
  name        = "${local.role_name_prefix}: members"
  scope       = azurerm_resource_group.cluster.id
  description = "What spotring's Azure provider calls on the VMs and network interfaces of the scale set ${var.name}."

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachines/read",
      "Microsoft.Compute/virtualMachines/delete",
      "Microsoft.Network/networkInterfaces/read",
    ]
    not_actions = []
  }

  assignable_scopes = [azurerm_resource_group.cluster.id]
}

resource "azurerm_role_assignment" "driver_members" {
  scope              = azurerm_resource_group.cluster.id
  role_definition_id = azurerm_role_definition.driver_members.role_definition_resource_id
  principal_id       = local.driver_principal
  principal_type     = "ServicePrincipal"
  description        = "spotring ${var.name} driver: list and delete the scale set's VMs"
}

# The resource SKU list (GPU count of the members' VM size, when no slots tag says
# otherwise) is a subscription-level call: GET /subscriptions/ID/providers/
# Microsoft.Compute/skus. So is a scale-out's operation status (the update's
# Azure-AsyncOperation URL, /subscriptions/ID/providers/Microsoft.Compute/locations/
# LOCATION/operations/ID). An assignment on the resource group does not cover them.
# Both are read-only and reveal only which VM sizes the subscription may use where and
# how its Compute operations ended.
resource "azurerm_role_definition" "driver_sizes" {
  name        = "${local.role_name_prefix}: VM sizes"
  scope       = local.subscription_scope
  description = "What spotring's Azure provider reads at the subscription for the scale set ${var.name}: VM sizes (GPU counts), its scale-outs' operation status."

  permissions {
    actions = [
      "Microsoft.Compute/skus/read",
      "Microsoft.Compute/locations/operations/read",
    ]
    not_actions = []
  }

  assignable_scopes = [local.subscription_scope]
}

resource "azurerm_role_assignment" "driver_sizes" {
  scope              = local.subscription_scope
  role_definition_id = azurerm_role_definition.driver_sizes.role_definition_resource_id
  principal_id       = local.driver_principal
  principal_type     = "ServicePrincipal"
  description        = "spotring ${var.name} driver: read VM sizes"
}
