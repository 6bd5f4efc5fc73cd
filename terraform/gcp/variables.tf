# Inputs of the spotring GCP module. Everything with a default can be left out; the
# required ones are project, region, name, worker_count, max_worker_count, admin_cidrs,
# ssh_public_keys and spotring_package.

# --- identity and placement -----------------------------------------------------------

variable "project" {
  description = "GCP project id that holds everything (spotring run --project)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project id: 6-30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "region" {
  description = "Region of the worker group, the network and the driver host, e.g. us-central1 (spotring run --region)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must look like a GCP region name, e.g. us-central1."
  }
}

variable "zones" {
  description = "Zones of the region the group may use; empty lets Compute Engine choose. Spot capacity differs between zones: more zones mean more capacity to draw from."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for z in var.zones : can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", z))]) && length(distinct(var.zones)) == length(var.zones)
    error_message = "zones must hold distinct zone names such as us-central1-a."
  }
}

variable "distribution_target_shape" {
  description = "How the regional group spreads its VMs over the zones. ANY_SINGLE_ZONE keeps every worker in one zone (fast rings, no inter-zone traffic charges); ANY takes spot capacity from whichever zone has it (more capacity, slower and billed cross-zone rings); BALANCED and EVEN spread for availability."
  type        = string
  default     = "ANY_SINGLE_ZONE"

  validation {
    condition     = contains(["ANY_SINGLE_ZONE", "ANY", "BALANCED", "EVEN"], var.distribution_target_shape)
    error_message = "distribution_target_shape must be one of ANY_SINGLE_ZONE, ANY, BALANCED, EVEN."
  }
}

variable "name" {
  description = "Name of the worker group (the regional managed instance group; spotring run --group) and prefix of every other resource name."
  type        = string

  validation {
    # Service account ids ("<name>-worker") are at most 30 characters.
    condition     = can(regex("^[a-z]([-a-z0-9]{0,21}[a-z0-9])?$", var.name))
    error_message = "name must hold 1-23 lowercase letters, digits or hyphens, start with a letter and not end with a hyphen."
  }
}

# --- worker group -----------------------------------------------------------------------

variable "machine_type" {
  description = "Machine type of the workers, e.g. n2-standard-8, or n1-standard-8 with gpu_type nvidia-tesla-t4. For types with built-in GPUs (a2, a3, g2) leave gpu_count at 0 and set slots_per_host."
  type        = string
  default     = "n2-standard-8"
}

variable "gpu_type" {
  description = "Accelerator type attached to each worker when gpu_count > 0, e.g. nvidia-tesla-t4, nvidia-l4, nvidia-tesla-v100."
  type        = string
  default     = "nvidia-tesla-t4"

  validation {
    condition     = can(regex("^nvidia-[a-z0-9-]+$", var.gpu_type))
    error_message = "gpu_type must be an accelerator type such as nvidia-tesla-t4."
  }
}

variable "gpu_count" {
  description = "GPUs attached to each worker (guest_accelerator); 0 for none."
  type        = number
  default     = 0

  validation {
    condition     = contains([0, 1, 2, 4, 8, 16], var.gpu_count)
    error_message = "gpu_count must be 0, 1, 2, 4, 8 or 16."
  }
}

variable "slots_per_host" {
  description = "Horovod slots (worker processes) per worker VM; null means gpu_count, or 1 without GPUs. Written as the instance label spotring-slots, which spotring's GCP provider reads."
  type        = number
  default     = null

  validation {
    condition     = var.slots_per_host == null || try(var.slots_per_host >= 1 && floor(var.slots_per_host) == var.slots_per_host, false)
    error_message = "slots_per_host must be null or a whole number >= 1."
  }
}

variable "worker_count" {
  description = "Initial number of workers (the group's target size). After creation spotring resizes the group; Terraform ignores later drift."
  type        = number

  validation {
    condition     = var.worker_count >= 0 && floor(var.worker_count) == var.worker_count
    error_message = "worker_count must be a whole number >= 0."
  }
}

variable "min_worker_count" {
  description = "Fewest workers the job runs on (--min-np, in hosts). spotring never sizes the group below what it needs."
  type        = number
  default     = 1

  validation {
    condition     = var.min_worker_count >= 0 && floor(var.min_worker_count) == var.min_worker_count
    error_message = "min_worker_count must be a whole number >= 0."
  }
}

variable "max_worker_count" {
  description = "Most workers the job uses (--max-np, in hosts); spotring never sizes the group above it."
  type        = number

  validation {
    condition     = var.max_worker_count >= 1 && floor(var.max_worker_count) == var.max_worker_count
    error_message = "max_worker_count must be a whole number >= 1."
  }
}

