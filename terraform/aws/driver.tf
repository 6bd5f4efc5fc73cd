# The driver host: runs `spotring run` (controller + Horovod's elastic driver) on demand.
# Its instance profile grants exactly the calls spotring's AWS provider makes
# (spotring.providers.aws.IAM_ACTIONS, split like its IAM_STEERING_ACTIONS;
# tests/terraform/test_terraform.py keeps them equal).

resource "aws_iam_role" "driver" {
  name_prefix        = "${var.name}-driver-"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "driver" {
  # Describe* calls support no resource-level permissions: "*" is the only choice.
  # DescribeScalingActivities tells a launch that failed for capacity, quota or price;
  # DescribeLaunchTemplateVersions whether the group launches spot (capacity fallback).
  # DescribeSpotPriceHistory and pricing:GetProducts (the Price List query API, which
  # has no resources) read what a member costs an hour, for the job's cost.
  statement {
    sid = "ReadGroupAndInstances"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeAutoScalingInstances",
      "autoscaling:DescribeScalingActivities",
      "ec2:DescribeInstances",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeLaunchTemplateVersions",
      "ec2:DescribeSpotPriceHistory",
      "pricing:GetProducts",
    ]
    resources = ["*"]
  }

  # Steering calls, limited to this one group. TerminateInstanceInAutoScalingGroup
  # hands a fallback host back (and lowers the desired capacity) once spot returns.
  statement {
    sid = "SteerThisGroup"
    actions = [
      "autoscaling:SetDesiredCapacity",
      "autoscaling:SetInstanceHealth",
      "autoscaling:DetachInstances",
      "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    resources = [aws_autoscaling_group.workers.arn]
  }
}

resource "aws_iam_role_policy" "driver" {
  name   = "spotring-driver"
  role   = aws_iam_role.driver.id
  policy = data.aws_iam_policy_document.driver.json
}

resource "aws_iam_instance_profile" "driver" {
  name_prefix = "${var.name}-driver-"
  role        = aws_iam_role.driver.name
}

# The job under systemd (job_command): ../modules/driver-job renders the unit
# spotring-job.service and the snippet, appended to the driver's bootstrap below, that
# installs and starts it when the bootstrap has finished. Nothing without job_command.
module "driver_job" {
  source = "../modules/driver-job"

  group_name = var.name
  # The options of spotring_command (outputs.tf), one argument per element.
  provider_args = [
    "--provider", "aws", "--group", var.name, "--region", var.region,
    "-np", tostring(max(var.desired_capacity, 1) * var.slots_per_host),
    "--min-np", tostring(max(var.min_size, 1) * var.slots_per_host),
    "--max-np", tostring(var.max_size * var.slots_per_host),
  ]
  ssh_user          = var.ssh_user
  job_command       = var.job_command
  job_args          = var.job_args
  working_directory = var.job_working_directory
  ssh_identity_file = var.job_ssh_identity_file
  checkpoint_uri    = var.checkpoint_uri
}

locals {
  # The same bootstrap as the workers (the driver needs horovod.runner and spotring),
  # without the lifecycle hook: the driver is no member of the group. With job_command,
  # the unit's installer follows it (cloud-init runs user data once: a job_command set
  # later reaches a new driver only, `terraform apply -replace=aws_instance.driver`).
  driver_bootstrap = join("\n", compact([templatefile(local.bootstrap_template, {
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

resource "aws_instance" "driver" {
  ami                    = local.driver_ami_id
  instance_type          = var.driver_instance_type
  subnet_id              = local.driver_subnet_id
  vpc_security_group_ids = [aws_security_group.cluster.id, aws_security_group.driver_admin.id]
  iam_instance_profile   = aws_iam_instance_profile.driver.name
  key_name               = var.key_name
  # Current-generation types are EBS-optimized anyway; this makes it explicit.
  ebs_optimized = true

  # No public address unless driver_associate_public_ip (off by default).
  associate_public_ip_address = var.driver_associate_public_ip

  # Basic (5-minute) monitoring: nothing reads 1-minute instance metrics.
  #checkov:skip=CKV_AWS_126:detailed (1-minute) CloudWatch monitoring costs extra and nothing reads it; spotring watches the group through the Auto Scaling API

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_size = var.root_volume_size_gb
    volume_type = "gp3"
    encrypted   = true
  }

  # Gzipped like the workers' (user_data would mangle the binary; this takes base64).
  user_data_base64 = base64gzip(local.driver_bootstrap)

  tags = { Name = "${var.name}-driver" }

  lifecycle {
    # A newer Ubuntu image (ami_id = null) must not replace a running driver.
    ignore_changes = [ami]

    precondition {
      # 16 KiB is at most 21,844 base64 characters (whole 3-byte groups).
      condition     = length(base64gzip(local.driver_bootstrap)) <= 21844
      error_message = "The driver's user data is over EC2's 16 KiB even gzipped: shorten job_setup_commands (let it fetch a script) or ssh_public_keys."
    }

    precondition {
      condition     = length(var.job_command) == 0 || var.ssh_user != "root"
      error_message = "The job's unit (job_command) runs as ssh_user, which must not be root."
    }
  }
}
