# Shared pieces: the image lookup, the bootstrap template and the cluster network rules.

locals {
  # worker_image/ sits next to terraform/ in the spotring repository.
  bootstrap_template = "${path.module}/../../worker_image/bootstrap.sh.tftpl"

  # The hash-pinned packages the bootstrap installs, with the aws extra's tree
  # (scripts/lock-worker-requirements.sh), passed to it as requirements_lock: the
  # repository keeps one copy.
  requirements_lock_file = "${path.module}/../../worker_image/requirements-worker-aws.txt"

  # The launch lifecycle hook holds a new worker in Pending:Wait until its bootstrap
  # reports CONTINUE; spotring maps Pending:Wait to PENDING, so Horovod never gets a
  # host whose torch/horovod install has not finished.
  launch_hook_name = "${var.name}-bootstrap"

  worker_ami_id    = coalesce(var.ami_id, one(data.aws_ami.ubuntu[*].id))
  driver_ami_id    = coalesce(var.driver_ami_id, var.ami_id, one(data.aws_ami.ubuntu[*].id))
  driver_subnet_id = coalesce(var.driver_subnet_id, var.subnet_ids[0])
}

data "aws_ami" "ubuntu" {
  count = var.ami_id == null || var.driver_ami_id == null ? 1 : 0

  most_recent = true
  owners      = ["099720109477"] # Canonical

  filter {
    name   = "name"
    values = ["ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
}

# One security group for the workers and the driver: all traffic between members.
# Horovod's ssh launcher (22), Gloo and NCCL rings (ephemeral ports between workers)
# and the elastic driver's rendezvous server (an ephemeral port on the driver) all need it.
resource "aws_security_group" "cluster" {
  name_prefix = "${var.name}-cluster-"
  description = "spotring ${var.name}: workers and driver, all traffic between members"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-cluster" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "cluster_internal" {
  security_group_id            = aws_security_group.cluster.id
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "-1"
  description                  = "ssh, Gloo/NCCL and rendezvous traffic between cluster members"
}

resource "aws_vpc_security_group_egress_rule" "cluster_all" {
  security_group_id = aws_security_group.cluster.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
  description       = "package installs, AWS APIs, traffic between members"
}

# ssh from outside to the driver only; workers take ssh from the cluster group alone.
resource "aws_security_group" "driver_admin" {
  name_prefix = "${var.name}-driver-admin-"
  description = "spotring ${var.name}: ssh to the driver host from ssh_ingress_cidrs"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-driver-admin" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "driver_ssh" {
  for_each = toset(var.ssh_ingress_cidrs)

  security_group_id = aws_security_group.driver_admin.id
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  description       = "ssh to the driver"
}
