# The spot workers: a virtual machine scale set in Flexible orchestration (its members
# are ordinary VMs with ordinary network interfaces, the default for new sets).
#
# No autoscale setting: spotring sizes the set itself (its capacity) from -np/--min-np/
# --max-np and the slots its members report, and restores the capacity Azure lowers when
# it evicts a spot VM (eviction policy Delete). An autoscale setting would fight spotring
# over the capacity.

resource "azurerm_orchestrated_virtual_machine_scale_set" "workers" {
  name                = var.name
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  sku_name            = var.vm_size

  # One fault domain: spot capacity is not spread for availability; Azure places the
  # VMs wherever it has room ("max spreading").
  platform_fault_domain_count = 1
  zones                       = length(var.zones) > 0 ? var.zones : null

  # The initial capacity only: spotring resizes the set, and Terraform ignores the drift.
  instances = var.worker_count

  # Spot VMs, deleted (not deallocated) when Azure evicts them: a deallocated VM keeps
  # its disk (billed) and its place in a set whose capacity it no longer serves, and it
  # lost its in-memory Horovod state anyway. A deleted one lowers the capacity, which
  # spotring restores, and the set creates a fresh VM wherever there is spot capacity.
  # -1: never evicted for price, only for capacity; pay at most the on-demand price.
  priority        = "Spot"
  eviction_policy = "Delete"
  max_bid_price   = -1

  # Encryption at host is opt-in: it needs the subscription feature
  # Microsoft.Compute/EncryptionAtHost and a VM size that supports it. The managed OS
  # disks are encrypted at rest with platform-managed keys either way; they hold the
  # venv and the job's code, no data set or secret.
  encryption_at_host_enabled = var.encryption_at_host_enabled

  # No VM extensions: the bootstrap runs from custom data through cloud-init, and GPU
  # drivers come with the image.
  extension_operations_enabled = false

  # No managed identity unless checkpoint_uri: then a user-assigned one (a Flexible set
  # takes no other kind) that may use the checkpoint container and nothing else
  # (checkpoints.tf). It is the VMs' only identity, so the metadata service hands out its
  # token without a client id (DefaultAzureCredential finds it).
  dynamic "identity" {
    for_each = local.checkpoints ? [azurerm_user_assigned_identity.workers[0].id] : []

    content {
      type         = "UserAssigned"
      identity_ids = [identity.value]
    }
  }

  source_image_id = var.source_image_id

  dynamic "source_image_reference" {
    for_each = var.source_image_id == null ? [var.image] : []

    content {
      publisher = source_image_reference.value.publisher
      offer     = source_image_reference.value.offer
      sku       = source_image_reference.value.sku
      version   = source_image_reference.value.version
    }
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = var.os_disk_type
    disk_size_gb         = var.os_disk_size_gb
  }

  # ssh keys only, no password. The bootstrap runs once, at first boot, from custom
  # data (cloud-init); a changed bootstrap reaches the VMs the set creates from then on.
  os_profile {
    custom_data = base64encode(templatefile(local.bootstrap_template, {
      role                   = "worker"
      ssh_user               = var.ssh_user
      ssh_authorized_keys    = join("\n", var.ssh_public_keys)
      torch_version          = var.torch_version
      torch_index_url        = var.torch_index_url
      horovod_version        = var.horovod_version
      horovod_wheel_url      = var.horovod_wheel_url
      horovod_gpu_operations = var.horovod_gpu_operations
      spotring_package       = var.spotring_package
      region                 = var.location
      group_name             = var.name
      # No launch lifecycle hook on Azure: the bootstrap's AWS-only step is a no-op.
      lifecycle_hook_name = ""
      job_setup_commands  = var.job_setup_commands
      requirements_lock   = chomp(file(local.requirements_lock_file))
    }))

    linux_configuration {
      admin_username                  = var.ssh_user
      disable_password_authentication = true
      provision_vm_agent              = true

      dynamic "admin_ssh_key" {
        for_each = toset(var.ssh_public_keys)

        content {
          username   = var.ssh_user
          public_key = admin_ssh_key.value
        }
      }
    }
  }

  # Private address only: no public_ip_address block. Outbound traffic goes through the
  # NAT gateway; inbound is what the subnet's security group allows.
  network_interface {
    name                           = "${var.name}-nic"
    primary                        = true
    accelerated_networking_enabled = var.accelerated_networking_enabled

    ip_configuration {
      name      = "internal"
      primary   = true
      subnet_id = azurerm_subnet.cluster.id
    }
  }

  # Serial log and screenshots in a managed storage account: where a worker without a
  # public IP is debugged from (cloud-init's output).
  boot_diagnostics {}

  # spotring's Azure provider reads each member's slot count from this tag
  # (--slots-tag, default spotring-slots).
  tags = merge(local.tags, {
    "spotring-slots" = tostring(var.slots_per_host)
  })

  # The bootstrap downloads everything at first boot: no VM before the subnet has its
  # NAT gateway (there is no default outbound access) and its security group.
  depends_on = [
    azurerm_subnet_nat_gateway_association.cluster,
    azurerm_subnet_network_security_group_association.cluster,
  ]

  lifecycle {
    # spotring steers the capacity; a later apply must not undo it.
    ignore_changes = [instances]

    precondition {
      condition     = var.min_worker_count <= var.worker_count && var.worker_count <= var.max_worker_count
      error_message = "Need min_worker_count <= worker_count <= max_worker_count."
    }
  }
}
