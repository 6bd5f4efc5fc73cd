# Inputs of the driver-job child module. The calling modules (terraform/aws, gcp, azure)
# validate what their users pass; the checks here repeat what the unit's quoting relies on.

variable "group_name" {
  description = "Name of the worker group (for the unit's description)."
  type        = string
}

variable "provider_args" {
  description = "The `spotring run` options that name the provider, the group and the sizes, e.g. [\"--provider\", \"aws\", \"--group\", \"NAME\", \"--region\", \"us-east-1\", \"-np\", \"4\", ...]."
  type        = list(string)

  validation {
    condition     = length(var.provider_args) >= 2 && var.provider_args[0] == "--provider"
    error_message = "provider_args must start with --provider NAME."
  }
}

variable "ssh_user" {
  description = "The unprivileged user the unit runs `spotring run` as: the login user of every host, which Horovod's ssh launcher logs in to the workers as."
  type        = string

  validation {
    # Not root either: the calling modules refuse it (a variable validation on GCP and
    # Azure, a precondition on the AWS driver when job_command is set).
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be a plain POSIX user name."
  }
}

variable "job_command" {
  description = "The training command after `--`, one argument per element; empty means no unit (every output is empty)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for word in var.job_command : length(word) > 0 && !can(regex("[[:cntrl:]]", word))])
    error_message = "job_command must hold non-empty arguments without control characters."
  }
}

variable "job_args" {
  description = "Extra `spotring run` options, placed after provider_args."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for word in var.job_args : length(word) > 0 && word != "--" && !can(regex("[[:cntrl:]]", word))])
    error_message = "job_args must hold non-empty options without control characters and no `--`."
  }
}

variable "working_directory" {
  description = "Working directory of the job; empty means ssh_user's home."
  type        = string
  default     = ""

  validation {
    condition     = var.working_directory == "" || can(regex("^/[A-Za-z0-9._/@+-]*$", var.working_directory))
    error_message = "working_directory must be \"\" or an absolute path of letters, digits and . _ / @ + -."
  }
}

variable "ssh_identity_file" {
  description = "Private key (absolute path) for --ssh-identity-file; empty means ssh's default keys of ssh_user."
  type        = string
  default     = ""

  validation {
    condition     = var.ssh_identity_file == "" || can(regex("^/[A-Za-z0-9._/@+-]+$", var.ssh_identity_file))
    error_message = "ssh_identity_file must be \"\" or an absolute path of letters, digits and . _ / @ + -."
  }
}

variable "checkpoint_uri" {
  description = "spotring run --checkpoint URI; empty means none."
  type        = string
  default     = ""

  validation {
    condition     = !can(regex("[[:cntrl:]\\s]", var.checkpoint_uri))
    error_message = "checkpoint_uri must hold no spaces or control characters."
  }
}
