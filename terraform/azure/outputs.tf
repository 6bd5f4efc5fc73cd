output "scale_set_name" {
  description = "Name of the workers' virtual machine scale set (spotring run --group)."
  value       = azurerm_orchestrated_virtual_machine_scale_set.workers.name
}

output "scale_set_id" {
  description = "Resource id of the workers' scale set."
  value       = azurerm_orchestrated_virtual_machine_scale_set.workers.id
}

output "resource_group_name" {
  description = "Resource group holding everything (spotring run --resource-group)."
  value       = azurerm_resource_group.cluster.name
}

output "subscription_id" {
  description = "Subscription of the resource group (spotring run --subscription)."
  value       = var.subscription_id
}

output "location" {
  description = "Azure region of the scale set, the network and the driver."
  value       = azurerm_resource_group.cluster.location
}

output "driver_name" {
  description = "Name of the driver VM."
  value       = azurerm_linux_virtual_machine.driver.name
}

output "driver_private_ip" {
  description = "Private IP address of the driver; the workers reach its rendezvous server there."
  value       = azurerm_network_interface.driver.private_ip_address
}

output "driver_public_ip" {
  description = "Public IP address of the driver (empty without driver_public_ip)."
  value       = try(azurerm_public_ip.driver[0].ip_address, "")
}

output "driver_principal_id" {
  description = "Object id of the driver's system-assigned managed identity (the custom roles are assigned to it)."
  value       = local.driver_principal
}

output "nat_public_ip" {
  description = "Public IP address the workers' and the driver's outbound traffic leaves from (the NAT gateway)."
  value       = azurerm_public_ip.nat.ip_address
}

output "ssh_user" {
  description = "Login user on the hosts."
  value       = var.ssh_user
}

# -np counts processes: hosts x slots. --min-np is at least one host's worth even with
# min_worker_count = 0, since Horovod needs one process to start.
output "spotring_command" {
  description = "Command to run on the driver host (as ssh_user) to start elastic training on the scale set (with --checkpoint when checkpoint_uri is set). With job_command, the driver's spotring-job unit runs the same options for you."
  value       = "spotring run --provider azure --group ${azurerm_orchestrated_virtual_machine_scale_set.workers.name} --resource-group ${azurerm_resource_group.cluster.name} --subscription ${var.subscription_id} -np ${max(var.worker_count, 1) * var.slots_per_host} --min-np ${max(var.min_worker_count, 1) * var.slots_per_host} --max-np ${var.max_worker_count * var.slots_per_host}${local.checkpoint_option} -- ${var.train_command}"
}

output "driver_journal_command" {
  description = "With job_command: how to follow the job's log (the journal of the driver's spotring-job unit) over ssh, at the driver's public IP, else its private IP (from a peered network, a VPN or Bastion). null without job_command."
  value       = module.driver_job.enabled ? "ssh -t ${var.ssh_user}@${coalesce(try(azurerm_public_ip.driver[0].ip_address, ""), azurerm_network_interface.driver.private_ip_address)} sudo journalctl -u spotring-job -f" : null
}

output "worker_identity_client_id" {
  description = "Client id of the workers' user-assigned managed identity (checkpoint_uri only; null without). Their only identity, so AZURE_CLIENT_ID need not name it."
  value       = local.checkpoints ? azurerm_user_assigned_identity.workers[0].client_id : null
}
