"""The GCP provider's price of a VM-hour: the template's machine type (machineTypes.get)
at its family's Core and Ram SKUs from the Cloud Billing Catalog (google-cloud-billing's
client against a fake that pages as services.skus.list documents), for a group on the
Compute fake."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.billing_v1", reason="google-cloud-billing is not installed")

from google.auth.credentials import AnonymousCredentials

from spotring.core.prices import PriceBook
from spotring.providers.gcp import GcpProvider
from tests.fakes.gcp import FakeCompute
from tests.fakes.prices import GcpPrices, compute_sku

ZONE, REGION = "us-central1-a", "us-central1"


def catalog() -> list[Any]:
    here = REGION
    return [
        compute_sku("N1 Predefined Instance Core running in EMEA", "europe-west1", 0.05),
        compute_sku("N2 Custom Instance Core running in Americas", here, 0.04),
        compute_sku("N1 Predefined Instance Core running in Americas", here, 0.031611),
        compute_sku(
            "N1 Predefined Instance Ram running in Americas", here, 0.004237, unit="GiBy.h"
        ),
        compute_sku(
            "Spot Preemptible N1 Predefined Instance Core running in Americas",
            here, 0.00698, usage="Preemptible",
        ),
        compute_sku(
            "Spot Preemptible N1 Predefined Instance Ram running in Americas",
            here, 0.000936, usage="Preemptible", unit="GiBy.h",
        ),
    ]  # fmt: skip


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    with FakeCompute() as server:
        yield server


@pytest.fixture
def prices(compute: FakeCompute) -> Iterator[GcpPrices]:
    machine_types = {"n1-standard-4": (4, 15360), "c2-standard-4": (4, 16384)}
    with GcpPrices(catalog(), machine_types, upstream=compute.url, page_size=2) as server:
        yield server


def provider(compute: FakeCompute, prices: GcpPrices, **group: Any) -> GcpProvider:
    compute.add_group("workers", zone=ZONE, **group)
    return GcpProvider(
        "workers",
        zone=ZONE,
        project=compute.project,
        endpoint=prices.url,
        credentials=AnonymousCredentials(),
        catalog_endpoint=prices.url,
    )


@pytest.mark.parametrize(
    ("model", "usd"),
    [("SPOT", 4 * 0.00698 + 15 * 0.000936), ("STANDARD", 4 * 0.031611 + 15 * 0.004237)],
)
def test_a_groups_price_is_its_machines_cores_and_memory_at_the_catalogs_price(
    compute: FakeCompute, prices: GcpPrices, model: str, usd: float
) -> None:
    price = provider(compute, prices, provisioning_model=model).hourly_price()
    assert price is not None
    assert price.usd == pytest.approx(usd) and price.source == "gcp:cloudbilling.skus.list"
    skus = [r for r in prices.requests if "/skus" in r]
    assert skus[0].startswith("/v1/services/6F81-5844-456A/skus?") and len(skus) >= 2  # paged
    assert any("/machineTypes/n1-standard-4" in r for r in prices.requests)


def test_a_family_the_catalog_does_not_name_is_unknown_and_said_once(
    compute: FakeCompute, prices: GcpPrices, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "spotring.core.prices")
    group = provider(compute, prices, machine_type="c2-standard-4")
    assert group.hourly_price() is None
    book = PriceBook([group], {})
    book.read_due()
    book.read_due()
    assert book.price("workers") is None
    assert caplog.text.count("group workers: no price from its cloud") == 1


def test_a_group_on_a_test_endpoint_asks_no_public_catalog(compute: FakeCompute) -> None:
    compute.add_group("workers", zone=ZONE)
    group = GcpProvider(
        "workers",
        zone=ZONE,
        project=compute.project,
        endpoint=compute.url,
        credentials=AnonymousCredentials(),
    )
    assert group.hourly_price() is None and not compute.requests
