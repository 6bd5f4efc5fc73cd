# `terraform test` for the module with a mocked AWS provider: no credentials, no API
# calls. It checks what only Terraform itself can: the configuration type-checks, the
# validations and the size precondition reject bad input, and the outputs render.
# (The driver policy's actions are checked against spotring.providers.aws.IAM_ACTIONS
# in tests/test_terraform.py, which can import it.)
# tests/test_terraform.py runs it when SPOTRING_TERRAFORM_TESTS=1.

mock_provider "aws" {
  mock_data "aws_ami" {
    defaults = {
      id               = "ami-0123456789abcdef0"
      root_device_name = "/dev/sda1"
    }
  }

  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{}"
    }
  }

  mock_resource "aws_autoscaling_group" {
    defaults = {
      arn = "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:0000:autoScalingGroupName/spot-train"
    }
  }
}

variables {
  name             = "spot-train"
  region           = "us-east-1"
  vpc_id           = "vpc-0abc"
  subnet_ids       = ["subnet-0a", "subnet-0b"]
  instance_types   = ["g5.xlarge", "g6.xlarge"]
  min_size         = 1
  max_size         = 4
  desired_capacity = 2
  ssh_public_keys  = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleExampleExample driver@spotring"]
  spotring_package = "spotring[aws] @ https://example.com/spotring-0.1.0-py3-none-any.whl"
}

run "defaults" {
  command = apply

  assert {
    condition     = output.spotring_command == "spotring run --provider aws --group spot-train --region us-east-1 -np 2 --min-np 1 --max-np 4 -- python train.py"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = aws_autoscaling_group.workers.capacity_rebalance
    error_message = "capacity_rebalance is off"
  }

  assert {
    condition     = aws_autoscaling_group.workers.mixed_instances_policy[0].instances_distribution[0].spot_allocation_strategy == "price-capacity-optimized"
    error_message = "the default spot allocation strategy is not price-capacity-optimized"
  }

  assert {
    condition     = [for o in aws_autoscaling_group.workers.mixed_instances_policy[0].launch_template[0].override : o.instance_type] == ["g5.xlarge", "g6.xlarge"]
    error_message = "instance_types are not all overrides of the mixed instances policy"
  }

  assert {
    condition     = one([for t in aws_autoscaling_group.workers.tag : t if t.key == "spotring:slots"]).value == "1" && one([for t in aws_autoscaling_group.workers.tag : t if t.key == "spotring:slots"]).propagate_at_launch
    error_message = "the spotring:slots tag is missing or not propagated"
  }

  assert {
    condition     = aws_launch_template.workers.metadata_options[0].http_tokens == "required" && aws_instance.driver.metadata_options[0].http_tokens == "required"
    error_message = "IMDSv2 is not required"
  }

  assert {
    condition     = data.aws_iam_policy_document.driver.statement[1].resources == toset([aws_autoscaling_group.workers.arn])
    error_message = "steering actions are not scoped to the group"
  }

  assert {
    condition     = strcontains(local.worker_bootstrap, "LIFECYCLE_HOOK_NAME='spot-train-bootstrap'") && strcontains(local.driver_bootstrap, "LIFECYCLE_HOOK_NAME=''")
    error_message = "the worker bootstrap does not name the launch hook (or the driver's does)"
  }

  assert {
    condition     = aws_launch_template.workers.user_data == base64gzip(local.worker_bootstrap)
    error_message = "the workers' user data is not their gzipped bootstrap"
  }

  assert {
    condition     = strcontains(local.worker_bootstrap, "\nhorovod==0.28.1 --hash=sha256:") && !strcontains(local.worker_bootstrap, "$${requirements_lock}")
    error_message = "the bootstrap does not carry worker_image/requirements-worker.txt"
  }

  assert {
    condition     = [for h in aws_autoscaling_group.workers.initial_lifecycle_hook : h.name] == ["spot-train-bootstrap"]
    error_message = "the launch lifecycle hook is missing"
  }
}

run "slots_and_zero_minimum" {
  command = plan

  variables {
    slots_per_host     = 4
    min_size           = 0
    train_command      = "python /opt/job/train.py --epochs 90"
    job_setup_commands = "git clone https://example.com/job.git \"$${HOME}/job\""
  }

  assert {
    condition     = strcontains(local.driver_bootstrap, "git clone https://example.com/job.git \"$${HOME}/job\"\nSPOTRING_JOB_SETUP")
    error_message = "job_setup_commands do not reach the bootstrap verbatim"
  }

  assert {
    condition     = output.spotring_command == "spotring run --provider aws --group spot-train --region us-east-1 -np 8 --min-np 4 --max-np 16 -- python /opt/job/train.py --epochs 90"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = one([for t in aws_autoscaling_group.workers.tag : t if t.key == "spotring:slots"]).value == "4"
    error_message = "the spotring:slots tag does not follow slots_per_host"
  }
}

run "sizes_out_of_order" {
  command = plan

  variables {
    desired_capacity = 5
  }

  expect_failures = [aws_autoscaling_group.workers]
}

# Over EC2's 16 KiB even gzipped: 25 KiB of hex digits (they compress to about half).
run "user_data_over_16_kib" {
  command = plan

  variables {
    job_setup_commands = join("\n", [for i in range(400) : "echo ${sha256(tostring(i))}"])
  }

  expect_failures = [aws_launch_template.workers, aws_instance.driver]
}

# A job setup of some KiB fits.
run "user_data_with_a_long_job_setup" {
  command = plan

  variables {
    job_setup_commands = join("\n", [for i in range(80) : "echo ${sha256(tostring(i))}"])
  }
}

run "bad_spot_strategy" {
  command = plan

  variables {
    spot_allocation_strategy = "cheapest"
  }

  expect_failures = [var.spot_allocation_strategy]
}

run "bad_ssh_key" {
  command = plan

  variables {
    ssh_public_keys = ["-----BEGIN OPENSSH PRIVATE KEY-----"]
  }

  expect_failures = [var.ssh_public_keys]
}

run "reserved_tags" {
  command = plan

  variables {
    tags = { "spotring:slots" = "8" }
  }

  expect_failures = [var.tags]
}
