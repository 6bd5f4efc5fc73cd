"""The Azure provider's price of a VM-hour, from the Retail Prices API (a fake that
answers as the API documents, paging with NextPageLink), for a set on the fake ARM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")

from spotring.core.prices import PriceBook
from spotring.providers.azure import AzureProvider
from spotring.providers.base import ProviderError
from tests.fakes.azure import FakeArm
from tests.fakes.prices import AzureRetailPrices, vm_meter

SIZE = "Standard_D4s_v5"


@pytest.fixture
def arm() -> Iterator[FakeArm]:
    with FakeArm() as server:
        yield server


@pytest.fixture
def retail() -> Iterator[AzureRetailPrices]:
    items = [
        vm_meter(SIZE, "westus", 0.20),  # another region
        vm_meter(SIZE, "eastus", 0.50, windows=True),
        vm_meter(SIZE, "eastus", 0.01, kind="Low Priority"),
        vm_meter(SIZE, "eastus", 0.15, price_type="DevTestConsumption"),
        vm_meter(SIZE, "eastus", 0.04, kind="Spot", windows=True),
        vm_meter(SIZE, "eastus", 0.192),
        vm_meter(SIZE, "eastus", 0.0384, kind="Spot"),
    ]
    with AzureRetailPrices(items, page_size=1) as server:
        yield server


def provider(arm: FakeArm, retail: AzureRetailPrices, priority: str) -> AzureProvider:
    arm.add_scale_set("workers", vm_size=SIZE, priority=priority, location="eastus")
    return AzureProvider(
        "workers",
        resource_group="rg",
        subscription=arm.subscription,
        endpoint=arm.url,
        retail_prices_url=retail.api_url,
    )


@pytest.mark.parametrize(("priority", "usd"), [("Spot", 0.0384), ("Regular", 0.192)])
def test_a_sets_price_is_its_sizes_linux_meter_in_its_region(
    arm: FakeArm, retail: AzureRetailPrices, priority: str, usd: float
) -> None:
    price = provider(arm, retail, priority).hourly_price()
    assert price is not None and (price.usd, price.source) == (usd, "azure:retail-prices")
    assert len(retail.requests) == 5  # five eastus Consumption meters, one a page: all read
    first = retail.requests[0]
    assert "armSkuName+eq+%27Standard_D4s_v5%27" in first
    assert "armRegionName+eq+%27eastus%27" in first and "priceType+eq+%27Consumption%27" in first


def test_a_next_page_elsewhere_is_refused_and_the_price_unknown(
    arm: FakeArm, retail: AzureRetailPrices, caplog: pytest.LogCaptureFixture
) -> None:
    retail.next_page_origin = "http://198.51.100.1:9"
    group = provider(arm, retail, "Spot")
    with pytest.raises(ProviderError, match="a next page outside"):
        group.hourly_price()
    book = PriceBook([group], {})
    book.read_due()
    assert book.price("workers") is None
    assert "group workers: its price could not be read" in caplog.text


def test_an_unreachable_api_is_a_one_line_provider_error(arm: FakeArm) -> None:
    arm.add_scale_set("workers", vm_size=SIZE, location="eastus")
    group = AzureProvider(
        "workers",
        resource_group="rg",
        subscription=arm.subscription,
        endpoint=arm.url,
        retail_prices_url="http://127.0.0.1:9/api/retail/prices",
    )
    with pytest.raises(ProviderError, match=r"^azure retail prices: ") as raised:
        group.hourly_price()
    assert "\n" not in str(raised.value)


def test_a_set_on_a_test_endpoint_asks_no_public_price(arm: FakeArm) -> None:
    arm.add_scale_set("workers", vm_size=SIZE, location="eastus")
    group = AzureProvider(
        "workers", resource_group="rg", subscription=arm.subscription, endpoint=arm.url
    )
    assert group.hourly_price() is None
