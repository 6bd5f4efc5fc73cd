# The driver host: runs `spotring run` (controller + Horovod's elastic driver) on demand.
# Its system-assigned managed identity holds the custom roles of iam.tf and nothing else
# (and, with checkpoint_uri, the container's role of checkpoints.tf).

# The job under systemd (job_command): ../modules/driver-job renders the unit
# spotring-job.service and the snippet, appended to the driver's custom data below, that
# installs and starts it when the bootstrap has finished. Custom data runs once, at
# first boot, and changing it is ignored (see lifecycle below): a job_command set later
# reaches a new driver only. Nothing without job_command.
module "driver_job" {
  source = "../modules/driver-job"

  group_name = var.name
  # The options of spotring_command (outputs.tf), one argument per element.
  provider_args = [
    "--provider", "azure", "--group", var.name, "--resource-group", local.resource_group_name,
    "--subscription", var.subscription_id,
    "-np", tostring(max(var.worker_count, 1) * var.slots_per_host),
    "--min-np", tostring(max(var.min_worker_count, 1) * var.slots_per_host),
    "--max-np", tostring(var.max_worker_count * var.slots_per_host),
  ]
  ssh_user          = var.ssh_user
  job_command       = var.job_command
  job_args          = var.job_args
  working_directory = var.job_working_directory
  ssh_identity_file = var.job_ssh_identity_file
  checkpoint_uri    = var.checkpoint_uri
}

resource "azurerm_public_ip" "driver" {
  count = var.driver_public_ip ? 1 : 0

  name                = "${var.name}-driver-ip"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  allocation_method   = "Static"
  sku                 = "Standard"
  zones               = local.driver_zone == null ? null : [local.driver_zone]
  tags                = local.tags
}

resource "azurerm_network_interface" "driver" {
  name                = "${var.name}-driver-nic"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  tags                = local.tags

  # A public IP only on request; without one, reach the driver through Azure Bastion
  # or a VPN, or from a peered network (admin_cidrs still decides who gets ssh).
  #checkov:skip=CKV_AZURE_119:the driver gets a public IP only with driver_public_ip = true (default false), and ssh to it stays limited to admin_cidrs by the subnet's security group
  ip_configuration {
    name                          = "internal"
    subnet_id                     = azurerm_subnet.cluster.id
    private_ip_address_allocation = "Dynamic"
    public_ip_address_id          = var.driver_public_ip ? azurerm_public_ip.driver[0].id : null
  }
}

# The ssh rule of the security group targets this group rather than an address.
resource "azurerm_network_interface_application_security_group_association" "driver" {
  network_interface_id          = azurerm_network_interface.driver.id
  application_security_group_id = azurerm_application_security_group.driver.id
}

resource "azurerm_linux_virtual_machine" "driver" {
  name                  = "${var.name}-driver"
  resource_group_name   = azurerm_resource_group.cluster.name
  location              = azurerm_resource_group.cluster.location
  size                  = var.driver_vm_size
  zone                  = local.driver_zone
  network_interface_ids = [azurerm_network_interface.driver.id]
  tags                  = local.tags

  # On demand (priority Regular, the default): the driver holds the job's state and must
  # not be evicted.

  # The identity spotring's Azure provider authenticates as (DefaultAzureCredential
  # finds it through the metadata service); iam.tf gives it the custom roles.
  identity {
    type = "SystemAssigned"
  }

  # ssh keys only, no password; the same user and keys as on the workers.
  admin_username                  = var.ssh_user
  disable_password_authentication = true

  dynamic "admin_ssh_key" {
    for_each = toset(var.ssh_public_keys)

    content {
      username   = var.ssh_user
      public_key = admin_ssh_key.value
    }
  }

  # No VM extensions, but the agent (provisioning, ssh keys).
  allow_extension_operations = false
  provision_vm_agent         = true

  # Trusted launch (secure boot, vTPM) unless the image cannot do it.
  secure_boot_enabled = var.driver_trusted_launch
  vtpm_enabled        = var.driver_trusted_launch

  # Encryption at host is opt-in, as on the workers (see workers.tf).
  encryption_at_host_enabled = var.encryption_at_host_enabled

  source_image_id = var.driver_source_image_id

  dynamic "source_image_reference" {
    for_each = var.driver_source_image_id == null ? [var.image] : []

    content {
      publisher = source_image_reference.value.publisher
      offer     = source_image_reference.value.offer
      sku       = source_image_reference.value.sku
      version   = source_image_reference.value.version
    }
  }

  os_disk {
    name                 = "${var.name}-driver-os"
    caching              = "ReadWrite"
    storage_account_type = var.os_disk_type
    disk_size_gb         = var.os_disk_size_gb
  }

  # The same bootstrap as the workers (the driver needs horovod.runner and spotring),
  # run once by cloud-init at first boot; with job_command, the unit's installer after it.
  custom_data = base64encode(join("\n", compact([templatefile(local.bootstrap_template, {
    role                   = "driver"
    ssh_user               = var.ssh_user
    ssh_authorized_keys    = join("\n", var.ssh_public_keys)
    torch_version          = var.torch_version
    torch_index_url        = var.torch_index_url
    horovod_version        = var.horovod_version
    horovod_wheel_url      = var.horovod_wheel_url
    horovod_gpu_operations = ""
    spotring_package       = var.spotring_package
    region                 = var.location
    group_name             = var.name
    lifecycle_hook_name    = ""
    job_setup_commands     = var.job_setup_commands
    requirements_lock      = chomp(file(local.requirements_lock_file))
  }), module.driver_job.installer])))

  # Serial log (cloud-init's output) in a managed storage account.
  boot_diagnostics {}

  depends_on = [
    azurerm_subnet_nat_gateway_association.cluster,
    azurerm_subnet_network_security_group_association.cluster,
  ]

  lifecycle {
    # custom_data only runs at first boot, and changing it would replace the driver
    # (and whatever job it runs). A changed bootstrap reaches the driver with
    # `terraform apply -replace=azurerm_linux_virtual_machine.driver`.
    ignore_changes = [custom_data]
  }
}
