# Service accounts of the workers and the driver, and the driver's custom roles.
#
# The driver's roles grant exactly the calls spotring's GCP provider makes
# (spotring.providers.gcp.IAM_PERMISSIONS; tests/terraform/test_terraform_gcp.py keeps them
# equal). spotring does not wait on the operations its calls start, so neither
# compute.regionOperations.get nor compute.zoneOperations.get is granted.

locals {
  # The group as IAM conditions name it (resource.name of a regional instance group
  # manager in Compute Engine's IAM).
  group_resource_name = "projects/${var.project}/regions/${var.region}/instanceGroupManagers/${var.name}"

  # The worker template's name is ${var.name}-worker- and a suffix Terraform picks
  # (name_prefix, so a changed template can be created before the old one goes): a
  # prefix keeps the binding valid across replacements. A global template.
  template_resource_prefix = "projects/${var.project}/global/instanceTemplates/${var.name}-worker-"

  # Machine types are zonal: those of the region's zones (us-central1-a, ...).
  machine_type_resource_prefix = "projects/${var.project}/zones/${var.region}-"

  # Custom role ids allow letters, digits, underscores and dots.
  role_id_prefix = "spotring_${replace(var.name, "-", "_")}"

  # The metadata script runner sends the bootstrap's output to Cloud Logging, which is
  # where a worker without an external address can be debugged from. Nothing else.
  host_roles = toset(["roles/logging.logWriter"])
}

resource "google_service_account" "worker" {
  project      = var.project
  account_id   = "${var.name}-worker"
  display_name = "spotring ${var.name} worker"
  description  = "spotring workers of group ${var.name}: no access to any Google API beyond writing logs"
}

resource "google_service_account" "driver" {
  project      = var.project
  account_id   = "${var.name}-driver"
  display_name = "spotring ${var.name} driver"
  description  = "spotring driver of group ${var.name}: reads and resizes that group"
}

resource "google_project_iam_member" "worker_logs" {
  for_each = local.host_roles

  project = var.project
  role    = each.value
  member  = "serviceAccount:${google_service_account.worker.email}"
}

resource "google_project_iam_member" "driver_logs" {
  for_each = local.host_roles

  project = var.project
  role    = each.value
  member  = "serviceAccount:${google_service_account.driver.email}"
}

# Reading and steering the group: get (also listManagedInstances, listErrors) and update
# (resize, recreateInstances, deleteInstances). Both act on the group itself, so the binding below limits them
# to this one group with an IAM condition on its resource name.
resource "google_project_iam_custom_role" "driver_group" {
  project     = var.project
  role_id     = "${local.role_id_prefix}_group"
  title       = "spotring ${var.name}: read and steer the worker group"
  description = "What spotring's GCP provider calls on the instance group manager ${var.name}."
  stage       = "GA"
  permissions = [
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.update",
  ]
}

resource "google_project_iam_member" "driver_group" {
  project = var.project
  role    = google_project_iam_custom_role.driver_group.name
  member  = "serviceAccount:${google_service_account.driver.email}"

  condition {
    title       = "only-group-${var.name}"
    description = "Only the instance group manager ${var.name} in ${var.region}"
    expression  = "resource.name == '${local.group_resource_name}'"
  }
}

# Reading the group's instance template: whether it launches spot VMs
# (scheduling.provisioningModel), what the capacity policy asks of the group. Limited
# to this module's templates with an IAM condition on the name's prefix.
resource "google_project_iam_custom_role" "driver_template" {
  project     = var.project
  role_id     = "${local.role_id_prefix}_template"
  title       = "spotring ${var.name}: read the worker template"
  description = "What spotring's GCP provider reads of the instance template of ${var.name}."
  stage       = "GA"
  permissions = [
    "compute.instanceTemplates.get",
  ]
}

resource "google_project_iam_member" "driver_template" {
  project = var.project
  role    = google_project_iam_custom_role.driver_template.name
  member  = "serviceAccount:${google_service_account.driver.email}"

  condition {
    title       = "only-templates-${var.name}"
    description = "Only the worker instance templates of ${var.name}"
    expression  = "resource.name.startsWith('${local.template_resource_prefix}')"
  }
}

# Listing instances (addresses, spot-ness and accelerators of the members). A list call
# is authorized on the zone's collection, not on an instance: there is no instance
# name to match when it is checked, and IAM does not filter its results, so a
# resource.name condition could only deny it. It is granted project-wide, read-only.
resource "google_project_iam_custom_role" "driver_list" {
  project     = var.project
  role_id     = "${local.role_id_prefix}_list"
  title       = "spotring ${var.name}: list instances"
  description = "What spotring's GCP provider lists to learn the addresses of the group's members."
  stage       = "GA"
  permissions = [
    "compute.instances.list",
  ]
}

resource "google_project_iam_member" "driver_list" {
  project = var.project
  role    = google_project_iam_custom_role.driver_list.name
  member  = "serviceAccount:${google_service_account.driver.email}"
}

# Reading the machine type of the group's template (machineTypes.get: its vCPUs and
# memory, what a member's price is counted from), limited to the zones of the group's
# region. The Cloud Billing Catalog the prices come from needs no IAM permission, only
# the driver's cloud-billing.readonly scope (driver.tf).
resource "google_project_iam_custom_role" "driver_machine_types" {
  project     = var.project
  role_id     = "${local.role_id_prefix}_machine_types"
  title       = "spotring ${var.name}: read machine types"
  description = "What spotring's GCP provider reads of the machine types of ${var.name}'s region, for its prices."
  stage       = "GA"
  permissions = [
    "compute.machineTypes.get",
  ]
}

resource "google_project_iam_member" "driver_machine_types" {
  project = var.project
  role    = google_project_iam_custom_role.driver_machine_types.name
  member  = "serviceAccount:${google_service_account.driver.email}"

  condition {
    title       = "only-machine-types-${var.region}"
    description = "Only machine types of the zones of ${var.region}"
    expression  = "resource.name.startsWith('${local.machine_type_resource_prefix}')"
  }
}
