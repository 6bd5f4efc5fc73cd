"""GCP prices of machine types whose SKUs are not named "<FAMILY> Instance Core": C2's
("Compute optimized Core"), custom types' ("N2 Custom Instance Core", N1's "Custom
Instance Core"), and those left unknown (extended memory, shared-core custom types).
The catalog is google-cloud-billing's own Sku messages, as the fake answers them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.billing_v1", reason="google-cloud-billing is not installed")

from google.auth.credentials import AnonymousCredentials

from spotring.providers.gcp import GcpProvider
from spotring.providers.gcp.prices import machine_price
from tests.fakes.gcp import FakeCompute
from tests.fakes.prices import GcpPrices, compute_sku

ZONE, REGION = "us-central1-a", "us-central1"


def sku(description: str, usd: float, spot: bool = False) -> Any:
    unit = "GiBy.h" if " Ram " in description else "h"
    usage = "Preemptible" if spot else "OnDemand"
    return compute_sku(description, REGION, usd, usage=usage, unit=unit)


# Each family's Core and Ram, on-demand and spot, priced apart so a wrong match shows.
CATALOG = [
    sku("Compute optimized Sole Tenancy Instance Core running in Americas", 9.0),
    sku("Commitment: Compute optimized Core running in Americas for 1 Year", 8.0),
    sku("Compute optimized Core running in Americas", 0.03398),
    sku("Compute optimized Ram running in Americas", 0.00455),
    sku("Spot Preemptible Compute optimized Core running in Americas", 0.00816, spot=True),
    sku("Spot Preemptible Compute optimized Ram running in Americas", 0.00109, spot=True),
    sku("N2 Instance Core running in Americas", 0.031611),
    sku("N2 Instance Ram running in Americas", 0.004237),
    sku("N2 Custom Extended Instance Ram running in Americas", 7.0),
    sku("N2 Custom Instance Core running in Americas", 0.033174),
    sku("N2 Custom Instance Ram running in Americas", 0.004446),
    sku("Spot Preemptible N2 Custom Instance Core running in Americas", 0.00803, spot=True),
    sku("Spot Preemptible N2 Custom Instance Ram running in Americas", 0.00108, spot=True),
    sku("N2D AMD Custom Instance Core running in Americas", 0.028877),
    sku("N2D AMD Custom Instance Ram running in Americas", 0.003870),
    sku("Custom Instance Core running in Americas", 0.033174),
    sku("Custom Instance Ram running in Americas", 0.004446),
]


@pytest.mark.parametrize(
    ("machine_type", "spot", "usd"),
    [
        ("c2-standard-4", False, 4 * 0.03398 + 16 * 0.00455),
        ("c2-standard-4", True, 4 * 0.00816 + 16 * 0.00109),
        ("n2-custom-4-16384", False, 4 * 0.033174 + 16 * 0.004446),
        ("n2-custom-4-16384", True, 4 * 0.00803 + 16 * 0.00108),
        ("n2d-custom-4-16384", False, 4 * 0.028877 + 16 * 0.003870),
        ("custom-4-16384", False, 4 * 0.033174 + 16 * 0.004446),
        ("n2-standard-4", False, 4 * 0.031611 + 16 * 0.004237),  # predefined: as before
    ],
)
def test_each_family_is_priced_at_its_own_skus(machine_type: str, spot: bool, usd: float) -> None:
    assert machine_price([CATALOG], machine_type, REGION, spot, 4, 16.0) == pytest.approx(usd)


@pytest.mark.parametrize(
    "machine_type", ["n2-custom-4-32768-ext", "e2-custom-micro-2048", "c2d-standard-4"]
)
def test_types_priced_otherwise_or_not_listed_are_unknown(machine_type: str) -> None:
    assert machine_price([CATALOG], machine_type, REGION, False, 4, 16.0) is None


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    with FakeCompute() as server:
        yield server


def test_a_c2_group_is_priced_through_the_catalog(compute: FakeCompute) -> None:
    """End to end through the provider: the template's C2 type, its vCPUs and memory from
    machineTypes.get, the SKUs paged from the catalog."""
    machine_types = {"c2-standard-4": (4, 16384)}
    with GcpPrices(CATALOG, machine_types, upstream=compute.url, page_size=5) as prices:
        compute.add_group("workers", zone=ZONE, machine_type="c2-standard-4",
                          provisioning_model="SPOT")  # fmt: skip
        group = GcpProvider(
            "workers",
            zone=ZONE,
            project=compute.project,
            endpoint=prices.url,
            credentials=AnonymousCredentials(),
            catalog_endpoint=prices.url,
        )
        price = group.hourly_price()
    assert price is not None and price.usd == pytest.approx(4 * 0.00816 + 16 * 0.00109)
