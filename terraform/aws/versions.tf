terraform {
  # 1.5: check blocks and preconditions; nothing newer is needed.
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.30, < 7.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, { "spotring:group" = var.name })
  }
}
