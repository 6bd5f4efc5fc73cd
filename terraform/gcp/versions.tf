terraform {
  # 1.5: check blocks and preconditions; nothing newer is needed.
  required_version = ">= 1.5"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 5.0: provider-wide default_labels, instance_termination_action on spot VMs.
      version = ">= 5.0, < 8.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region

  default_labels = merge(var.labels, { "spotring-group" = var.name })
}
