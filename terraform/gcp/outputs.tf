output "group_name" {
  description = "Name of the regional managed instance group of the workers (spotring run --group)."
  value       = google_compute_region_instance_group_manager.workers.name
}

output "group_self_link" {
  description = "Self link of the worker group."
  value       = google_compute_region_instance_group_manager.workers.self_link
}

output "region" {
  description = "Region of the group (spotring run --region)."
  value       = var.region
}

output "project" {
  description = "Project of the group (spotring run --project)."
  value       = var.project
}

output "driver_name" {
  description = "Instance name of the driver host (gcloud compute ssh NAME --zone ZONE)."
  value       = google_compute_instance.driver.name
}

output "driver_zone" {
  description = "Zone of the driver host."
  value       = google_compute_instance.driver.zone
}

output "driver_external_ip" {
  description = "External IP address of the driver host (empty without driver_external_ip)."
  value       = try(google_compute_instance.driver.network_interface[0].access_config[0].nat_ip, "")
}

output "driver_internal_ip" {
  description = "Internal IP address of the driver host; the workers reach its rendezvous server there."
  value       = google_compute_instance.driver.network_interface[0].network_ip
}

output "network" {
  description = "Self link of the module's VPC network."
  value       = google_compute_network.cluster.self_link
}

output "driver_service_account" {
  description = "Service account of the driver host (the custom roles are bound to it)."
  value       = google_service_account.driver.email
}

output "worker_service_account" {
  description = "Service account of the workers (log writing only, and checkpoints with checkpoint_uri)."
  value       = google_service_account.worker.email
}

output "ssh_user" {
  description = "Login user on the hosts."
  value       = var.ssh_user
}

# -np counts processes: hosts x slots. --min-np is at least one host's worth even with
# min_worker_count = 0, since Horovod needs one process to start.
output "spotring_command" {
  description = "Command to run on the driver host (as ssh_user) to start elastic training on the group (with --checkpoint when checkpoint_uri is set). With job_command, the driver's spotring-job unit runs the same options for you."
  value       = "spotring run --provider gcp --group ${google_compute_region_instance_group_manager.workers.name} --region ${var.region} --project ${var.project} -np ${max(var.worker_count, 1) * local.slots_per_host} --min-np ${max(var.min_worker_count, 1) * local.slots_per_host} --max-np ${var.max_worker_count * local.slots_per_host}${local.checkpoint_option} -- ${var.train_command}"
}

output "driver_journal_command" {
  description = "With job_command: how to follow the job's log (the journal of the driver's spotring-job unit), with gcloud as for ssh (through IAP without driver_external_ip; add --ssh-key-file as in README.md). null without job_command."
  value       = module.driver_job.enabled ? "gcloud compute ssh ${var.ssh_user}@${google_compute_instance.driver.name} --zone ${google_compute_instance.driver.zone} --project ${var.project}${var.driver_external_ip ? "" : " --tunnel-through-iap"} --command 'sudo journalctl -u spotring-job -f'" : null
}
