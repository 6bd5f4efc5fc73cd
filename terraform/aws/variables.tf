# Inputs of the spotring AWS module. Everything with a default can be left out; the
# required ones are name, region, vpc_id, subnet_ids, instance_types, the group sizes,
# ssh_public_keys and spotring_package.

# --- identity and placement -----------------------------------------------------------

variable "name" {
  description = "Name of the worker Auto Scaling Group; also the prefix of every other resource name. This is what `spotring run --group` takes."
  type        = string

  validation {
    # ASG names allow more, but the name also prefixes IAM roles (64 chars) and security groups.
    condition     = can(regex("^[A-Za-z][A-Za-z0-9-]{0,39}$", var.name))
    error_message = "name must start with a letter and hold 1-40 letters, digits or hyphens."
  }
}

variable "region" {
  description = "AWS region of the group and the driver host, e.g. us-east-1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must look like an AWS region name, e.g. us-east-1."
  }
}

variable "vpc_id" {
  description = "VPC that holds subnet_ids; the cluster security group is created in it."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123abcd."
  }
}

variable "subnet_ids" {
  description = "Subnets the worker group may launch into. Give one per availability zone: spot capacity differs between zones, and more zones mean fewer interruptions."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must hold at least one id of the form subnet-0123abcd."
  }
}

variable "driver_subnet_id" {
  description = "Subnet of the driver host; null means the first of subnet_ids. With driver_associate_public_ip = true it must be a public subnet."
  type        = string
  default     = null

  validation {
    condition     = var.driver_subnet_id == null || can(regex("^subnet-[0-9a-f]+$", var.driver_subnet_id))
    error_message = "driver_subnet_id must be null or look like subnet-0123abcd."
  }
}

# --- worker group -----------------------------------------------------------------------

variable "instance_types" {
  description = "Instance types the group may use (mixed instances policy). Several similar types (same slots, same architecture as the AMI) widen the spot pools to draw from."
  type        = list(string)

  validation {
    condition     = length(var.instance_types) > 0 && length(var.instance_types) <= 40 && length(distinct(var.instance_types)) == length(var.instance_types)
    error_message = "instance_types must hold 1-40 distinct instance types."
  }
}

variable "min_size" {
  description = "Minimum number of worker instances. spotring never steers the group below it."
  type        = number

  validation {
    condition     = var.min_size >= 0 && floor(var.min_size) == var.min_size
    error_message = "min_size must be a whole number >= 0."
  }
}

variable "max_size" {
  description = "Maximum number of worker instances."
  type        = number

  validation {
    condition     = var.max_size >= 1 && floor(var.max_size) == var.max_size
    error_message = "max_size must be a whole number >= 1."
  }
}

variable "desired_capacity" {
  description = "Initial number of worker instances. After creation spotring steers it (SetDesiredCapacity); Terraform ignores later drift."
  type        = number

  validation {
    condition     = var.desired_capacity >= 0 && floor(var.desired_capacity) == var.desired_capacity
    error_message = "desired_capacity must be a whole number >= 0."
  }
}

variable "spot_allocation_strategy" {
  description = "How the group picks spot pools. price-capacity-optimized picks the cheapest among the pools least likely to be interrupted."
  type        = string
  default     = "price-capacity-optimized"

  validation {
    condition     = contains(["price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized", "lowest-price"], var.spot_allocation_strategy)
    error_message = "spot_allocation_strategy must be one of price-capacity-optimized, capacity-optimized, capacity-optimized-prioritized, lowest-price."
  }
}

variable "on_demand_base_capacity" {
  description = "How many of the first instances are on-demand. A base of 1 or more keeps at least one host through a spot reclaim wave (Horovod fails when no host of the previous set survives a reset)."
  type        = number
  default     = 0

  validation {
    condition     = var.on_demand_base_capacity >= 0 && floor(var.on_demand_base_capacity) == var.on_demand_base_capacity
    error_message = "on_demand_base_capacity must be a whole number >= 0."
  }
}

variable "on_demand_percentage_above_base_capacity" {
  description = "Percentage of instances above the on-demand base that are on-demand; 0 means all spot."
  type        = number
  default     = 0

  validation {
    condition     = var.on_demand_percentage_above_base_capacity >= 0 && var.on_demand_percentage_above_base_capacity <= 100
    error_message = "on_demand_percentage_above_base_capacity must be between 0 and 100."
  }
}