variable "enable_secure_boot" {
  description = "Shielded VM secure boot on the workers. Keep it on unless the image's GPU driver modules are unsigned (Ubuntu's packaged NVIDIA drivers are signed); vTPM and integrity monitoring stay on either way."
  type        = bool
  default     = true
}

# --- images and disks ---------------------------------------------------------------------

variable "image" {
  description = "Boot image of the workers: an image or an image family, e.g. ubuntu-os-cloud/ubuntu-2404-lts-amd64. The bootstrap expects apt-get or dnf and python3 >= 3.10; for GPUs use an image with the NVIDIA driver, CUDA and NCCL."
  type        = string
  default     = "ubuntu-os-cloud/ubuntu-2404-lts-amd64"
}

variable "driver_image" {
  description = "Boot image of the driver host; null means the same as the workers."
  type        = string
  default     = null
}

variable "boot_disk_size_gb" {
  description = "Boot disk size of workers and the driver, in GB (the venv with torch and the Horovod build need room)."
  type        = number
  default     = 100

  validation {
    condition     = var.boot_disk_size_gb >= 20
    error_message = "boot_disk_size_gb must be at least 20."
  }
}

variable "boot_disk_type" {
  description = "Boot disk type of workers and the driver."
  type        = string
  default     = "pd-balanced"

  validation {
    condition     = contains(["pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced"], var.boot_disk_type)
    error_message = "boot_disk_type must be pd-standard, pd-balanced, pd-ssd or hyperdisk-balanced."
  }
}

# --- driver -----------------------------------------------------------------------------

variable "driver_machine_type" {
  description = "Machine type of the driver host. It runs the spotring controller and Horovod's elastic driver, not training; it is always on-demand."
  type        = string
  default     = "e2-standard-2"
}

variable "driver_zone" {
  description = "Zone of the driver host; null means the first of zones, or the first zone of the region that is up."
  type        = string
  default     = null

  validation {
    condition     = var.driver_zone == null || can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.driver_zone))
    error_message = "driver_zone must be null or a zone name such as us-central1-a."
  }
}

variable "driver_external_ip" {
  description = "Give the driver host an external IP address. Off by default: reach it through IAP TCP forwarding (gcloud compute ssh --tunnel-through-iap, with 35.235.240.0/20 in admin_cidrs) or a VPN. The workers never get one."
  type        = bool
  default     = false
}

# --- network ----------------------------------------------------------------------------

variable "subnet_cidr" {
  description = "IPv4 range of the module's subnet (workers and driver)."
  type        = string
  default     = "10.42.0.0/20"

  validation {
    condition     = can(cidrhost(var.subnet_cidr, 0)) && !strcontains(var.subnet_cidr, ":")
    error_message = "subnet_cidr must be an IPv4 CIDR block such as 10.42.0.0/20."
  }
}

variable "flow_log_sampling" {
  description = "Share of the subnet's flows recorded in VPC flow logs (0 < x <= 1). Gloo/NCCL rings move a lot of data; lower it to cut logging costs."
  type        = number
  default     = 0.5

  validation {
    condition     = var.flow_log_sampling > 0 && var.flow_log_sampling <= 1
    error_message = "flow_log_sampling must be in (0, 1]."
  }
}

variable "admin_cidrs" {
  description = "IPv4 CIDR blocks allowed to ssh (port 22) to the driver host; nothing else is open from outside. Required, so that nobody gets ssh from everywhere by default: [] for none, [\"35.235.240.0/20\"] for IAP TCP forwarding, or your own addresses. Blocks wider than /8 are refused."
  type        = list(string)

  validation {
    # Not just /0: 0.0.0.0/1 + 128.0.0.0/1 is the whole internet too. IANA's largest
    # allocations are /8s, so a wider block is never one party's own addresses.
    condition     = alltrue([for c in var.admin_cidrs : can(cidrhost(c, 0)) && !strcontains(c, ":") && try(tonumber(split("/", c)[1]) >= 8, false)])
    error_message = "admin_cidrs must hold IPv4 CIDR blocks of /8 or narrower, such as 203.0.113.7/32: 0.0.0.0/0 and wider blocks (0.0.0.0/1 and 128.0.0.0/1 together are ssh from the whole internet) are not allowed."
  }
}

# --- ssh --------------------------------------------------------------------------------

variable "ssh_user" {
  description = "Login user on the hosts, created from the ssh-keys metadata (or by the bootstrap). The keys are authorized for it, and Horovod's ssh launcher logs in as the user that runs spotring on the driver."
  type        = string
  default     = "spotring"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user)) && !contains(["root"], var.ssh_user)
    error_message = "ssh_user must be a plain POSIX user name other than root."
  }
}

