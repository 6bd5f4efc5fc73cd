# `terraform test` for the module with a mocked azurerm provider: no credentials, no API
# calls. It checks what only Terraform itself can: the configuration type-checks, the
# validations and preconditions reject bad input, and the rendered values come out
# right. (The custom roles are checked against spotring.providers.azure.IAM_ACTIONS in
# tests/terraform/test_terraform_azure.py, which can import it.)
# tests/terraform/test_terraform_azure.py runs it when SPOTRING_TERRAFORM_TESTS=1 and the provider
# mirror holds hashicorp/azurerm.

mock_provider "azurerm" {}

variables {
  subscription_id  = "00000000-0000-0000-0000-000000000000"
  location         = "eastus"
  name             = "spot-train"
  worker_count     = 2
  max_worker_count = 4
  admin_cidrs      = ["203.0.113.7/32"]
  ssh_public_keys  = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleExampleExample driver@spotring"]
  spotring_package = "spotring[azure] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
}

run "defaults" {
  command = plan

  assert {
    condition     = output.spotring_command == "spotring run --provider azure --group spot-train --resource-group spotring-spot-train --subscription 00000000-0000-0000-0000-000000000000 -np 2 --min-np 1 --max-np 4 -- python train.py"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = azurerm_orchestrated_virtual_machine_scale_set.workers.priority == "Spot" && azurerm_orchestrated_virtual_machine_scale_set.workers.eviction_policy == "Delete" && azurerm_orchestrated_virtual_machine_scale_set.workers.max_bid_price == -1 && azurerm_orchestrated_virtual_machine_scale_set.workers.platform_fault_domain_count == 1
    error_message = "the workers are not spot VMs deleted when evicted"
  }

  assert {
    condition     = length(azurerm_orchestrated_virtual_machine_scale_set.workers.network_interface[0].ip_configuration[0].public_ip_address) == 0 && length(azurerm_public_ip.driver) == 0
    error_message = "a worker, or by default the driver, has a public IP"
  }

  assert {
    condition     = azurerm_orchestrated_virtual_machine_scale_set.workers.os_profile[0].linux_configuration[0].disable_password_authentication && azurerm_linux_virtual_machine.driver.disable_password_authentication
    error_message = "password authentication is not disabled"
  }

  assert {
    condition     = azurerm_orchestrated_virtual_machine_scale_set.workers.tags["spotring-slots"] == "1" && azurerm_orchestrated_virtual_machine_scale_set.workers.tags["spotring-group"] == "spot-train"
    error_message = "the scale set lacks the slots or group tag"
  }

  assert {
    condition     = strcontains(base64decode(azurerm_orchestrated_virtual_machine_scale_set.workers.os_profile[0].custom_data), "LIFECYCLE_HOOK_NAME=''") && strcontains(base64decode(azurerm_orchestrated_virtual_machine_scale_set.workers.os_profile[0].custom_data), "ROLE='worker'")
    error_message = "the workers' custom data is not the bootstrap without a lifecycle hook"
  }

  assert {
    condition     = strcontains(base64decode(azurerm_linux_virtual_machine.driver.custom_data), "ROLE='driver'")
    error_message = "the driver's custom data is not the bootstrap"
  }

  assert {
    condition     = toset(flatten([azurerm_role_definition.driver_set.permissions[0].actions, azurerm_role_definition.driver_members.permissions[0].actions, azurerm_role_definition.driver_sizes.permissions[0].actions])) == toset(["Microsoft.Compute/virtualMachineScaleSets/read", "Microsoft.Compute/virtualMachineScaleSets/write", "Microsoft.Compute/virtualMachineScaleSets/delete/action", "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read", "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read", "Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/delete", "Microsoft.Network/networkInterfaces/read", "Microsoft.Compute/skus/read"])
    error_message = "the custom roles do not hold the provider's actions"
  }

  assert {
    condition     = azurerm_role_assignment.driver_sizes.scope == "/subscriptions/00000000-0000-0000-0000-000000000000"
    error_message = "the VM size role is not assigned on the subscription"
  }

  assert {
    condition     = length(azurerm_network_security_rule.driver_ssh) == 1 && azurerm_network_security_rule.driver_ssh[0].source_address_prefixes == toset(["203.0.113.7/32"])
    error_message = "ssh to the driver is not open from admin_cidrs"
  }

  assert {
    condition     = azurerm_network_security_rule.cluster_internal.source_address_prefix == "10.42.0.0/20" && azurerm_network_security_rule.deny_other_inbound.access == "Deny"
    error_message = "the security group does not limit inbound traffic to the address space"
  }

  assert {
    condition     = azurerm_subnet.cluster.default_outbound_access_enabled == false
    error_message = "the subnet has default outbound access"
  }

  # No checkpoint_uri, no job_command: no workers' identity, no storage role, no unit.
  assert {
    condition     = length(azurerm_user_assigned_identity.workers) == 0 && length(azurerm_role_definition.checkpoints) == 0 && length(azurerm_role_assignment.workers_checkpoints) == 0 && length(azurerm_role_assignment.driver_checkpoints) == 0 && length(azurerm_orchestrated_virtual_machine_scale_set.workers.identity) == 0
    error_message = "an identity or a storage role without checkpoint_uri"
  }

  assert {
    condition     = !strcontains(base64decode(azurerm_linux_virtual_machine.driver.custom_data), "spotring-job") && output.driver_journal_command == null
    error_message = "a job unit without job_command"
  }
}