variable "slots_per_host" {
  description = "Horovod slots (worker processes) per instance, usually the GPU count of the instance types. Written as the instance tag spotring:slots, which spotring's AWS provider reads."
  type        = number
  default     = 1

  validation {
    condition     = var.slots_per_host >= 1 && floor(var.slots_per_host) == var.slots_per_host
    error_message = "slots_per_host must be a whole number >= 1."
  }
}

variable "health_check_grace_period" {
  description = "Seconds after an instance enters InService before the group acts on failed EC2 health checks."
  type        = number
  default     = 300

  validation {
    condition     = var.health_check_grace_period >= 0
    error_message = "health_check_grace_period must be >= 0."
  }
}

variable "bootstrap_timeout_seconds" {
  description = "How long a new worker may spend in its bootstrap (torch install, Horovod build) in Pending:Wait before the launch lifecycle hook gives up and the group replaces it."
  type        = number
  default     = 3600

  validation {
    condition     = var.bootstrap_timeout_seconds >= 30 && var.bootstrap_timeout_seconds <= 7200
    error_message = "bootstrap_timeout_seconds must be between 30 and 7200 (the lifecycle hook's limits)."
  }
}

variable "root_volume_size_gb" {
  description = "Root EBS volume size of workers and the driver, in GiB (the venv with torch and the Horovod build need room)."
  type        = number
  default     = 100

  validation {
    condition     = var.root_volume_size_gb >= 20
    error_message = "root_volume_size_gb must be at least 20."
  }
}

# --- images -----------------------------------------------------------------------------

variable "ami_id" {
  description = "AMI of the workers. null means the latest Canonical Ubuntu 24.04 x86_64 image; pass your own for arm64 (Graviton) types or a CUDA image for GPU types. The bootstrap expects apt-get or dnf and python3 >= 3.10."
  type        = string
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]+$", var.ami_id))
    error_message = "ami_id must be null or look like ami-0123abcd."
  }
}

variable "driver_ami_id" {
  description = "AMI of the driver host; null means the same as the workers."
  type        = string
  default     = null

  validation {
    condition     = var.driver_ami_id == null || can(regex("^ami-[0-9a-f]+$", var.driver_ami_id))
    error_message = "driver_ami_id must be null or look like ami-0123abcd."
  }
}

variable "driver_instance_type" {
  description = "Instance type of the driver host (EBS-optimized, as every current-generation type is). It runs the spotring controller and Horovod's elastic driver, not training; it is always on-demand."
  type        = string
  default     = "m6i.large"
}

variable "driver_associate_public_ip" {
  description = "Give the driver host a public IP address (needs a public driver subnet). Off by default: reach the driver through SSM Session Manager, a bastion or a VPN. The workers never get one."
  type        = bool
  default     = false
}

# --- ssh --------------------------------------------------------------------------------

variable "key_name" {
  description = "Existing EC2 key pair installed on the driver and the workers for the default user; null for none (ssh_public_keys is installed either way)."
  type        = string
  default     = null
}

variable "ssh_user" {
  description = "Login user on the hosts (ubuntu on Ubuntu images, ec2-user on Amazon Linux). The keys are authorized for it, and Horovod's ssh launcher logs in as the user that runs spotring on the driver."
  type        = string
  default     = "ubuntu"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be a plain POSIX user name."
  }
}

variable "ssh_public_keys" {
  description = "OpenSSH public keys authorized for ssh_user on every worker and on the driver. Include the key the driver uses to reach the workers (its private half goes to the driver via your ssh agent, `ssh -A`, or a copy); Terraform never holds a private key."
  type        = list(string)

  validation {
    condition     = length(var.ssh_public_keys) > 0 && alltrue([for k in var.ssh_public_keys : can(regex("^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\\.com) [A-Za-z0-9+/=]+( [^\\n']*)?$", k))])
    error_message = "ssh_public_keys must hold at least one OpenSSH public key, one per entry, without newlines or single quotes."
  }
}

