# Inputs of the spotring Azure module. Everything with a default can be left out; the
# required ones are subscription_id, location, name, worker_count, max_worker_count,
# admin_cidrs, ssh_public_keys and spotring_package.

# --- identity and placement -----------------------------------------------------------

variable "subscription_id" {
  description = "Azure subscription id that holds everything (spotring run --subscription); also the azurerm provider's subscription."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.subscription_id))
    error_message = "subscription_id must be a subscription GUID such as 00000000-0000-0000-0000-000000000000."
  }
}

variable "location" {
  description = "Azure region of the scale set, the network and the driver, as a name such as eastus or westeurope."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9]+$", var.location))
    error_message = "location must be a region name in lowercase without spaces, e.g. eastus or westeurope."
  }
}

variable "zones" {
  description = "Availability zones the scale set may use (\"1\", \"2\", \"3\"); empty means regional, Azure places the VMs. One zone keeps Horovod's rings inside it and puts the NAT gateway and the driver there too; several find more spot capacity but send ring traffic across zones."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for z in var.zones : contains(["1", "2", "3"], z)]) && length(distinct(var.zones)) == length(var.zones)
    error_message = "zones must hold distinct zone numbers out of \"1\", \"2\", \"3\"."
  }
}

variable "name" {
  description = "Name of the scale set (spotring run --group) and prefix of every other resource name."
  type        = string

  validation {
    # Short enough for the derived names (NAME-driver-asg, computer names).
    condition     = can(regex("^[a-z]([-a-z0-9]{0,21}[a-z0-9])?$", var.name))
    error_message = "name must hold 1-23 lowercase letters, digits or hyphens, start with a letter and not end with a hyphen."
  }
}

variable "resource_group_name" {
  description = "Name of the resource group the module creates (spotring run --resource-group); null means spotring-NAME. It must be new and hold nothing else: the driver's identity may read and delete every VM in it."
  type        = string
  default     = null

  validation {
    condition     = var.resource_group_name == null || can(regex("^[-\\w.()]{0,89}[-\\w()]$", var.resource_group_name))
    error_message = "resource_group_name must be null or 1-90 letters, digits, underscores, hyphens, periods or parentheses, not ending with a period."
  }
}

# --- workers ----------------------------------------------------------------------------

variable "vm_size" {
  description = "VM size of the workers, e.g. Standard_D8s_v5, or a GPU size such as Standard_NC4as_T4_v3 (set slots_per_host to its GPU count, and use a GPU image)."
  type        = string
  default     = "Standard_D8s_v5"

  validation {
    condition     = can(regex("^Standard_[A-Za-z0-9_-]+$", var.vm_size))
    error_message = "vm_size must be an Azure VM size such as Standard_D8s_v5."
  }
}

variable "slots_per_host" {
  description = "Horovod slots (worker processes) per worker VM: 1 for CPU sizes, the GPU count for GPU sizes. Written as the tag spotring-slots, which spotring's Azure provider reads."
  type        = number
  default     = 1

  validation {
    condition     = var.slots_per_host >= 1 && floor(var.slots_per_host) == var.slots_per_host
    error_message = "slots_per_host must be a whole number >= 1."
  }
}

variable "worker_count" {
  description = "Initial number of workers (the scale set's capacity). After creation spotring sizes the set; Terraform ignores later drift."
  type        = number

  validation {
    condition     = var.worker_count >= 0 && floor(var.worker_count) == var.worker_count
    error_message = "worker_count must be a whole number >= 0."
  }
}

variable "min_worker_count" {
  description = "Fewest workers the job runs on (--min-np, in hosts). spotring never sizes the set below what it needs."
  type        = number
  default     = 1

  validation {
    condition     = var.min_worker_count >= 0 && floor(var.min_worker_count) == var.min_worker_count
    error_message = "min_worker_count must be a whole number >= 0."
  }
}

