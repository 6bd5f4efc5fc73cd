# Durable checkpoints (checkpoint_uri = https://ACCOUNT.blob.core.windows.net/CONTAINER/
# PREFIX): what the hosts' managed identities may do in that storage account. Nothing at
# all without checkpoint_uri.
#
# spotring's storage layer (`spotring run --checkpoint`) calls Blob Storage through
# azure-storage-blob with DefaultAzureCredential, on the workers (writing checkpoints,
# reading them on resume, deleting all but the last --checkpoint-keep) and on the driver
# (the job's lock, created with If-None-Match: *, overwritten as a heartbeat and
# deleted; reading the newest manifest). Every blob it touches lies under PREFIX/.
#
# | identity                                   | may, by the conditions below             |
# |--------------------------------------------|------------------------------------------|
# | workers: user-assigned NAME-workers (new)  | read, list, write, delete under PREFIX/  |
# | driver: its system-assigned identity       | read and list under PREFIX/; write and   |
# |                                            | delete PREFIX/lock.json only             |
#
# One custom role holds the blob data actions the layer uses (blobs/read for Get Blob,
# Get Blob Properties and List Blobs; blobs/write and blobs/add/action for Put Blob,
# Put Block and Put Block List; blobs/delete), and nothing on the container itself.
# It is assigned on the container, and each assignment carries a condition (Azure ABAC,
# condition_version 2.0) on the blob's path (@Resource[...blobs:path]) and, for List
# Blobs (suboperation Blob.List, which has no path), on the request's prefix
# (@Request[...blobs:prefix]): the forms of "Read or list blobs in named containers
# with a path" and "Write blobs in named containers with a path" in Azure's "Example
# Azure role assignment conditions for Blob Storage". Custom roles are assignable at
# resource groups, not resources: the role lives in the storage account's resource
# group. The account and container are yours: the module creates neither.

locals {
  checkpoints = var.checkpoint_uri != ""

  # [ACCOUNT, CONTAINER, PREFIX] of checkpoint_uri (the variable's validation ensures
  # the form and keeps quotes out of PREFIX; a trailing slash is dropped).
  checkpoint_location        = local.checkpoints ? regex("^https://([a-z0-9]+)\\.blob\\.core\\.windows\\.net/([^/]+)/(.+?)/?$", var.checkpoint_uri) : ["", "", ""]
  checkpoint_account_id      = coalesce(var.checkpoint_storage_account_id, "/")
  checkpoint_container_scope = "${local.checkpoint_account_id}/blobServices/default/containers/${local.checkpoint_location[1]}"
  checkpoint_account_group   = try(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+", local.checkpoint_account_id), "")

  # The assignments' conditions: reads (but List Blobs) under PREFIX/, listings of a
  # prefix that starts with PREFIX/, and writes and deletes where the path passes the
  # test put in place of %s (workers: under PREFIX/; driver: the lock only).
  blobs                        = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
  checkpoint_condition_format  = <<-EOT
    (
     (
      !(ActionMatches{'${local.blobs}/read'} AND NOT SubOperationMatches{'Blob.List'})
     )
     OR
     (
      @Resource[${local.blobs}:path] StringStartsWith '${local.checkpoint_location[2]}/'
     )
    )
    AND
    (
     (
      !(ActionMatches{'${local.blobs}/read'} AND SubOperationMatches{'Blob.List'})
     )
     OR
     (
      @Request[${local.blobs}:prefix] StringStartsWith '${local.checkpoint_location[2]}/'
     )
    )
    AND
    (
     (
      !(ActionMatches{'${local.blobs}/write'})
      AND
      !(ActionMatches{'${local.blobs}/add/action'})
      AND
      !(ActionMatches{'${local.blobs}/delete'})
     )
     OR
     (
      @Resource[${local.blobs}:path] %s
     )
    )
  EOT
  workers_checkpoint_condition = format(local.checkpoint_condition_format, "StringStartsWith '${local.checkpoint_location[2]}/'")
  driver_checkpoint_condition  = format(local.checkpoint_condition_format, "StringEquals '${local.checkpoint_location[2]}/lock.json'")

  # Appended to spotring_command (outputs.tf).
  checkpoint_option = local.checkpoints ? " --checkpoint ${var.checkpoint_uri}" : ""
}

# The workers' identity: nothing but the container's role below.
resource "azurerm_user_assigned_identity" "workers" {
  count = local.checkpoints ? 1 : 0

  name                = "${var.name}-workers"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  tags                = local.tags
}

# The blob data actions of spotring's storage layer, nothing else; what each identity
# may do with them is in its assignment's condition.
resource "azurerm_role_definition" "checkpoints" {
  count = local.checkpoints ? 1 : 0

  name        = "${local.role_name_prefix}: checkpoints"
  scope       = local.checkpoint_account_group
  description = "Blob data actions of spotring's durable checkpoints (assigned on the container with a condition on the path)."

  permissions {
    actions = []
    data_actions = [
      "${local.blobs}/read",
      "${local.blobs}/write",
      "${local.blobs}/add/action",
      "${local.blobs}/delete",
    ]
    not_actions      = []
    not_data_actions = []
  }

  assignable_scopes = [local.checkpoint_account_group]

  lifecycle {
    precondition {
      condition     = var.checkpoint_storage_account_id != null
      error_message = "checkpoint_uri needs checkpoint_storage_account_id (az storage account show -n ACCOUNT --query id)."
    }

    precondition {
      condition     = endswith(local.checkpoint_account_id, "/storageAccounts/${local.checkpoint_location[0]}")
      error_message = "checkpoint_storage_account_id must be the account of checkpoint_uri (${local.checkpoint_location[0]})."
    }
  }
}

resource "azurerm_role_assignment" "workers_checkpoints" {
  count = local.checkpoints ? 1 : 0

  scope              = local.checkpoint_container_scope
  role_definition_id = azurerm_role_definition.checkpoints[0].role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.workers[0].principal_id
  principal_type     = "ServicePrincipal"
  description        = "spotring ${var.name} workers: read, write and delete checkpoints under the prefix"
  condition          = local.workers_checkpoint_condition
  condition_version  = "2.0"
}

resource "azurerm_role_assignment" "driver_checkpoints" {
  count = local.checkpoints ? 1 : 0

  scope              = local.checkpoint_container_scope
  role_definition_id = azurerm_role_definition.checkpoints[0].role_definition_resource_id
  principal_id       = local.driver_principal
  principal_type     = "ServicePrincipal"
  description        = "spotring ${var.name} driver: the job's lock, reading checkpoints under the prefix"
  condition          = local.driver_checkpoint_condition
  condition_version  = "2.0"
}
