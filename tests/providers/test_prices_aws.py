"""The AWS provider's price of a member-hour: spot from DescribeSpotPriceHistory (moto),
on-demand from the Price List query API (a fake GetProducts, which moto lacks)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from spotring.core.prices import PriceBook
from spotring.providers.aws import prices
from tests.fakes.aws import REGION, boto_session, capture_params
from tests.fakes.prices import AwsPriceList, ec2_product
from tests.providers.test_aws_capacity import _mixed_group, _template_group
from tests.providers.test_aws_provider import aws_env, make_provider, moto

__all__ = ["aws_env", "moto"]  # fixtures, used by name


@pytest.fixture
def price_list() -> Iterator[AwsPriceList]:
    products = [
        ec2_product("t3.micro", "eu-west-1", "0.0114"),  # another region
        ec2_product("t3.micro", REGION, "0.0104", capacitystatus="UnusedCapacityReservation"),
        ec2_product("t3.micro", REGION, "0.0300", operating_system="Windows"),
        ec2_product("t3.micro", REGION, "0.0104", with_on_demand=False),  # Reserved terms only
        ec2_product("t3.micro", REGION, "0.0104"),
    ]
    with AwsPriceList(products, page_size=1) as fake:
        yield fake


def pricing_client(fake: AwsPriceList) -> Any:
    return boto_session().client("pricing", region_name="us-east-1", endpoint_url=fake.url)


def test_a_spot_groups_price_is_its_pools_newest_spot_price(moto: None) -> None:
    _template_group("spot", {"MarketType": "spot"})
    provider = make_provider("spot")
    params = capture_params(provider.ec2, "DescribeSpotPriceHistory")
    price = provider.hourly_price()
    assert price is not None
    assert (price.usd, price.source) == (0.00001, "aws:DescribeSpotPriceHistory")  # moto's
    assert params[0]["InstanceTypes"] == ["t3.micro"]
    assert params[0]["Filters"] == [{"Name": "availability-zone", "Values": [f"{REGION}a"]}]


def test_an_on_demand_groups_price_comes_from_the_price_list(
    moto: None, price_list: AwsPriceList
) -> None:
    _template_group("od", None)
    provider = make_provider("od", pricing=pricing_client(price_list))
    price = provider.hourly_price()
    assert price is not None
    assert (price.usd, price.source) == (0.0104, "aws:pricing:GetProducts")
    filters = {f["Field"]: f["Value"] for f in price_list.requests[0]["Filters"]}
    assert filters == {
        "instanceType": "t3.micro",
        "regionCode": REGION,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    assert price_list.requests[0]["ServiceCode"] == "AmazonEC2"


def test_a_mixed_groups_types_are_its_overrides(moto: None, price_list: AwsPriceList) -> None:
    _mixed_group("mixed", {"OnDemandPercentageAboveBaseCapacity": 100})
    provider = make_provider("mixed", pricing=pricing_client(price_list))
    assert provider.hourly_price().usd == 0.0104  # type: ignore[union-attr]


def test_a_price_that_cannot_be_read_is_unknown_not_a_failure(
    moto: None, price_list: AwsPriceList, caplog: pytest.LogCaptureFixture
) -> None:
    _template_group("od", None)
    price_list.denied = True
    provider = make_provider("od", pricing=pricing_client(price_list))
    book = PriceBook([provider], {}, refresh_s=3600.0)
    book.read_due()
    book.read_due()
    assert book.price("od") is None
    assert len(price_list.requests) == 1  # not asked again before the refresh
    assert "group od: its price could not be read" in caplog.text
    assert "pricing:GetProducts" in caplog.text


def test_the_spot_statistic_is_the_median_of_the_pools_newest_prices() -> None:
    def at(hour: int) -> datetime:
        return datetime(2026, 11, 28, hour, tzinfo=timezone.utc)

    history = [
        {"InstanceType": "a", "AvailabilityZone": "z1", "SpotPrice": "0.50", "Timestamp": at(1)},
        {"InstanceType": "a", "AvailabilityZone": "z1", "SpotPrice": "0.10", "Timestamp": at(2)},
        {"InstanceType": "a", "AvailabilityZone": "z2", "SpotPrice": "0.20", "Timestamp": at(1)},
        {"InstanceType": "b", "AvailabilityZone": "z1", "SpotPrice": "9.00", "Timestamp": at(1)},
    ]
    pages = [{"SpotPriceHistory": history[:2], "NextToken": "n"}, {"SpotPriceHistory": history[2:]}]

    def call(client: object, operation: str, **params: object) -> dict[str, Any]:
        assert operation == "DescribeSpotPriceHistory"
        return pages.pop(0)

    assert prices.spot_price(call, None, ["a", "b"], ["z1", "z2"]) == 0.20
