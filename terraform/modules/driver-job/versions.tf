terraform {
  # The calling modules' floor; this module uses no provider.
  required_version = ">= 1.5"
}
