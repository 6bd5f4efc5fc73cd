# `terraform test` for the module with a mocked AWS provider: no credentials, no API
# calls. It checks what only Terraform itself can: the configuration type-checks, the
# validations and the size precondition reject bad input, and the outputs render.
# (The driver policy's actions are checked against spotring.providers.aws.IAM_ACTIONS
# in tests/terraform/test_terraform.py, which can import it.)
# tests/terraform/test_terraform.py runs it when SPOTRING_TERRAFORM_TESTS=1.

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

  mock_data "aws_partition" {
    defaults = {
      partition = "aws"
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
  spotring_package = "spotring[aws] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
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
    error_message = "the bootstrap does not carry worker_image/requirements-worker-aws.txt"
  }

  assert {
    condition     = [for h in aws_autoscaling_group.workers.initial_lifecycle_hook : h.name] == ["spot-train-bootstrap"]
    error_message = "the launch lifecycle hook is missing"
  }

  # No checkpoint_uri, no job_command: no storage permission, no unit.
  assert {
    condition     = length(aws_iam_role_policy.worker_checkpoints) == 0 && length(aws_iam_role_policy.driver_checkpoints) == 0
    error_message = "storage permissions without checkpoint_uri"
  }

  assert {
    condition     = !strcontains(local.driver_bootstrap, "spotring-job") && output.driver_journal_command == null
    error_message = "a job unit without job_command"
  }
}

run "durable_job" {
  command = apply

  variables {
    checkpoint_uri        = "s3://ckpt-bucket/runs/spot-train/"
    job_command           = ["python", "/opt/train/train.py", "--name", "it's \"a b\" 100%"]
    job_args              = ["--checkpoint-every", "300", "--checkpoint-keep", "3"]
    job_working_directory = "/opt/train"
  }

  assert {
    condition     = output.spotring_command == "spotring run --provider aws --group spot-train --region us-east-1 -np 2 --min-np 1 --max-np 4 --checkpoint s3://ckpt-bucket/runs/spot-train/ -- python train.py"
    error_message = "unexpected spotring_command: ${output.spotring_command}"
  }

  assert {
    condition     = strcontains(local.driver_bootstrap, "\nExecStart=/opt/spotring/venv/bin/spotring \"run\" \"--provider\" \"aws\" \"--group\" \"spot-train\" \"--region\" \"us-east-1\" \"-np\" \"2\" \"--min-np\" \"1\" \"--max-np\" \"4\" \"--checkpoint-every\" \"300\" \"--checkpoint-keep\" \"3\" \"--checkpoint\" \"s3://ckpt-bucket/runs/spot-train/\" \"--\" \"python\" \"/opt/train/train.py\" \"--name\" \"it's \\\"a b\\\" 100%%\"\n")
    error_message = "the unit's ExecStart is not the quoted command"
  }

  assert {
    condition     = strcontains(local.driver_bootstrap, "\nRestart=on-failure\n") && strcontains(local.driver_bootstrap, "\nUser=ubuntu\n") && strcontains(local.driver_bootstrap, "\nWorkingDirectory=/opt/train\n")
    error_message = "the unit does not restart on failure, as ssh_user, in job_working_directory"
  }

  assert {
    condition     = aws_instance.driver.user_data_base64 == base64gzip(local.driver_bootstrap) && endswith(local.driver_bootstrap, "install_spotring_job\n")
    error_message = "the driver's user data does not end with the unit's installer"
  }

  assert {
    condition     = startswith(output.driver_journal_command, "ssh -t ubuntu@") && endswith(output.driver_journal_command, " sudo journalctl -u spotring-job -f")
    error_message = "unexpected driver_journal_command: ${output.driver_journal_command}"
  }

  assert {
    condition     = length(aws_iam_role_policy.worker_checkpoints) == 1 && aws_iam_role_policy.worker_checkpoints[0].role == aws_iam_role.worker.id
    error_message = "the workers' role has no checkpoint policy"
  }

  assert {
    condition     = length(aws_iam_role_policy.driver_checkpoints) == 1 && aws_iam_role_policy.driver_checkpoints[0].role == aws_iam_role.driver.id
    error_message = "the driver's role has no checkpoint policy"
  }

  assert {
    condition     = data.aws_iam_policy_document.worker_checkpoints[0].statement[0].resources == toset(["arn:aws:s3:::ckpt-bucket"])
    error_message = "the workers' listing is not on the bucket"
  }

  assert {
    condition     = [for c in data.aws_iam_policy_document.worker_checkpoints[0].statement[0].condition : [c.test, c.variable, toset(c.values)]] == [["StringLike", "s3:prefix", toset(["runs/spot-train/", "runs/spot-train/*"])]]
    error_message = "the workers' listing is not limited to the prefix"
  }

  assert {
    condition     = data.aws_iam_policy_document.worker_checkpoints[0].statement[1].resources == toset(["arn:aws:s3:::ckpt-bucket/runs/spot-train/*"])
    error_message = "the workers' object access is not limited to the prefix"
  }

  assert {
    condition     = data.aws_iam_policy_document.driver_checkpoints[0].statement[2].resources == toset(["arn:aws:s3:::ckpt-bucket/runs/spot-train/lock.json"])
    error_message = "the driver may write more than the lock"
  }
}

run "gcs_uri_on_aws" {
  command = plan

  variables {
    checkpoint_uri = "gs://ckpt-bucket/runs"
  }

  expect_failures = [var.checkpoint_uri]
}

run "job_as_root" {
  command = plan

  variables {
    ssh_user    = "root"
    job_command = ["python", "train.py"]
  }

  expect_failures = [aws_instance.driver]
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
