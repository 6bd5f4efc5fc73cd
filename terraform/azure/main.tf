# Shared pieces: the bootstrap template, the resource group, the network (virtual
# network and subnet without default outbound access, a NAT gateway) and the network
# security group of the subnet.

locals {
  # worker_image/ sits next to terraform/ in the spotring repository.
  bootstrap_template = "${path.module}/../../worker_image/bootstrap.sh.tftpl"

  # The hash-pinned packages the bootstrap installs, with the azure extra's tree
  # (scripts/lock-worker-requirements.sh), passed to it as requirements_lock: the
  # repository keeps one copy.
  requirements_lock_file = "${path.module}/../../worker_image/requirements-worker-azure.txt"

  # A resource group of its own: the driver's identity may read and delete every VM in
  # it (iam.tf), so nothing but this cluster may live there.
  resource_group_name = coalesce(var.resource_group_name, "spotring-${var.name}")

  # Every resource carries these; the scale set adds spotring-slots.
  tags = merge(var.tags, { "spotring-group" = var.name })

  # The driver's zone: the first of the set's zones, else none (regional).
  driver_zone = try(var.zones[0], null)

  # A NAT gateway lives in one zone or in none; with one zone for the set it sits in
  # that zone, otherwise Azure places it.
  nat_zones = length(var.zones) == 1 ? var.zones : null
}

resource "azurerm_resource_group" "cluster" {
  name     = local.resource_group_name
  location = var.location
  tags     = local.tags
}

# --- network ---------------------------------------------------------------------------

resource "azurerm_virtual_network" "cluster" {
  name                = "${var.name}-vnet"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  address_space       = [var.address_space]
  tags                = local.tags

  # No dns_servers: Azure-provided DNS (168.63.129.16) resolves the package indexes and
  # Azure Resource Manager.
}

# One subnet spanning the whole address space: workers and driver. No default outbound
# access: outbound traffic (apt, PyPI, the PyTorch index, Azure Resource Manager for the
# driver) leaves through the NAT gateway only.
resource "azurerm_subnet" "cluster" {
  name                            = "${var.name}-subnet"
  resource_group_name             = azurerm_resource_group.cluster.name
  virtual_network_name            = azurerm_virtual_network.cluster.name
  address_prefixes                = [var.address_space]
  default_outbound_access_enabled = false
}

# NAT gateway: outbound only, for the bootstrap's downloads from hosts without a
# public IP.
resource "azurerm_public_ip" "nat" {
  name                = "${var.name}-nat-ip"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  allocation_method   = "Static"
  sku                 = "Standard"
  zones               = local.nat_zones
  tags                = local.tags
}

resource "azurerm_nat_gateway" "nat" {
  name                    = "${var.name}-nat"
  resource_group_name     = azurerm_resource_group.cluster.name
  location                = azurerm_resource_group.cluster.location
  sku_name                = "Standard"
  idle_timeout_in_minutes = 10
  zones                   = local.nat_zones
  tags                    = local.tags
}

resource "azurerm_nat_gateway_public_ip_association" "nat" {
  nat_gateway_id       = azurerm_nat_gateway.nat.id
  public_ip_address_id = azurerm_public_ip.nat.id
}

resource "azurerm_subnet_nat_gateway_association" "cluster" {
  subnet_id      = azurerm_subnet.cluster.id
  nat_gateway_id = azurerm_nat_gateway.nat.id
}

# --- network security group --------------------------------------------------------------
# On the subnet, so that it covers every worker the set creates and the driver. The
# default rules would also let in the whole VirtualNetwork service tag (peered networks,
# on-premises ranges behind gateways) and Azure Load Balancer probes; the rules below
# allow only the module's own address space and ssh to the driver from admin_cidrs, and
# deny everything else. Outbound stays at the defaults (internet through the NAT
# gateway). Azure's platform addresses (DHCP, DNS, the metadata service with Scheduled
# Events) are not filtered by security groups.

resource "azurerm_network_security_group" "cluster" {
  name                = "${var.name}-nsg"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  tags                = local.tags
}

resource "azurerm_subnet_network_security_group_association" "cluster" {
  subnet_id                 = azurerm_subnet.cluster.id
  network_security_group_id = azurerm_network_security_group.cluster.id
}

# All TCP and UDP between hosts of the subnet: Horovod's ssh launcher (22), Gloo and
# NCCL rings (ephemeral ports between workers) and the elastic driver's rendezvous
# server (an ephemeral port on the driver).
resource "azurerm_network_security_rule" "cluster_internal" {
  name                        = "allow-cluster-internal"
  description                 = "spotring ${var.name}: ssh, Gloo/NCCL and rendezvous traffic between hosts of the cluster's address space"
  resource_group_name         = azurerm_resource_group.cluster.name
  network_security_group_name = azurerm_network_security_group.cluster.name
  priority                    = 100
  direction                   = "Inbound"
  access                      = "Allow"
  protocol                    = "*"
  source_port_range           = "*"
  destination_port_range      = "*"
  source_address_prefix       = var.address_space
  destination_address_prefix  = var.address_space
}

# ssh from outside to the driver only, from admin_cidrs. No rule at all without
# admin_cidrs (the deny rule below then holds).
resource "azurerm_network_security_rule" "driver_ssh" {
  count = length(var.admin_cidrs) > 0 ? 1 : 0

  name                                       = "allow-driver-ssh"
  description                                = "spotring ${var.name}: ssh to the driver from admin_cidrs"
  resource_group_name                        = azurerm_resource_group.cluster.name
  network_security_group_name                = azurerm_network_security_group.cluster.name
  priority                                   = 110
  direction                                  = "Inbound"
  access                                     = "Allow"
  protocol                                   = "Tcp"
  source_port_range                          = "*"
  destination_port_range                     = "22"
  source_address_prefixes                    = var.admin_cidrs
  destination_application_security_group_ids = [azurerm_application_security_group.driver.id]
}

# Everything else inbound is denied, from the internet and from any other network, ahead
# of Azure's default AllowVnetInBound and AllowAzureLoadBalancerInBound rules.
resource "azurerm_network_security_rule" "deny_other_inbound" {
  name                        = "deny-other-inbound"
  description                 = "spotring ${var.name}: no other inbound traffic"
  resource_group_name         = azurerm_resource_group.cluster.name
  network_security_group_name = azurerm_network_security_group.cluster.name
  priority                    = 4096
  direction                   = "Inbound"
  access                      = "Deny"
  protocol                    = "*"
  source_port_range           = "*"
  destination_port_range      = "*"
  source_address_prefix       = "*"
  destination_address_prefix  = "*"
}

# The driver's network interface is the only member: the ssh rule targets it, not an
# address, so it holds whatever private IP the driver gets.
resource "azurerm_application_security_group" "driver" {
  name                = "${var.name}-driver-asg"
  resource_group_name = azurerm_resource_group.cluster.name
  location            = azurerm_resource_group.cluster.location
  tags                = local.tags
}
