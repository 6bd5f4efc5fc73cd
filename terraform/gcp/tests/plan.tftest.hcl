# `terraform test` for the module with a mocked Google provider: no credentials, no API
# calls. It checks what only Terraform itself can: the configuration type-checks, the
# validations and preconditions reject bad input, and the rendered values come out
# right. (The custom roles are checked against spotring.providers.gcp.IAM_PERMISSIONS
# in tests/terraform/test_terraform_gcp.py, which can import it.)
# tests/terraform/test_terraform_gcp.py runs it when SPOTRING_TERRAFORM_TESTS=1 and the provider
# mirror holds hashicorp/google.

mock_provider "google" {
  mock_data "google_compute_zones" {
    defaults = {
      names = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    }
  }
}

variables {
  project          = "my-project"
  region           = "us-central1"
  name             = "spot-train"
  worker_count     = 2
  max_worker_count = 4
  admin_cidrs      = ["35.235.240.0/20"]
  ssh_public_keys  = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleExampleExample driver@spotring"]
  spotring_package = "spotring[gcp] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
}

run "defaults" {
  command = plan

  assert {
    condition     = output.spotring_command == "spotring run --provider gcp --group spot-train --region us-central1 --project my-project -np 2 --min-np 1 --max-np 4 -- python train.py"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = google_compute_instance_template.workers.scheduling[0].provisioning_model == "SPOT" && google_compute_instance_template.workers.scheduling[0].preemptible && google_compute_instance_template.workers.scheduling[0].automatic_restart == false && google_compute_instance_template.workers.scheduling[0].on_host_maintenance == "TERMINATE" && google_compute_instance_template.workers.scheduling[0].instance_termination_action == "DELETE"
    error_message = "the workers are not spot VMs deleted when reclaimed"
  }

  assert {
    condition     = length(google_compute_instance_template.workers.network_interface[0].access_config) == 0 && length(google_compute_instance.driver.network_interface[0].access_config) == 0
    error_message = "a worker, or by default the driver, has an external address"
  }

  assert {
    condition     = length(google_compute_instance_template.workers.guest_accelerator) == 0 && google_compute_instance_template.workers.labels["spotring-slots"] == "1"
    error_message = "without GPUs a worker has no accelerator and one slot"
  }

  assert {
    condition     = strcontains(google_compute_instance_template.workers.metadata_startup_script, "LIFECYCLE_HOOK_NAME=''") && strcontains(google_compute_instance_template.workers.metadata_startup_script, "ROLE='worker'")
    error_message = "the workers' startup script is not the bootstrap without a lifecycle hook"
  }

  assert {
    condition     = strcontains(google_compute_instance.driver.metadata["startup-script"], "ROLE='driver'") && google_compute_instance.driver.metadata["block-project-ssh-keys"] == "TRUE"
    error_message = "the driver's metadata lacks the bootstrap or blocks no project-wide keys"
  }

  assert {
    condition     = google_compute_instance_template.workers.metadata["ssh-keys"] == "spotring:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleExampleExample driver@spotring"
    error_message = "the ssh-keys metadata is not user:key lines"
  }

  assert {
    condition     = google_compute_instance.driver.zone == "us-central1-a"
    error_message = "the driver is not in the region's first zone"
  }

  assert {
    condition     = google_compute_region_instance_group_manager.workers.update_policy[0].type == "OPPORTUNISTIC" && google_compute_region_instance_group_manager.workers.update_policy[0].instance_redistribution_type == "NONE"
    error_message = "the group's updates may roll running workers"
  }

  assert {
    condition     = google_project_iam_member.driver_group.condition[0].expression == "resource.name == 'projects/my-project/regions/us-central1/instanceGroupManagers/spot-train'"
    error_message = "the group permissions are not limited to the group"
  }

  assert {
    condition     = google_project_iam_member.driver_template.condition[0].expression == "resource.name.startsWith('projects/my-project/global/instanceTemplates/spot-train-worker-')"
    error_message = "the template permission is not limited to the worker templates"
  }

  assert {
    condition     = toset(google_project_iam_custom_role.driver_group.permissions) == toset(["compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update"]) && toset(google_project_iam_custom_role.driver_list.permissions) == toset(["compute.instances.list"]) && toset(google_project_iam_custom_role.driver_template.permissions) == toset(["compute.instanceTemplates.get"])
    error_message = "the custom roles do not hold the provider's permissions"
  }

  assert {
    condition     = length(google_compute_firewall.driver_ssh) == 1 && google_compute_firewall.driver_ssh[0].source_ranges == toset(["35.235.240.0/20"])
    error_message = "ssh to the driver is not open from admin_cidrs"
  }

  # No checkpoint_uri, no job_command: no storage permission or scope, no unit.
  assert {
    condition     = length(google_storage_bucket_iam_member.worker_checkpoint_read) == 0 && length(google_storage_bucket_iam_member.driver_checkpoint_lock) == 0 && length(google_project_iam_custom_role.checkpoint_write) == 0
    error_message = "storage permissions without checkpoint_uri"
  }

  assert {
    condition     = !contains(google_compute_instance_template.workers.service_account[0].scopes, "https://www.googleapis.com/auth/devstorage.read_write") && !strcontains(google_compute_instance.driver.metadata["startup-script"], "spotring-job") && output.driver_journal_command == null
    error_message = "a storage scope or a job unit without checkpoint_uri and job_command"
  }
}

