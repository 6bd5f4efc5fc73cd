# The spot worker group: launch template, Auto Scaling Group with a mixed instances
# policy, and the small IAM role a worker needs to finish its launch lifecycle hook.

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "worker" {
  name_prefix        = "${var.name}-worker-"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

# A worker reports the end of its bootstrap (CONTINUE, or ABANDON on failure).
data "aws_iam_policy_document" "worker" {
  statement {
    sid = "FinishLaunchHook"
    actions = [
      "autoscaling:CompleteLifecycleAction",
      "autoscaling:RecordLifecycleActionHeartbeat",
    ]
    resources = [aws_autoscaling_group.workers.arn]
  }
}

resource "aws_iam_role_policy" "worker" {
  name   = "spotring-worker"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.worker.json
}

resource "aws_iam_instance_profile" "worker" {
  name_prefix = "${var.name}-worker-"
  role        = aws_iam_role.worker.name
}

# The chosen image, for its root device name (/dev/sda1 on Ubuntu, /dev/xvda on Amazon Linux).
data "aws_ami" "worker" {
  filter {
    name   = "image-id"
    values = [local.worker_ami_id]
  }
}

locals {
  # The workers' boot script (tests/plan.tftest.hcl reads it here, unzipped).
  worker_bootstrap = templatefile(local.bootstrap_template, {
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
    lifecycle_hook_name    = local.launch_hook_name
    job_setup_commands     = var.job_setup_commands
    requirements_lock      = chomp(file(local.requirements_lock_file))
  })
}

resource "aws_launch_template" "workers" {
  name_prefix            = "${var.name}-worker-"
  description            = "spotring ${var.name} worker"
  image_id               = local.worker_ami_id
  key_name               = var.key_name
  update_default_version = true

  # Workers never get a public address (their subnets' default notwithstanding): they
  # serve Horovod's unauthenticated ports and reach the internet through NAT.
  network_interfaces {
    device_index                = 0
    associate_public_ip_address = false
    security_groups             = [aws_security_group.cluster.id]
    delete_on_termination       = true
  }

  iam_instance_profile {
    name = aws_iam_instance_profile.worker.name
  }

  # IMDSv2 only. The hop limit of 1 keeps containers on the host away from the
  # instance credentials; spotring's interruption watcher runs on the host.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = data.aws_ami.worker.root_device_name

    ebs {
      volume_size           = var.root_volume_size_gb
      volume_type           = "gp3"
      delete_on_termination = true
      encrypted             = true
    }
  }

  # Gzipped: cloud-init unpacks it, and EC2's 16 KiB limit applies to what it gets.
  user_data = base64gzip(local.worker_bootstrap)

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = "${var.name}-worker" }
  }

  lifecycle {
    precondition {
      # 16 KiB is at most 21,844 base64 characters (whole 3-byte groups).
      condition     = length(base64gzip(local.worker_bootstrap)) <= 21844
      error_message = "The workers' user data is over EC2's 16 KiB even gzipped: shorten job_setup_commands (let it fetch a script) or ssh_public_keys."
    }
  }
}

resource "aws_autoscaling_group" "workers" {
  name                = var.name
  vpc_zone_identifier = var.subnet_ids
  min_size            = var.min_size
  max_size            = var.max_size
  desired_capacity    = var.desired_capacity

  # Launch a replacement as soon as EC2 signals elevated interruption risk for a spot
  # instance (rebalance recommendation), before the 2-minute notice.
  capacity_rebalance = true

  # No zone rebalancing: spotring hands a fallback host back with
  # TerminateInstanceInAutoScalingGroup and a decrement, which the API reference warns
  # may unbalance the zones, and "rebalancing might terminate instances in other
  # zones": training hosts. New launches still go to the zone with the fewest members
  # ("Suspend and resume processes" in the Auto Scaling User Guide). terraform/gcp turns
  # the equivalent off (instance_redistribution_type NONE).
  suspended_processes = ["AZRebalance"]

  health_check_type         = "EC2"
  health_check_grace_period = var.health_check_grace_period

  # Do not hold `terraform apply` until spot capacity shows up.
  wait_for_capacity_timeout = "0"

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = var.on_demand_base_capacity
      on_demand_percentage_above_base_capacity = var.on_demand_percentage_above_base_capacity
      spot_allocation_strategy                 = var.spot_allocation_strategy
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.workers.id
        version            = aws_launch_template.workers.latest_version
      }

      dynamic "override" {
        for_each = var.instance_types

        content {
          instance_type = override.value
        }
      }
    }
  }

  initial_lifecycle_hook {
    name                 = local.launch_hook_name
    lifecycle_transition = "autoscaling:EC2_INSTANCE_LAUNCHING"
    default_result       = "ABANDON"
    heartbeat_timeout    = var.bootstrap_timeout_seconds
  }

  tag {
    key                 = "Name"
    value               = "${var.name}-worker"
    propagate_at_launch = true
  }

  # spotring's AWS provider reads the slot count of each host from this tag.
  tag {
    key                 = "spotring:slots"
    value               = tostring(var.slots_per_host)
    propagate_at_launch = true
  }

  dynamic "tag" {
    for_each = merge(var.tags, { "spotring:group" = var.name })

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    # spotring steers the size with SetDesiredCapacity; a later apply must not undo it.
    ignore_changes = [desired_capacity]

    precondition {
      condition     = var.min_size <= var.desired_capacity && var.desired_capacity <= var.max_size
      error_message = "Need min_size <= desired_capacity <= max_size."
    }
  }
}