variable "ssh_public_keys" {
  description = "OpenSSH public keys authorized for ssh_user on every worker and on the driver (instance metadata; project-wide keys are blocked). Include the key the driver uses to reach the workers (its private half goes to the driver via your ssh agent, `ssh -A`, or a copy); Terraform never holds a private key, and no password is set."
  type        = list(string)

  validation {
    condition     = length(var.ssh_public_keys) > 0 && alltrue([for k in var.ssh_public_keys : can(regex("^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\\.com) [A-Za-z0-9+/=]+( [^\\n']*)?$", k))])
    error_message = "ssh_public_keys must hold at least one OpenSSH public key, one per entry, without newlines or single quotes."
  }
}

# --- software on the hosts (rendered into worker_image/bootstrap.sh.tftpl) ---------------

variable "spotring_package" {
  description = "spotring's wheel for the hosts: its https URL with the file's sha256, which pip checks, e.g. \"spotring[gcp] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256=<64 hex digits>\" (sha256sum of the wheel; build it with pip wheel --no-deps .). Installed without dependencies: they and the gcp extra's (google-cloud-compute and google-cloud-storage) come hash-pinned from worker_image/requirements-worker-gcp.txt."
  type        = string

  validation {
    # A git URL or an index name could not be hash-checked.
    condition     = can(regex("^(spotring(\\[[a-z,]+\\])? ?@ ?)?https://[^\\s'#]+\\.whl#sha256=[0-9a-f]{64}$", var.spotring_package))
    error_message = "spotring_package must be a wheel's https:// URL ending in #sha256=<64 hex digits>, optionally as spotring[gcp] @ URL (http://, git and index names are refused: pip could not check them)."
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
  description = "https pip index to install torch from. The default is PyTorch's CPU index; set \"\" for PyPI's CUDA build on GPU workers (regenerate worker_image/requirements-worker.txt for it)."
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
  description = "HOROVOD_GPU_OPERATIONS for the workers' source build: \"\" for a CPU (Gloo) build, \"NCCL\" for GPU workers (the image must carry CUDA and NCCL)."
  type        = string
  default     = ""

  validation {
    condition     = contains(["", "NCCL"], var.horovod_gpu_operations)
    error_message = "horovod_gpu_operations must be \"\" or \"NCCL\"."
  }
}

variable "job_setup_commands" {
  description = "Shell commands run (bash -euo pipefail, as ssh_user, venv first on PATH) at the end of every host's bootstrap, e.g. to fetch the training code. Workers start in the driver's working directory, so put the code at the same path on all hosts."
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

# --- the job under systemd, durable checkpoints (driver.tf, checkpoints.tf) -------------

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
  description = "Where the job writes durable checkpoints (spotring run --checkpoint): gs://BUCKET/PREFIX, a bucket with uniform bucket-level access (IAM conditions need it). Empty: no durable checkpoints and no storage permissions. When set, the workers' account may list, get, create and delete objects under PREFIX/, the driver's may list and get them and create and delete PREFIX/lock.json (bucket-level bindings with IAM conditions), both get the devstorage.read_write scope, and the unit's command (and spotring_command) pass --checkpoint."
  type        = string
  default     = ""

  validation {
    # No quotes, spaces or wildcards in the prefix: it goes into IAM condition
    # expressions (CEL string literals) as it is.
    condition     = var.checkpoint_uri == "" || can(regex("^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$", var.checkpoint_uri))
    error_message = "checkpoint_uri must be \"\" or gs://BUCKET/PREFIX: a bucket name (3-63 lowercase letters, digits, dots, hyphens, underscores) and a non-empty prefix of letters, digits and . _ - separated by single slashes."
  }
}

variable "checkpoint_bucket_project" {
  description = "Project that holds checkpoint_uri's bucket; null means project. The two custom roles of checkpoints.tf are created there: a project's custom roles can be granted on its own resources only."
  type        = string
  default     = null

  validation {
    condition     = var.checkpoint_bucket_project == null || can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.checkpoint_bucket_project))
    error_message = "checkpoint_bucket_project must be null or a project id: 6-30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "labels" {
  description = "Labels for every resource that takes them (the provider's default_labels), including the worker VMs."
  type        = map(string)
  default     = {}

  validation {
    condition     = length(setintersection(keys(var.labels), ["spotring-slots", "spotring-group"])) == 0
    error_message = "labels must not set spotring-slots or spotring-group; the module sets them (slots through slots_per_host)."
  }
}
