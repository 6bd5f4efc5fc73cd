output "group_name" {
  description = "Name of the worker Auto Scaling Group (spotring run --group)."
  value       = aws_autoscaling_group.workers.name
}

output "group_arn" {
  description = "ARN of the worker Auto Scaling Group."
  value       = aws_autoscaling_group.workers.arn
}

output "region" {
  description = "Region of the group (spotring run --region)."
  value       = var.region
}

output "driver_instance_id" {
  description = "Instance id of the driver host."
  value       = aws_instance.driver.id
}

output "driver_public_ip" {
  description = "Public IP address of the driver host (empty without driver_associate_public_ip)."
  value       = aws_instance.driver.public_ip
}

output "driver_address" {
  description = "Address to ssh to the driver at: its public IP with driver_associate_public_ip, else its private IP (reach it through a bastion, VPN or SSM)."
  value       = coalesce(aws_instance.driver.public_ip, aws_instance.driver.private_ip)
}

output "driver_private_ip" {
  description = "Private IP address of the driver host; the workers reach its rendezvous server there."
  value       = aws_instance.driver.private_ip
}

output "security_group_id" {
  description = "Security group shared by the workers and the driver."
  value       = aws_security_group.cluster.id
}

output "ssh_user" {
  description = "Login user on the hosts."
  value       = var.ssh_user
}

# -np counts processes: hosts x slots. --min-np is at least one host's worth even with
# min_size = 0, since Horovod needs one process to start.
output "spotring_command" {
  description = "Command to run on the driver host (as ssh_user) to start elastic training on the group (with --checkpoint when checkpoint_uri is set). With job_command, the driver's spotring-job unit runs the same options for you."
  value       = "spotring run --provider aws --group ${aws_autoscaling_group.workers.name} --region ${var.region} -np ${max(var.desired_capacity, 1) * var.slots_per_host} --min-np ${max(var.min_size, 1) * var.slots_per_host} --max-np ${var.max_size * var.slots_per_host}${local.checkpoint_option} -- ${var.train_command}"
}

output "driver_journal_command" {
  description = "With job_command: how to follow the job's log (the journal of the driver's spotring-job unit) over ssh, at driver_address. null without job_command."
  value       = module.driver_job.enabled ? "ssh -t ${var.ssh_user}@${coalesce(aws_instance.driver.public_ip, aws_instance.driver.private_ip)} sudo journalctl -u spotring-job -f" : null
}