run "gpus_zone_and_a_public_driver" {
  command = plan

  variables {
    vm_size                = "Standard_NC16as_T4_v3"
    slots_per_host         = 4
    zones                  = ["2"]
    min_worker_count       = 0
    driver_public_ip       = true
    admin_cidrs            = []
    horovod_gpu_operations = "NCCL"
    train_command          = "python /opt/job/train.py --epochs 90"
    job_setup_commands     = "git clone https://example.com/job.git \"$${HOME}/job\""
  }

  assert {
    condition     = output.spotring_command == "spotring run --provider azure --group spot-train --resource-group spotring-spot-train --subscription 00000000-0000-0000-0000-000000000000 -np 8 --min-np 4 --max-np 16 -- python /opt/job/train.py --epochs 90"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = azurerm_orchestrated_virtual_machine_scale_set.workers.tags["spotring-slots"] == "4" && azurerm_orchestrated_virtual_machine_scale_set.workers.sku_name == "Standard_NC16as_T4_v3"
    error_message = "slots_per_host does not reach the slots tag"
  }

  assert {
    condition     = azurerm_linux_virtual_machine.driver.zone == "2" && length(azurerm_public_ip.driver) == 1 && toset(azurerm_nat_gateway.nat.zones) == toset(["2"])
    error_message = "the driver and the NAT gateway are not in the one zone, or the driver has no public IP"
  }

  assert {
    condition     = length(azurerm_network_security_rule.driver_ssh) == 0
    error_message = "an ssh rule exists without admin_cidrs"
  }

  assert {
    condition     = strcontains(base64decode(azurerm_linux_virtual_machine.driver.custom_data), "git clone https://example.com/job.git \"$${HOME}/job\"\nSPOTRING_JOB_SETUP")
    error_message = "job_setup_commands do not reach the bootstrap verbatim"
  }
}

run "sizes_out_of_order" {
  command = plan

  variables {
    worker_count = 5
  }

  expect_failures = [azurerm_orchestrated_virtual_machine_scale_set.workers]
}

run "ssh_from_everywhere" {
  command = plan

  variables {
    admin_cidrs = ["0.0.0.0/0"]
  }

  expect_failures = [var.admin_cidrs]
}

run "spotring_without_its_hash" {
  command = plan

  variables {
    spotring_package = "spotring @ https://example.com/spotring-0.1.0-py3-none-any.whl"
  }

  expect_failures = [var.spotring_package]
}

run "reserved_tags" {
  command = plan

  variables {
    tags = { "spotring-slots" = "8" }
  }

  expect_failures = [var.tags]
}

run "durable_job" {
  command = plan

  variables {
    checkpoint_uri                = "https://ckptaccount.blob.core.windows.net/checkpoints/runs/spot-train"
    checkpoint_storage_account_id = "/subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/rg-data/providers/Microsoft.Storage/storageAccounts/ckptaccount"
    job_command                   = ["python", "/opt/train/train.py"]
  }

  assert {
    condition     = output.spotring_command == "spotring run --provider azure --group spot-train --resource-group spotring-spot-train --subscription 00000000-0000-0000-0000-000000000000 -np 2 --min-np 1 --max-np 4 --checkpoint https://ckptaccount.blob.core.windows.net/checkpoints/runs/spot-train -- python train.py"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = azurerm_role_assignment.workers_checkpoints[0].scope == "/subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/rg-data/providers/Microsoft.Storage/storageAccounts/ckptaccount/blobServices/default/containers/checkpoints" && azurerm_role_assignment.driver_checkpoints[0].scope == azurerm_role_assignment.workers_checkpoints[0].scope
    error_message = "the checkpoint roles are not assigned on the container"
  }

  assert {
    condition     = azurerm_role_definition.checkpoints[0].scope == "/subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/rg-data" && strcontains(azurerm_role_assignment.workers_checkpoints[0].condition, "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path] StringStartsWith 'runs/spot-train/'") && strcontains(azurerm_role_assignment.driver_checkpoints[0].condition, "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path] StringEquals 'runs/spot-train/lock.json'") && azurerm_orchestrated_virtual_machine_scale_set.workers.identity[0].type == "UserAssigned"
    error_message = "the workers' identity or role is not the expected one"
  }

  assert {
    condition     = strcontains(base64decode(azurerm_linux_virtual_machine.driver.custom_data), "\nExecStart=/opt/spotring/venv/bin/spotring \"run\" \"--provider\" \"azure\" \"--group\" \"spot-train\"") && strcontains(base64decode(azurerm_linux_virtual_machine.driver.custom_data), "\nRestart=on-failure\n")
    error_message = "the driver's custom data does not install the job's unit"
  }
}

run "checkpoints_without_the_account_id" {
  command = plan

  variables {
    checkpoint_uri = "https://ckptaccount.blob.core.windows.net/checkpoints/runs"
  }

  expect_failures = [azurerm_role_definition.checkpoints]
}

run "checkpoints_in_another_account" {
  command = plan

  variables {
    checkpoint_uri                = "https://ckptaccount.blob.core.windows.net/checkpoints/runs"
    checkpoint_storage_account_id = "/subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/rg-data/providers/Microsoft.Storage/storageAccounts/otheraccount"
  }

  expect_failures = [azurerm_role_definition.checkpoints]
}
