# The spot worker group: an instance template and a regional managed instance group.
#
# No autoscaler: spotring sizes the group itself (resize) from -np/--min-np/--max-np
# and the slots its members report, and the group replaces the spot VMs that Compute
# Engine takes back. An autoscaler would fight spotring over the target size.

resource "google_compute_instance_template" "workers" {
  project      = var.project
  name_prefix  = "${var.name}-worker-"
  description  = "spotring ${var.name} worker"
  region       = var.region
  machine_type = var.machine_type

  # spotring's GCP provider reads each member's slot count from this label
  # (--slots-label, default spotring-slots).
  labels = {
    "spotring-slots" = tostring(local.slots_per_host)
  }

  disk {
    source_image = var.image
    boot         = true
    auto_delete  = true
    disk_type    = var.boot_disk_type
    disk_size_gb = var.boot_disk_size_gb
  }

  # Private address only: no access_config. Outbound traffic goes through Cloud NAT.
  network_interface {
    subnetwork = google_compute_subnetwork.cluster.id
  }

  # Spot VMs. When Compute Engine reclaims one it is deleted, not stopped (DELETE):
  # the group then creates a replacement from the current template, in whichever zone
  # its distribution shape allows, instead of keeping a stopped VM tied to a zone that
  # has just run out of capacity (and billing its disk). A stopped worker would lose
  # its in-memory Horovod state anyway, and startup scripts run at every boot.
  scheduling {
    provisioning_model          = "SPOT"
    preemptible                 = true
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = "DELETE"
  }

  dynamic "guest_accelerator" {
    for_each = var.gpu_count > 0 ? [var.gpu_type] : []

    content {
      type  = guest_accelerator.value
      count = var.gpu_count
    }
  }

  # A dedicated account that may only write logs (and, with checkpoint_uri, read and
  # write checkpoints: checkpoints.tf); the scopes say the same.
  service_account {
    email  = google_service_account.worker.email
    scopes = concat(["https://www.googleapis.com/auth/logging.write"], local.checkpoint_scopes)
  }

  shielded_instance_config {
    enable_secure_boot          = var.enable_secure_boot
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  # ssh keys only (no passwords): project-wide keys are blocked and the serial console
  # is off. OS Login is off on purpose, see README.md (checkov).
  #checkov:skip=CKV_GCP_34:OS Login is off on purpose: Horovod's ssh launcher logs in from the driver to every worker as one local user with a key from the ssh-keys metadata; OS Login would need a POSIX account per service account and login roles on every worker
  metadata = {
    "ssh-keys"               = local.ssh_keys_metadata
    "block-project-ssh-keys" = "TRUE"
    "enable-oslogin"         = "FALSE"
    "serial-port-enable"     = "FALSE"
  }

  metadata_startup_script = templatefile(local.bootstrap_template, {
    role                   = "worker"
    ssh_user               = var.ssh_user
    ssh_authorized_keys    = join("\n", var.ssh_public_keys)
    torch_version          = var.torch_version
    torch_index_url        = var.torch_index_url
    horovod_version        = var.horovod_version
    horovod_wheel_url      = var.horovod_wheel_url
    horovod_gpu_operations = var.horovod_gpu_operations
    spotring_package       = var.spotring_package
    region                 = var.region
    group_name             = var.name
    # No launch lifecycle hook on GCP: the bootstrap's AWS-only step is a no-op.
    lifecycle_hook_name = ""
    job_setup_commands  = var.job_setup_commands
    requirements_lock   = chomp(file(local.requirements_lock_file))
  })

  lifecycle {
    # The group refers to the template; a changed template is created before the old
    # one is deleted.
    create_before_destroy = true
  }
}

resource "google_compute_region_instance_group_manager" "workers" {
  project            = var.project
  name               = var.name
  description        = "spotring ${var.name}: spot workers, sized by spotring"
  region             = var.region
  base_instance_name = "${var.name}-worker"

  distribution_policy_zones        = length(var.zones) > 0 ? var.zones : null
  distribution_policy_target_shape = var.distribution_target_shape

  # The initial size only: spotring resizes the group, and Terraform ignores the drift.
  target_size = var.worker_count

  # Do not hold `terraform apply` until spot capacity shows up.
  wait_for_instances = false

  version {
    name              = "workers"
    instance_template = google_compute_instance_template.workers.self_link_unique
  }

  # A new template never touches running workers (OPPORTUNISTIC): it is used for the
  # VMs the group creates from then on (resizes, replacements of reclaimed spot VMs,
  # spotring's recreateInstances). No proactive redistribution across zones either:
  # that would delete running workers to even out the zones.
  update_policy {
    type                         = "OPPORTUNISTIC"
    minimal_action               = "REPLACE"
    instance_redistribution_type = "NONE"
    replacement_method           = "SUBSTITUTE"
    # Only used by updates someone starts by hand. Surge 0 suits every distribution
    # shape; a fixed maxUnavailable must be 0 or at least the number of zones.
    max_surge_fixed       = 0
    max_unavailable_fixed = max(length(var.zones), 4)
  }

  # A VM the group recreates (a reclaimed spot VM) gets the current template.
  instance_lifecycle_policy {
    force_update_on_repair = "YES"
  }

  lifecycle {
    # spotring steers the size; a later apply must not undo it.
    ignore_changes = [target_size]

    precondition {
      condition     = var.min_worker_count <= var.worker_count && var.worker_count <= var.max_worker_count
      error_message = "Need min_worker_count <= worker_count <= max_worker_count."
    }

    precondition {
      condition     = alltrue([for zone in var.zones : startswith(zone, "${var.region}-")])
      error_message = "Every zone in zones must be in region."
    }
  }
}
