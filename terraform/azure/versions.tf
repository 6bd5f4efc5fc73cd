terraform {
  # 1.5: check blocks and preconditions; nothing newer is needed.
  required_version = ">= 1.5"

  required_providers {
    azurerm = {
      source = "hashicorp/azurerm"
      # 4.x: the attribute names used here are 4.0's (accelerated_networking_enabled on
      # network interfaces; subscription_id in the provider block). 4.0 also has
      # default_outbound_access_enabled on subnets and role_definition_resource_id.
      version = ">= 4.0, < 5.0"
    }
  }
}

provider "azurerm" {
  # Required in the provider block (or ARM_SUBSCRIPTION_ID) since 4.0; the same id is
  # the --subscription of spotring_command.
  subscription_id = var.subscription_id

  features {}
}