variable "max_worker_count" {
  description = "Most workers the job uses (--max-np, in hosts); spotring never sizes the set above it."
  type        = number

  validation {
    condition     = var.max_worker_count >= 1 && floor(var.max_worker_count) == var.max_worker_count && var.max_worker_count <= 1000
    error_message = "max_worker_count must be a whole number from 1 to 1000 (a Flexible scale set's limit)."
  }
}

variable "accelerated_networking_enabled" {
  description = "Accelerated networking on the workers' network interfaces: faster Gloo/NCCL rings, but only on VM sizes that support it (most D/E/F v4+ and N sizes with 4 or more vCPUs)."
  type        = bool
  default     = false
}

# --- images and disks ---------------------------------------------------------------------

variable "image" {
  description = "Marketplace image of the workers (unless source_image_id) and the driver (unless driver_source_image_id). The bootstrap expects apt-get or dnf, cloud-init and python3 >= 3.10; the default is Ubuntu 24.04 LTS (generation 2)."
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
  default = {
    publisher = "Canonical"
    offer     = "ubuntu-24_04-lts"
    sku       = "server"
    version   = "latest"
  }
}

variable "source_image_id" {
  description = "Resource id of an image for the workers instead of the marketplace image (a managed image or a gallery image version), e.g. one with the NVIDIA driver, CUDA and NCCL for GPU sizes, or with everything prebaked."
  type        = string
  default     = null

  validation {
    condition     = var.source_image_id == null || can(regex("^/(subscriptions|communityGalleries|sharedGalleries)/", var.source_image_id))
    error_message = "source_image_id must be null or an image resource id starting with /subscriptions/, /communityGalleries/ or /sharedGalleries/."
  }
}

variable "driver_source_image_id" {
  description = "Resource id of an image for the driver; null means the marketplace image (the driver needs no GPU driver)."
  type        = string
  default     = null

  validation {
    condition     = var.driver_source_image_id == null || can(regex("^/(subscriptions|communityGalleries|sharedGalleries)/", var.driver_source_image_id))
    error_message = "driver_source_image_id must be null or an image resource id starting with /subscriptions/, /communityGalleries/ or /sharedGalleries/."
  }
}

variable "os_disk_size_gb" {
  description = "OS disk size of workers and driver in GB (the venv with torch and Horovod takes several GB)."
  type        = number
  default     = 100

  validation {
    condition     = var.os_disk_size_gb >= 30 && floor(var.os_disk_size_gb) == var.os_disk_size_gb
    error_message = "os_disk_size_gb must be a whole number of at least 30."
  }
}

variable "os_disk_type" {
  description = "Storage type of the OS disks of workers and driver. Premium_LRS needs VM sizes with premium storage (an s in the size name)."
  type        = string
  default     = "StandardSSD_LRS"

  validation {
    condition     = contains(["Standard_LRS", "StandardSSD_LRS", "StandardSSD_ZRS", "Premium_LRS", "Premium_ZRS"], var.os_disk_type)
    error_message = "os_disk_type must be Standard_LRS, StandardSSD_LRS, StandardSSD_ZRS, Premium_LRS or Premium_ZRS."
  }
}

variable "encryption_at_host_enabled" {
  description = "Encryption at host on workers and driver (temp disks and disk caches encrypted too). Needs the subscription feature Microsoft.Compute/EncryptionAtHost (az feature register --namespace Microsoft.Compute --name EncryptionAtHost) and VM sizes that support it; managed disks are encrypted at rest either way."
  type        = bool
  default     = false
}

# --- driver -----------------------------------------------------------------------------

variable "driver_vm_size" {
  description = "VM size of the driver host. It runs the spotring controller and Horovod's elastic driver, not training; it is always on-demand."
  type        = string
  default     = "Standard_D2s_v5"

  validation {
    condition     = can(regex("^Standard_[A-Za-z0-9_-]+$", var.driver_vm_size))
    error_message = "driver_vm_size must be an Azure VM size such as Standard_D2s_v5."
  }
}