variable "ssh_ingress_cidrs" {
  description = "IPv4 CIDR blocks allowed to ssh to the driver host, each /8 or narrower. Empty means no ssh from outside the cluster (use SSM or a bastion)."
  type        = list(string)
  default     = []

  validation {
    # Not just /0: 0.0.0.0/1 + 128.0.0.0/1 is the whole internet too. IANA's largest
    # allocations are /8s, so a wider block is never one party's own addresses.
    condition     = alltrue([for c in var.ssh_ingress_cidrs : can(cidrhost(c, 0)) && !strcontains(c, ":") && try(tonumber(split("/", c)[1]) >= 8, false)])
    error_message = "ssh_ingress_cidrs must hold IPv4 CIDR blocks of /8 or narrower, such as 203.0.113.7/32: ::/0, 0.0.0.0/0 and wider blocks (0.0.0.0/1 and 128.0.0.0/1 together are ssh from the whole internet) are not allowed."
  }
}

# --- software on the hosts (rendered into worker_image/bootstrap.sh.tftpl) ---------------

variable "spotring_package" {
  description = "spotring's wheel for the hosts: its https URL with the file's sha256, which pip checks, e.g. \"spotring[aws] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256=<64 hex digits>\" (sha256sum of the wheel; build it with pip wheel --no-deps .). Installed without dependencies: they and the aws extra's (boto3) come hash-pinned from worker_image/requirements-worker-aws.txt."
  type        = string

  validation {
    # A git URL or an index name could not be hash-checked.
    condition     = can(regex("^(spotring(\\[[a-z,]+\\])? ?@ ?)?https://[^\\s'#]+\\.whl#sha256=[0-9a-f]{64}$", var.spotring_package))
    error_message = "spotring_package must be a wheel's https:// URL ending in #sha256=<64 hex digits>, optionally as spotring[aws] @ URL (http://, git and index names are refused: pip could not check them)."
  }
}

variable "torch_version" {
  description = "torch version installed on the hosts."
  type        = string
  default     = "2.13.0"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.torch_version))
    error_message = "torch_version must be a plain version such as 2.13.0."
  }
}

variable "torch_index_url" {
  description = "pip index to install torch from. The default is PyTorch's CPU index; set \"\" for PyPI's CUDA build on GPU instance types."
  type        = string
  default     = "https://download.pytorch.org/whl/cpu"

  validation {
    condition     = var.torch_index_url == "" || can(regex("^https://[^'\\s]+$", var.torch_index_url))
    error_message = "torch_index_url must be \"\" or an https:// URL (http:// is refused: anyone on the path could swap torch)."
  }
}

variable "horovod_version" {
  description = "Horovod version built from source when horovod_wheel_url is empty. 0.28.1 is the last release; the bootstrap applies the C++17 fix it needs for torch >= 2.1."
  type        = string
  default     = "0.28.1"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.horovod_version))
    error_message = "horovod_version must be a plain version such as 0.28.1."
  }
}

variable "horovod_wheel_url" {
  description = "https URL of a prebuilt Horovod wheel (built against the same torch, Python and architecture) ending in #sha256=<its sha256>, which pip checks. Empty means build Horovod's hash-pinned sdist from source on each host, which takes several minutes."
  type        = string
  default     = ""

  validation {
    condition     = var.horovod_wheel_url == "" || can(regex("^https://[^'\\s#]+\\.whl#sha256=[0-9a-f]{64}$", var.horovod_wheel_url))
    error_message = "horovod_wheel_url must be \"\" or an https:// URL of a .whl file ending in #sha256=<64 hex digits> (http:// is refused)."
  }
}

variable "horovod_gpu_operations" {
  description = "HOROVOD_GPU_OPERATIONS for a source build: \"\" for a CPU (Gloo) build, \"NCCL\" for GPU instance types (the AMI must carry CUDA and NCCL)."
  type        = string
  default     = ""

  validation {
    condition     = contains(["", "NCCL"], var.horovod_gpu_operations)
    error_message = "horovod_gpu_operations must be \"\" or \"NCCL\"."
  }
}

