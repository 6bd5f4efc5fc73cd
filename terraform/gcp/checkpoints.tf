# Durable checkpoints (checkpoint_uri = gs://BUCKET/PREFIX): what the hosts' service
# accounts may do in that bucket. Nothing at all without checkpoint_uri.
#
# spotring's storage layer (`spotring run --checkpoint`) calls Cloud Storage through
# google-cloud-storage with the VM's service account, on the workers (writing
# checkpoints, reading them on resume, deleting all but the last --checkpoint-keep) and
# on the driver (the job's lock, reading the newest manifest). Every object it touches
# lies under PREFIX/, and it lists with a prefix that starts with PREFIX/. The bucket is
# yours (the module creates none); it must have uniform bucket-level access, without
# which Cloud Storage refuses IAM conditions.
#
# Two custom roles, bound on the bucket (not the project) with IAM conditions:
#
# | role              | permissions                    | workers, if         | driver, if            |
# |-------------------|--------------------------------|---------------------|-----------------------|
# | checkpoint read   | storage.objects.get, .list     | under PREFIX/       | under PREFIX/         |
# | checkpoint write  | storage.objects.create,.delete | under PREFIX/       | PREFIX/lock.json only |
#
# - get (also the metadata reads of exists/reload), create (uploads, resumable ones
#   included, and the lock's ifGenerationMatch=0 create) and delete act on an object:
#   the condition sees its name, "projects/_/buckets/BUCKET/objects/NAME", so
#   resource.name.startsWith(".../objects/PREFIX/") confines them to the prefix.
#   Overwriting an object (the lock's heartbeat) takes create and delete on it.
# - storage.objects.list is checked on the bucket, not on an object: resource.name is
#   then "projects/_/buckets/BUCKET", which a condition on object names never matches,
#   so such a condition alone would deny every listing. Cloud Storage hands conditions
#   the list request's prefix as the API attribute
#   storage.googleapis.com/objectListPrefix instead; the read role's condition admits a
#   list whose prefix starts with PREFIX/. (The other choice, granting list on the whole
#   bucket without a condition, would show the names of every object in it.) This has
#   not been tried against Cloud Storage from this repository: should a listing under
#   PREFIX/ ever be refused, bind the read role without the second half of the condition.
# - Both hosts also need the devstorage.read_write access scope: a VM's scopes cap what
#   its service account's token may do whatever the roles say.
# - Custom roles of a project can only be granted on that project's resources: they are
#   created in checkpoint_bucket_project (default: project), the bucket's project.

locals {
  checkpoints = var.checkpoint_uri != ""

  # [BUCKET, PREFIX] of gs://BUCKET/PREFIX (the variable's validation ensures the form;
  # a trailing slash is dropped).
  checkpoint_location = local.checkpoints ? regex("^gs://([^/]+)/(.+?)/?$", var.checkpoint_uri) : ["", ""]
  checkpoint_bucket   = local.checkpoint_location[0]
  checkpoint_objects  = "projects/_/buckets/${local.checkpoint_location[0]}/objects/${local.checkpoint_location[1]}/"

  checkpoint_bucket_project = coalesce(var.checkpoint_bucket_project, var.project)

  # The IAM conditions (CEL; the validation keeps quotes out of BUCKET and PREFIX).
  checkpoint_read_condition  = "resource.name.startsWith(\"${local.checkpoint_objects}\") || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${local.checkpoint_location[1]}/\")"
  checkpoint_write_condition = "resource.name.startsWith(\"${local.checkpoint_objects}\")"
  checkpoint_lock_condition  = "resource.name == \"${local.checkpoint_objects}lock.json\""

  checkpoint_scopes = local.checkpoints ? ["https://www.googleapis.com/auth/devstorage.read_write"] : []

  # Appended to spotring_command (outputs.tf).
  checkpoint_option = local.checkpoints ? " --checkpoint ${var.checkpoint_uri}" : ""
}

resource "google_project_iam_custom_role" "checkpoint_read" {
  count = local.checkpoints ? 1 : 0

  project     = local.checkpoint_bucket_project
  role_id     = "${local.role_id_prefix}_checkpoint_read"
  title       = "spotring ${var.name}: read checkpoints"
  description = "List and read spotring's durable checkpoints (bound on the bucket with a condition on the prefix)."
  stage       = "GA"
  permissions = [
    "storage.objects.get",
    "storage.objects.list",
  ]
}

resource "google_project_iam_custom_role" "checkpoint_write" {
  count = local.checkpoints ? 1 : 0

  project     = local.checkpoint_bucket_project
  role_id     = "${local.role_id_prefix}_checkpoint_write"
  title       = "spotring ${var.name}: write checkpoints"
  description = "Create, overwrite and delete spotring's durable checkpoints and lock (bound on the bucket with a condition on the names)."
  stage       = "GA"
  permissions = [
    "storage.objects.create",
    "storage.objects.delete",
  ]
}

resource "google_storage_bucket_iam_member" "worker_checkpoint_read" {
  count = local.checkpoints ? 1 : 0

  bucket = local.checkpoint_bucket
  role   = google_project_iam_custom_role.checkpoint_read[0].name
  member = "serviceAccount:${google_service_account.worker.email}"

  condition {
    title       = "spotring-${var.name}-checkpoints"
    description = "Objects under the checkpoint prefix, and listings of it"
    expression  = local.checkpoint_read_condition
  }
}

resource "google_storage_bucket_iam_member" "worker_checkpoint_write" {
  count = local.checkpoints ? 1 : 0

  bucket = local.checkpoint_bucket
  role   = google_project_iam_custom_role.checkpoint_write[0].name
  member = "serviceAccount:${google_service_account.worker.email}"

  condition {
    title       = "spotring-${var.name}-checkpoints"
    description = "Objects under the checkpoint prefix"
    expression  = local.checkpoint_write_condition
  }
}

resource "google_storage_bucket_iam_member" "driver_checkpoint_read" {
  count = local.checkpoints ? 1 : 0

  bucket = local.checkpoint_bucket
  role   = google_project_iam_custom_role.checkpoint_read[0].name
  member = "serviceAccount:${google_service_account.driver.email}"

  condition {
    title       = "spotring-${var.name}-checkpoints"
    description = "Objects under the checkpoint prefix, and listings of it"
    expression  = local.checkpoint_read_condition
  }
}

# The driver writes the job's lock and nothing else.
resource "google_storage_bucket_iam_member" "driver_checkpoint_lock" {
  count = local.checkpoints ? 1 : 0

  bucket = local.checkpoint_bucket
  role   = google_project_iam_custom_role.checkpoint_write[0].name
  member = "serviceAccount:${google_service_account.driver.email}"

  condition {
    title       = "spotring-${var.name}-checkpoint-lock"
    description = "The job's lock object only"
    expression  = local.checkpoint_lock_condition
  }
}