variable "driver_trusted_launch" {
  description = "Secure boot and vTPM (trusted launch) on the driver. Needs a generation 2 image and a VM size that supports trusted launch (the defaults do)."
  type        = bool
  default     = true
}

variable "driver_public_ip" {
  description = "Give the driver a public IP address. Off by default: reach it through Azure Bastion, a VPN or a peered network. The workers never get one."
  type        = bool
  default     = false
}

# --- network ----------------------------------------------------------------------------

variable "address_space" {
  description = "IPv4 range of the module's virtual network and its one subnet (workers and driver). Only this range may reach the hosts, besides ssh to the driver from admin_cidrs."
  type        = string
  default     = "10.42.0.0/20"

  validation {
    condition     = can(cidrhost(var.address_space, 0)) && !strcontains(var.address_space, ":") && try(tonumber(split("/", var.address_space)[1]) >= 8 && tonumber(split("/", var.address_space)[1]) <= 28, false)
    error_message = "address_space must be an IPv4 CIDR block from /8 to /28, such as 10.42.0.0/20."
  }
}

variable "admin_cidrs" {
  description = "IPv4 CIDR blocks allowed to ssh (port 22) to the driver; nothing else is open from outside. Required, so that nobody gets ssh from everywhere by default: [] for none, or your own addresses. Blocks wider than /8 and service tags (*, Internet, Any) are refused."
  type        = list(string)

  validation {
    # Not just /0: 0.0.0.0/1 + 128.0.0.0/1 is the whole internet too. IANA's largest
    # allocations are /8s, so a wider block is never one party's own addresses.
    condition     = alltrue([for c in var.admin_cidrs : can(cidrhost(c, 0)) && !strcontains(c, ":") && try(tonumber(split("/", c)[1]) >= 8, false) && !contains(["*", "internet", "any"], lower(c))])
    error_message = "admin_cidrs must hold IPv4 CIDR blocks of /8 or narrower, such as 203.0.113.7/32: 0.0.0.0/0 and wider blocks (0.0.0.0/1 and 128.0.0.0/1 together are ssh from the whole internet), \"*\", \"Internet\" and \"Any\" are not allowed."
  }
}

# --- ssh --------------------------------------------------------------------------------

variable "ssh_user" {
  description = "Admin user on the hosts, created at provisioning with the keys of ssh_public_keys. Horovod's ssh launcher logs in to the workers as the user that runs spotring on the driver."
  type        = string
  default     = "spotring"

  validation {
    # Azure refuses these admin names (and root); see the VM create API's adminUsername.
    condition = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user)) && !contains([
      "root", "admin", "administrator", "adm", "admin1", "admin2", "user", "user1", "user2",
      "user3", "user4", "user5", "test", "test1", "test2", "test3", "guest", "owner", "sys",
      "server", "sql", "support", "console", "backup", "aspnet", "actuser", "a", "john", "david",
    ], var.ssh_user)
    error_message = "ssh_user must be a plain POSIX user name that Azure accepts as an admin user (not root, admin, user, test, ...)."
  }
}

variable "ssh_public_keys" {
  description = "OpenSSH public keys authorized for ssh_user on every worker and on the driver. Azure takes ssh-rsa (2048 bits or more) and ssh-ed25519 keys. Include the key the driver uses to reach the workers (its private half goes to the driver via your ssh agent, `ssh -A`, or a copy); Terraform never holds a private key, and no password is set."
  type        = list(string)

  validation {
    condition     = length(var.ssh_public_keys) > 0 && alltrue([for k in var.ssh_public_keys : can(regex("^ssh-(ed25519|rsa) [A-Za-z0-9+/=]+( [^\\n']*)?$", k))])
    error_message = "ssh_public_keys must hold at least one OpenSSH ssh-rsa or ssh-ed25519 public key, one per entry, without newlines or single quotes."
  }
}