variable "job_setup_commands" {
  description = "Shell commands run (bash -euo pipefail, as ssh_user, venv first on PATH) at the end of every host's bootstrap, e.g. to fetch the training code. Workers start in the driver's working directory, so put the code at the same path on all hosts. They must hold no secrets: they are stored in the user data (readable through the instance metadata service), in Terraform state and in the bootstrap log."
  type        = string
  default     = ""

  validation {
    condition     = !strcontains(var.job_setup_commands, "SPOTRING_JOB_SETUP")
    error_message = "job_setup_commands must not contain the heredoc delimiter SPOTRING_JOB_SETUP."
  }
}

variable "train_command" {
  description = "Training command placed after `--` in the spotring_command output. It must exist at the same path on every worker."
  type        = string
  default     = "python train.py"
}

# --- the job under systemd, durable checkpoints (job.tf, checkpoints.tf) ----------------

variable "job_command" {
  description = "The training command after `--`, one argument per element, e.g. [\"python\", \"/opt/train/train.py\"]. When set, the driver runs `spotring run` for it under the systemd unit spotring-job (restarted on failure, started at every boot), so a driver crash or reboot resumes the job. Empty: no unit; run spotring_command by hand. It must exist at the same path on every worker."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for word in var.job_command : length(word) > 0 && !can(regex("[[:cntrl:]]", word))])
    error_message = "job_command must hold non-empty arguments without newlines or other control characters."
  }
}

variable "job_args" {
  description = "Extra `spotring run` options for the unit's command, placed before --checkpoint and `--`, e.g. [\"--checkpoint-every\", \"300\", \"--checkpoint-keep\", \"3\"]. They are visible in the unit file and the process list: no secrets."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for word in var.job_args : length(word) > 0 && word != "--" && !can(regex("[[:cntrl:]]", word))])
    error_message = "job_args must hold non-empty options without newlines or other control characters, and no `--` (job_command comes after it)."
  }
}

variable "job_working_directory" {
  description = "Working directory of the unit's `spotring run` on the driver; workers start their processes in the same directory. Empty means ssh_user's home directory."
  type        = string
  default     = ""

  validation {
    condition     = var.job_working_directory == "" || can(regex("^/[A-Za-z0-9._/@+-]*$", var.job_working_directory))
    error_message = "job_working_directory must be \"\" or an absolute path of letters, digits and . _ / @ + -."
  }
}

variable "job_ssh_identity_file" {
  description = "Private key (absolute path on the driver) the unit's `spotring run` reaches the workers with (--ssh-identity-file). Empty means ssh's default keys of ssh_user (~/.ssh/id_ed25519, id_ecdsa, id_rsa). The unit runs without an ssh agent: copy the private half of a key in ssh_public_keys there; the unit waits (retrying every 10 s) until one is readable, so that no worker is failed for want of a key."
  type        = string
  default     = ""

  validation {
    condition     = var.job_ssh_identity_file == "" || can(regex("^/[A-Za-z0-9._/@+-]+$", var.job_ssh_identity_file))
    error_message = "job_ssh_identity_file must be \"\" or an absolute path of letters, digits and . _ / @ + -."
  }
}

variable "checkpoint_uri" {
  description = "Where the job writes durable checkpoints (spotring run --checkpoint): s3://BUCKET/PREFIX. Empty: no durable checkpoints and no storage permissions. When set, the workers' role may list, get, put and delete objects under PREFIX/ (and abort their multipart uploads), the driver's may list and get them and put and delete PREFIX/lock.json, and the unit's command (and spotring_command) pass --checkpoint."
  type        = string
  default     = ""

  validation {
    # No wildcards (* ?), policy variables ($), spaces or quotes in the prefix: it goes
    # into IAM resource ARNs and conditions as it is.
    condition     = var.checkpoint_uri == "" || can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$", var.checkpoint_uri))
    error_message = "checkpoint_uri must be \"\" or s3://BUCKET/PREFIX: a bucket name (3-63 lowercase letters, digits, dots, hyphens) and a non-empty prefix of letters, digits and . _ - separated by single slashes."
  }
}

variable "tags" {
  description = "Tags for every resource, propagated to the worker instances."
  type        = map(string)
  default     = {}

  validation {
    condition     = length(setintersection(keys(var.tags), ["Name", "spotring:slots", "spotring:group"])) == 0
    error_message = "tags must not set Name, spotring:slots or spotring:group; the module sets them (slots through slots_per_host)."
  }
}
