# The driver host: runs `spotring run` (controller + Horovod's elastic driver) on demand.
# Its service account holds the custom roles of iam.tf and nothing else but log writing
# (and, with checkpoint_uri, the bucket bindings of checkpoints.tf).

# The job under systemd (job_command): ../modules/driver-job renders the unit
# spotring-job.service and the snippet, appended to the driver's startup script below,
# that installs and starts it when the bootstrap has finished. Startup scripts run at
# every boot: a changed job_command reaches the driver at its next boot (or
# `sudo google_metadata_script_runner startup`), restarting the unit. Nothing without
# job_command.
module "driver_job" {
  source = "../modules/driver-job"

  group_name = var.name
  # The options of spotring_command (outputs.tf), one argument per element.
  provider_args = [
    "--provider", "gcp", "--group", var.name, "--region", var.region, "--project", var.project,
    "-np", tostring(max(var.worker_count, 1) * local.slots_per_host),
    "--min-np", tostring(max(var.min_worker_count, 1) * local.slots_per_host),
    "--max-np", tostring(var.max_worker_count * local.slots_per_host),
  ]
  ssh_user          = var.ssh_user
  job_command       = var.job_command
  job_args          = var.job_args
  working_directory = var.job_working_directory
  ssh_identity_file = var.job_ssh_identity_file
  checkpoint_uri    = var.checkpoint_uri
}

resource "google_compute_instance" "driver" {
  project      = var.project
  name         = "${var.name}-driver"
  description  = "spotring ${var.name} driver"
  zone         = local.driver_zone
  machine_type = var.driver_machine_type

  # Changing the machine type or the service account stops and starts the driver
  # instead of failing the apply.
  allow_stopping_for_update = true

  # The disk holds the venv and the job's code, no data set or secret; Compute Engine
  # encrypts it at rest with Google-managed keys.
  #checkov:skip=CKV_GCP_38:customer-supplied keys would put the raw key into Terraform state and be needed at every start; the disk holds only the venv and the job's code and is encrypted at rest with Google-managed keys
  boot_disk {
    auto_delete = true

    initialize_params {
      image = coalesce(var.driver_image, var.image)
      size  = var.boot_disk_size_gb
      type  = var.boot_disk_type
    }
  }

  network_interface {
    subnetwork = google_compute_subnetwork.cluster.id

    # An external address only on request; without one, reach the driver through
    # IAP TCP forwarding (admin_cidrs = ["35.235.240.0/20"]) or a VPN.
    #checkov:skip=CKV_GCP_40:the driver gets an external address only with driver_external_ip = true (default false), and ssh to it stays limited to admin_cidrs
    dynamic "access_config" {
      for_each = var.driver_external_ip ? [1] : []

      content {
        network_tier = "PREMIUM"
      }
    }
  }

  # On-demand: the driver holds the job's state and must not be reclaimed.
  scheduling {
    provisioning_model  = "STANDARD"
    preemptible         = false
    automatic_restart   = true
    on_host_maintenance = "MIGRATE"
  }

  # The compute scope for the group and instance calls, logging for the bootstrap's
  # output, the Cloud Billing Catalog's read-only scope for the members' prices (public
  # prices: no IAM role), Cloud Storage with checkpoint_uri; the roles decide what the
  # calls may do.
  service_account {
    email = google_service_account.driver.email
    scopes = concat([
      "https://www.googleapis.com/auth/compute",
      "https://www.googleapis.com/auth/logging.write",
      "https://www.googleapis.com/auth/cloud-billing.readonly",
    ], local.checkpoint_scopes)
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  # The same bootstrap as the workers (the driver needs horovod.runner and spotring).
  # Set as the startup-script metadata key rather than metadata_startup_script: a
  # change (new job_setup_commands, say) is then an in-place update for the next boot,
  # not a new driver.
  #
  # ssh keys only, as on the workers (see workers.tf).
  #checkov:skip=CKV_GCP_34:OS Login is off on purpose: spotring must run here as ssh_user, the one account that exists on every worker; an OS Login user on the driver would make Horovod's ssh launcher log in to the workers under a name they do not have
  metadata = {
    "ssh-keys"               = local.ssh_keys_metadata
    "block-project-ssh-keys" = "TRUE"
    "enable-oslogin"         = "FALSE"
    "serial-port-enable"     = "FALSE"
    "startup-script" = join("\n", compact([templatefile(local.bootstrap_template, {
      role                   = "driver"
      ssh_user               = var.ssh_user
      ssh_authorized_keys    = join("\n", var.ssh_public_keys)
      torch_version          = var.torch_version
      torch_index_url        = var.torch_index_url
      horovod_version        = var.horovod_version
      horovod_wheel_url      = var.horovod_wheel_url
      horovod_gpu_operations = ""
      spotring_package       = var.spotring_package
      region                 = var.region
      group_name             = var.name
      lifecycle_hook_name    = ""
      job_setup_commands     = var.job_setup_commands
      requirements_lock      = chomp(file(local.requirements_lock_file))
    }), module.driver_job.installer]))
  }

  lifecycle {
    # A newer image in the image family must not replace a running driver.
    ignore_changes = [boot_disk[0].initialize_params[0].image]
  }
}