run "gpus_zones_and_a_public_driver" {
  command = plan

  variables {
    gpu_count          = 4
    zones              = ["us-central1-b", "us-central1-c"]
    min_worker_count   = 0
    driver_external_ip = true
    admin_cidrs        = []
    train_command      = "python /opt/job/train.py --epochs 90"
    job_setup_commands = "git clone https://example.com/job.git \"$${HOME}/job\""
  }

  assert {
    condition     = output.spotring_command == "spotring run --provider gcp --group spot-train --region us-central1 --project my-project -np 8 --min-np 4 --max-np 16 -- python /opt/job/train.py --epochs 90"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = google_compute_instance_template.workers.guest_accelerator[0].count == 4 && google_compute_instance_template.workers.labels["spotring-slots"] == "4"
    error_message = "gpu_count does not reach the accelerators and the slots label"
  }

  assert {
    condition     = google_compute_instance.driver.zone == "us-central1-b" && length(google_compute_instance.driver.network_interface[0].access_config) == 1
    error_message = "the driver is not in the first zone, or has no external address"
  }

  assert {
    condition     = length(google_compute_firewall.driver_ssh) == 0
    error_message = "an ssh rule exists without admin_cidrs"
  }

  assert {
    condition     = strcontains(google_compute_instance.driver.metadata["startup-script"], "git clone https://example.com/job.git \"$${HOME}/job\"\nSPOTRING_JOB_SETUP")
    error_message = "job_setup_commands do not reach the bootstrap verbatim"
  }
}

run "sizes_out_of_order" {
  command = plan

  variables {
    worker_count = 5
  }

  expect_failures = [google_compute_region_instance_group_manager.workers]
}

run "zone_outside_the_region" {
  command = plan

  variables {
    zones = ["europe-west4-a"]
  }

  expect_failures = [google_compute_region_instance_group_manager.workers]
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

run "reserved_labels" {
  command = plan

  variables {
    labels = { "spotring-slots" = "8" }
  }

  expect_failures = [var.labels]
}

run "durable_job" {
  command = plan

  variables {
    checkpoint_uri = "gs://ckpt-bucket/runs/spot-train"
    job_command    = ["python", "/opt/train/train.py"]
  }

  assert {
    condition     = output.spotring_command == "spotring run --provider gcp --group spot-train --region us-central1 --project my-project -np 2 --min-np 1 --max-np 4 --checkpoint gs://ckpt-bucket/runs/spot-train -- python train.py"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = google_storage_bucket_iam_member.driver_checkpoint_lock[0].bucket == "ckpt-bucket" && google_storage_bucket_iam_member.driver_checkpoint_lock[0].condition[0].expression == "resource.name == \"projects/_/buckets/ckpt-bucket/objects/runs/spot-train/lock.json\""
    error_message = "the driver's write binding is not on the lock alone"
  }

  assert {
    condition     = google_storage_bucket_iam_member.worker_checkpoint_write[0].condition[0].expression == "resource.name.startsWith(\"projects/_/buckets/ckpt-bucket/objects/runs/spot-train/\")"
    error_message = "the workers' write binding is not on the prefix"
  }

  assert {
    condition     = contains(google_compute_instance_template.workers.service_account[0].scopes, "https://www.googleapis.com/auth/devstorage.read_write") && contains(google_compute_instance.driver.service_account[0].scopes, "https://www.googleapis.com/auth/devstorage.read_write")
    error_message = "the hosts lack the Cloud Storage scope"
  }

  assert {
    condition     = strcontains(google_compute_instance.driver.metadata["startup-script"], "\nExecStart=/opt/spotring/venv/bin/spotring \"run\" \"--provider\" \"gcp\" \"--group\" \"spot-train\"") && strcontains(google_compute_instance.driver.metadata["startup-script"], "\nRestart=on-failure\n") && endswith(google_compute_instance.driver.metadata["startup-script"], "install_spotring_job\n")
    error_message = "the driver's startup script does not install the job's unit"
  }

  assert {
    condition     = output.driver_journal_command == "gcloud compute ssh spotring@spot-train-driver --zone us-central1-a --project my-project --tunnel-through-iap --command 'sudo journalctl -u spotring-job -f'"
    error_message = "unexpected driver_journal_command: ${output.driver_journal_command}"
  }
}

run "s3_uri_on_gcp" {
  command = plan

  variables {
    checkpoint_uri = "s3://ckpt-bucket/runs"
  }

  expect_failures = [var.checkpoint_uri]
}
