# The driver host: runs `spotring run` (controller + Horovod's elastic driver) on demand.
# Its service account holds the custom roles of iam.tf and nothing else but log writing.

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
  # output; the custom roles decide what the calls may do.
  service_account {
    email = google_service_account.driver.email
    scopes = [
      "https://www.googleapis.com/auth/compute",
      "https://www.googleapis.com/auth/logging.write",
    ]
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
    "startup-script" = templatefile(local.bootstrap_template, {
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
    })
  }

  lifecycle {
    # A newer image in the image family must not replace a running driver.
    ignore_changes = [boot_disk[0].initialize_params[0].image]
  }
}