# --- software on the hosts (rendered into worker_image/bootstrap.sh.tftpl) ---------------

variable "spotring_package" {
  description = "spotring's wheel for the hosts: its https URL with the file's sha256, which pip checks, e.g. \"spotring[azure] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256=<64 hex digits>\" (sha256sum of the wheel; build it with pip wheel --no-deps .). Installed without dependencies: they and the azure extra's (azure-mgmt-compute, azure-mgmt-network, azure-identity and azure-storage-blob) come hash-pinned from worker_image/requirements-worker-azure.txt."
  type        = string

  validation {
    # A git URL or an index name could not be hash-checked.
    condition     = can(regex("^(spotring(\\[[a-z,]+\\])? ?@ ?)?https://[^\\s'#]+\\.whl#sha256=[0-9a-f]{64}$", var.spotring_package))
    error_message = "spotring_package must be a wheel's https:// URL ending in #sha256=<64 hex digits>, optionally as spotring[azure] @ URL (http://, git and index names are refused: pip could not check them)."
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
  description = "The training command after `--`, one argument per element, e.g. [\"python\", \"/opt/train/train.py\"]. When set, the driver runs `spotring run` for it under the systemd unit spotring-job (restarted on failure, started at every boot), so a driver crash or reboot resumes the job. Empty: no unit; run spotring_command by hand. It must exist at the same path on every worker. Custom data runs once: set it before the driver is created (or replace the driver)."
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
  description = "Where the job writes durable checkpoints (spotring run --checkpoint): https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX. Empty: no durable checkpoints and no storage permissions. When set (with checkpoint_storage_account_id), the workers get a user-assigned identity, and it and the driver's identity get blob data access to that container confined by conditions to PREFIX/ (the driver writes only PREFIX/lock.json); the unit's command (and spotring_command) pass --checkpoint."
  type        = string
  default     = ""

  validation {
    # No quotes or spaces in the prefix: it goes into the unit and spotring_command.
    condition     = var.checkpoint_uri == "" || (can(regex("^https://[a-z0-9]{3,24}\\.blob\\.core\\.windows\\.net/[a-z0-9][a-z0-9-]{1,61}[a-z0-9]/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$", var.checkpoint_uri)) && !can(regex("^https://[^/]+/[^/]*--", var.checkpoint_uri)))
    error_message = "checkpoint_uri must be \"\" or https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX: a storage account name (3-24 lowercase letters and digits), a container name (3-63 lowercase letters, digits and single hyphens) and a non-empty prefix of letters, digits and . _ - separated by single slashes."
  }
}

variable "checkpoint_storage_account_id" {
  description = "Resource id of checkpoint_uri's storage account, /subscriptions/SUB/resourceGroups/RG/providers/Microsoft.Storage/storageAccounts/ACCOUNT (az storage account show -n ACCOUNT --query id): the role assignments' scope is its container. Required with checkpoint_uri; the account may live in any resource group or subscription of the tenant."
  type        = string
  default     = null

  validation {
    condition     = var.checkpoint_storage_account_id == null || can(regex("^/subscriptions/[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}/resourceGroups/[-\\w.()]+/providers/Microsoft\\.Storage/storageAccounts/[a-z0-9]{3,24}$", var.checkpoint_storage_account_id))
    error_message = "checkpoint_storage_account_id must be null or a storage account resource id: /subscriptions/SUB/resourceGroups/RG/providers/Microsoft.Storage/storageAccounts/ACCOUNT."
  }
}

variable "tags" {
  description = "Tags for every resource that takes them, including the scale set (its VMs) and the driver."
  type        = map(string)
  default     = {}

  validation {
    condition     = length(setintersection(keys(var.tags), ["spotring-slots", "spotring-group"])) == 0
    error_message = "tags must not set spotring-slots or spotring-group; the module sets them (slots through slots_per_host)."
  }
}
