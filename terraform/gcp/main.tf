# Shared pieces: the bootstrap template, the network (VPC, subnet with flow logs and
# private Google access, Cloud NAT) and the firewall rules.

locals {
  # worker_image/ sits next to terraform/ in the spotring repository.
  bootstrap_template = "${path.module}/../../worker_image/bootstrap.sh.tftpl"

  # The hash-pinned packages the bootstrap installs, with the gcp extra's tree
  # (scripts/lock-worker-requirements.sh), passed to it as requirements_lock: the
  # repository keeps one copy.
  requirements_lock_file = "${path.module}/../../worker_image/requirements-worker-gcp.txt"

  # Horovod slots per worker: explicit, or one per GPU, or one.
  slots_per_host = coalesce(var.slots_per_host, max(var.gpu_count, 1))

  # The driver's zone: explicit, else the first of the group's zones, else the first
  # zone of the region that is UP.
  driver_zone = coalesce(var.driver_zone, try(var.zones[0], null), data.google_compute_zones.available.names[0])

  # Installed on the workers and the driver for ssh_user (the ssh-keys metadata); the
  # bootstrap authorizes the same keys again, and creates the user if the guest agent
  # has not yet.
  ssh_keys_metadata = join("\n", [for key in var.ssh_public_keys : "${var.ssh_user}:${key}"])

  # The two accounts whose VMs form the cluster; the internal firewall rule matches
  # them rather than network tags: attaching a service account to a VM takes
  # iam.serviceAccounts.actAs on it, a tag only compute.instances.setTags.
  cluster_service_accounts = [google_service_account.worker.email, google_service_account.driver.email]
}

data "google_compute_zones" "available" {
  project = var.project
  region  = var.region
  status  = "UP"
}

# --- network ---------------------------------------------------------------------------

resource "google_compute_network" "cluster" {
  project                 = var.project
  name                    = "${var.name}-net"
  description             = "spotring ${var.name}: workers and driver"
  auto_create_subnetworks = false
  routing_mode            = "REGIONAL"
}

resource "google_compute_subnetwork" "cluster" {
  project       = var.project
  name          = "${var.name}-subnet"
  region        = var.region
  network       = google_compute_network.cluster.id
  ip_cidr_range = var.subnet_cidr

  # The workers have no external address: Google APIs (the driver's Compute calls,
  # Cloud Logging) go over private Google access, everything else through Cloud NAT.
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_5_SEC"
    flow_sampling        = var.flow_log_sampling
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

# Cloud NAT: outbound only, for apt, PyPI and the PyTorch index during the bootstrap.
resource "google_compute_router" "nat" {
  project = var.project
  name    = "${var.name}-nat"
  region  = var.region
  network = google_compute_network.cluster.id
}

resource "google_compute_router_nat" "nat" {
  project                            = var.project
  name                               = "${var.name}-nat"
  router                             = google_compute_router.nat.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "LIST_OF_SUBNETWORKS"

  subnetwork {
    name                    = google_compute_subnetwork.cluster.id
    source_ip_ranges_to_nat = ["ALL_IP_RANGES"]
  }

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# --- firewall ----------------------------------------------------------------------------
# A new VPC network has no rules but the implied ones: all egress allowed, all ingress
# denied. These two open what the cluster needs and nothing else.

# All TCP and UDP between members: Horovod's ssh launcher (22), Gloo and NCCL rings
# (ephemeral ports between workers) and the elastic driver's rendezvous server (an
# ephemeral port on the driver).
resource "google_compute_firewall" "cluster_internal" {
  project     = var.project
  name        = "${var.name}-cluster-internal"
  description = "spotring ${var.name}: ssh, Gloo/NCCL and rendezvous traffic between cluster members"
  network     = google_compute_network.cluster.id
  direction   = "INGRESS"
  priority    = 1000

  source_service_accounts = local.cluster_service_accounts
  target_service_accounts = local.cluster_service_accounts

  allow {
    protocol = "tcp"
  }

  allow {
    protocol = "udp"
  }
}

# ssh from outside to the driver only, from admin_cidrs (none: no rule at all, since a
# rule without source ranges would match every address).
resource "google_compute_firewall" "driver_ssh" {
  count = length(var.admin_cidrs) > 0 ? 1 : 0

  project     = var.project
  name        = "${var.name}-driver-ssh"
  description = "spotring ${var.name}: ssh to the driver from admin_cidrs"
  network     = google_compute_network.cluster.id
  direction   = "INGRESS"
  priority    = 1000

  source_ranges           = var.admin_cidrs
  target_service_accounts = [google_service_account.driver.email]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}
