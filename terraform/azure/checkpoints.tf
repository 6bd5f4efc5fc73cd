# Durable checkpoints (checkpoint_uri = https://ACCOUNT.blob.core.windows.net/CONTAINER/
# PREFIX): what the hosts' managed identities may do in that storage account. Nothing at
# all without checkpoint_uri.
#
# spotring's storage layer (`spotring run --checkpoint`) calls Blob Storage through
# azure-storage-blob with DefaultAzureCredential, on the workers (writing checkpoints,
# reading them on resume, deleting all but the last --checkpoint-keep) and on the driver
# (the job's lock, created with If-None-Match: *, overwritten as a heartbeat and
# deleted; reading the newest manifest). Every blob it touches lies under PREFIX/. The
# account and container are yours: the module creates neither.
#
# | identity                                   | role                          | scope          |
# |--------------------------------------------|-------------------------------|----------------|
# | workers: user-assigned NAME-workers (new)  | Storage Blob Data Contributor | the container  |
# | driver: its system-assigned identity       | Storage Blob Data Contributor | the container  |
#
# The built-in role holds the blob data actions the layer uses (blobs/read for Get Blob,
# Get Blob Properties and List Blobs; blobs/write and blobs/add/action for Put Blob, Put
# Block and Put Block List; blobs/delete), plus the container's own read, write and
# delete. Azure RBAC scopes go down to a container, not to a blob prefix: narrowing the
# assignments to PREFIX/ (or the driver's writes to PREFIX/lock.json) would take
# role-assignment conditions (ABAC on @Resource[...blobs:path]), which this module does
# not set, not having tried them against Azure. Give the checkpoints a container of
# their own.

locals {
  checkpoints = var.checkpoint_uri != ""

  # [ACCOUNT, CONTAINER] of checkpoint_uri (the variable's validation ensures the form).
  checkpoint_location        = local.checkpoints ? regex("^https://([a-z0-9]+)\\.blob\\.core\\.windows\\.net/([^/]+)/", var.checkpoint_uri) : ["", ""]
  checkpoint_account_id      = coalesce(var.checkpoint_storage_account_id, "/")
  checkpoint_container_scope = "${local.checkpoint_account_id}/blobServices/default/containers/${local.checkpoint_location[1]}"

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

resource "azurerm_role_assignment" "workers_checkpoints" {
  count = local.checkpoints ? 1 : 0

  scope                = local.checkpoint_container_scope
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.workers[0].principal_id
  principal_type       = "ServicePrincipal"
  description          = "spotring ${var.name} workers: read, write and delete checkpoints"

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

resource "azurerm_role_assignment" "driver_checkpoints" {
  count = local.checkpoints ? 1 : 0

  scope                = local.checkpoint_container_scope
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = local.driver_principal
  principal_type       = "ServicePrincipal"
  description          = "spotring ${var.name} driver: the job's lock, reading checkpoints"

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
