"""Static checks of terraform/: the modules parsed with python-hcl2, checkov."""
