"""What one member of an Auto Scaling group costs an hour: the spot price from EC2's
spot price history, the on-demand price from the Price List query API.

The instance types are the group's configuration's (a mixed instances policy's
overrides, else its launch template's ``InstanceType``), the zones its
``AvailabilityZones``. Each (instance type, zone) is a spot pool with its own price;
the group's price is the median of the pools' newest prices: the allocation strategies
(price-capacity-optimized, capacity-optimized) spread launches by capacity, not price,
so the cheapest pool understates what members pay and the dearest overstates it, and
the median is robust to one odd pool where the mean is not.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from spotring.providers.aws.client import ApiCall

SPOT_SOURCE = "aws:DescribeSpotPriceHistory"
ON_DEMAND_SOURCE = "aws:pricing:GetProducts"

PRICING_REGION = "us-east-1"
"""The Price List query API's endpoint region (AWS Price List API, "Using the query
API": endpoints in us-east-1, eu-central-1 and ap-south-1; prices are the same)."""

LINUX_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
"""DescribeSpotPriceHistory ``ProductDescriptions`` of a Linux instance (API reference:
"Linux/UNIX | ... | Linux/UNIX (Amazon VPC) | ...", EC2-Classic's and a VPC's)."""

SPOT_HISTORY_PAGES = 10
"""At most this many pages of spot price history (1,000 records each) per reading."""

PRICE_LIST_PAGES = 5
"""At most this many pages of Price List products per instance type and reading."""


def launch_types(template_data: Mapping[str, Any] | None, record: Mapping[str, Any]) -> list[str]:
    """The instance types the group (its DescribeAutoScalingGroups ``record``) launches:
    its mixed instances policy's ``LaunchTemplate.Overrides[].InstanceType`` (API_
    LaunchTemplateOverrides: optional; an override may give ``InstanceRequirements``
    instead), else its launch template version's ``InstanceType`` (``template_data``,
    API_ResponseLaunchTemplateData: optional)."""
    mixed = record.get("MixedInstancesPolicy") or {}
    overrides = (mixed.get("LaunchTemplate") or {}).get("Overrides") or []
    types = [o["InstanceType"] for o in overrides if o.get("InstanceType")]
    if not types and template_data and template_data.get("InstanceType"):
        types = [template_data["InstanceType"]]
    return sorted(set(types))


def spot_price(call: ApiCall, ec2: Any, types: Sequence[str], zones: Sequence[str]) -> float | None:
    """The median of the newest spot price of each (type, zone) pool; None when EC2
    lists none.

    DescribeSpotPriceHistory with StartTime = EndTime = now: "it also returns the last
    price change before the start time, which is the effective price as of the start
    time" (EC2 API reference). Each SpotPrice record has AvailabilityZone, InstanceType,
    ProductDescription, SpotPrice (a string, USD per hour) and Timestamp; the answer
    pages with NextToken.
    """
    now = datetime.now(timezone.utc)
    request: dict[str, Any] = {
        "InstanceTypes": list(types),
        "ProductDescriptions": list(LINUX_PRODUCTS),
        "StartTime": now,
        "EndTime": now,
        "MaxResults": 1000,
    }
    if zones:
        request["Filters"] = [{"Name": "availability-zone", "Values": list(zones)}]
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for _ in range(SPOT_HISTORY_PAGES):
        page = call(ec2, "DescribeSpotPriceHistory", **request)
        for record in page.get("SpotPriceHistory") or []:
            pool = (record.get("InstanceType", ""), record.get("AvailabilityZone", ""))
            at, price = record.get("Timestamp") or now, _usd(record.get("SpotPrice"))
            if price is not None and (pool not in newest or at > newest[pool][0]):
                newest[pool] = (at, price)
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    return statistics.median(p for _, p in newest.values()) if newest else None


def on_demand_price(call: ApiCall, pricing: Any, types: Sequence[str], region: str) -> float | None:
    """The median of the types' on-demand Linux prices in ``region``; None when the
    Price List lists none.

    GetProducts (Price List query API, ServiceCode ``AmazonEC2``) with TERM_MATCH
    filters on instanceType, regionCode, operatingSystem Linux, tenancy Shared,
    preInstalledSw NA and capacitystatus Used (a running instance's own price, not a
    capacity reservation's); the lowest if several products still match (a license
    variant). ``PriceList`` is a list of JSON strings, each a product:
    ``terms.OnDemand.{offer}.priceDimensions.{rate}`` with ``unit`` ``Hrs`` and
    ``pricePerUnit.USD`` (a string).
    """
    prices = []
    for instance_type in types:
        filters = {
            "instanceType": instance_type,
            "regionCode": region,
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
        }
        request: dict[str, Any] = {
            "ServiceCode": "AmazonEC2",
            "FormatVersion": "aws_v1",
            "Filters": [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
            "MaxResults": 100,
        }
        found: list[float] = []
        for _ in range(PRICE_LIST_PAGES):
            page = call(pricing, "GetProducts", **request)
            found += [p for item in page.get("PriceList") or [] if (p := _hourly(item))]
            if not page.get("NextToken"):
                break
            request["NextToken"] = page["NextToken"]
        if found:
            prices.append(min(found))
    return statistics.median(prices) if prices else None


def _hourly(item: str | Mapping[str, Any]) -> float | None:
    """A product's on-demand USD per hour; None when it has none (a product may have
    only Reserved terms)."""
    product = json.loads(item) if isinstance(item, str) else item
    for offer in ((product.get("terms") or {}).get("OnDemand") or {}).values():
        for dimension in (offer.get("priceDimensions") or {}).values():
            usd = _usd((dimension.get("pricePerUnit") or {}).get("USD"))
            if dimension.get("unit") == "Hrs" and usd:
                return usd
    return None


def _usd(text: object) -> float | None:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
