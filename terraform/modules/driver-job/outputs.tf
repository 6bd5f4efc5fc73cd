output "enabled" {
  description = "Whether there is a unit (job_command is set)."
  value       = local.enabled
}

output "argv" {
  description = "The unit's command, one argument per element (empty without job_command)."
  value       = local.enabled ? local.argv : []
}

output "unit" {
  description = "Text of /etc/systemd/system/spotring-job.service (empty without job_command)."
  value       = local.enabled ? local.unit : ""
}

output "installer" {
  description = "Shell snippet for the end of the driver's bootstrap that installs, enables and starts the unit (empty without job_command)."
  value       = local.enabled ? local.installer : ""
}
