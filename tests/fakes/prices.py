"""Fake price APIs on loopback, shaped as each cloud documents its answer.

- :class:`AwsPriceList`: the AWS Price List query API's ``GetProducts`` (moto 5.2 does
  not implement the ``pricing`` service). JSON 1.1 protocol: ``POST /`` with
  ``X-Amz-Target: AWSPriceListService.GetProducts``; the answer's ``PriceList`` is a
  list of JSON strings, one product each, paged with ``NextToken`` (API_pricing_
  GetProducts: "PriceList: The list of products that match your filters. The list
  contains both the product metadata and the price information"; type "Array of
  strings", each a JSON document).
- :class:`AzureRetailPrices`: the Azure Retail Prices API (unauthenticated REST).
- :class:`GcpBillingCatalog`: the Cloud Billing Catalog API's ``services.skus.list``.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from spotring.providers.loopback_http import LoopbackHandler, LoopbackHTTPServer


def ec2_product(
    instance_type: str,
    region: str,
    usd_per_hour: str,
    *,
    capacitystatus: str = "Used",
    operating_system: str = "Linux",
    with_on_demand: bool = True,
) -> dict[str, Any]:
    """One AmazonEC2 product of the Price List (the offer file's documented shape:
    ``product.attributes`` and ``terms.OnDemand.{sku}.{offer}.priceDimensions``; a
    product of Reserved terms only has no ``OnDemand``)."""
    sku = f"SKU{abs(hash((instance_type, region, capacitystatus, operating_system))) % 10**8}"
    terms: dict[str, Any] = {
        "Reserved": {
            f"{sku}.4NA7Y494T4": {
                "priceDimensions": {
                    f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                        "unit": "Quantity",
                        "pricePerUnit": {"USD": "100"},
                        "description": "Upfront Fee",
                    }
                },
                "sku": sku,
                "termAttributes": {"LeaseContractLength": "1yr"},
            }
        }
    }
    if with_on_demand:
        terms["OnDemand"] = {
            f"{sku}.JRTCKXETXF": {
                "priceDimensions": {
                    f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                        "unit": "Hrs",
                        "endRange": "Inf",
                        "description": f"${usd_per_hour} per On Demand Linux {instance_type}",
                        "appliesTo": [],
                        "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                        "beginRange": "0",
                        "pricePerUnit": {"USD": usd_per_hour},
                    }
                },
                "sku": sku,
                "effectiveDate": "2026-11-01T00:00:00Z",
                "offerTermCode": "JRTCKXETXF",
                "termAttributes": {},
            }
        }
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": instance_type,
                "regionCode": region,
                "operatingSystem": operating_system,
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": capacitystatus,
                "servicecode": "AmazonEC2",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": terms,
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z",
    }


class _AwsHandler(LoopbackHandler):
    def do_POST(self) -> None:
        fake: AwsPriceList = self.server.owner
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        status, answer = fake.answer(self.headers.get("X-Amz-Target", ""), body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class AwsPriceList(LoopbackHTTPServer):
    """``GetProducts`` over ``products``, ``page_size`` products a page."""

    handler_class = _AwsHandler
    thread_name = "fake-aws-pricing"

    def __init__(self, products: list[Mapping[str, Any]], page_size: int = 1) -> None:
        self.products = products
        self.page_size = page_size
        self.requests: list[dict[str, Any]] = []
        self.denied = False
        self._lock = threading.Lock()

    def answer(self, target: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(dict(body))
        if target != "AWSPriceListService.GetProducts":
            return 400, {"__type": "UnknownOperationException"}
        if self.denied:
            return 400, {"__type": "AccessDeniedException", "Message": "not authorized"}
        wanted = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        matching = [
            p
            for p in self.products
            if all(p["product"]["attributes"].get(k) == v for k, v in wanted.items())
        ]
        start = int(body.get("NextToken") or 0)
        end = start + min(self.page_size, int(body.get("MaxResults") or 100))
        answer: dict[str, Any] = {
            "FormatVersion": "aws_v1",
            "PriceList": [json.dumps(p) for p in matching[start:end]],
        }
        if end < len(matching):
            answer["NextToken"] = str(end)
        return 200, answer


# ----------------------------------------------------------- Azure Retail Prices
#
# Azure Retail Prices overview (learn.microsoft.com/rest/api/cost-management/retail-
# prices/azure-retail-prices): GET /api/retail/prices with api-version, an OData $filter
# (values case-sensitive from 2023-01-01-preview), meterRegion='primary'; the answer is
# {"BillingCurrency", "CustomerEntityId", "CustomerEntityType", "Items", "NextPageLink",
# "Count"}, NextPageLink an absolute URL with $skip, null on the last page. Optional
# item fields (reservationTerm, savingsPlan) are left out where they do not apply.


def vm_meter(
    sku: str,
    region: str,
    usd: float,
    *,
    kind: str = "",
    windows: bool = False,
    price_type: str = "Consumption",
) -> dict[str, Any]:
    """A Virtual Machines meter item; ``kind`` "", "Spot" or "Low Priority"."""
    short = sku.removeprefix("Standard_").replace("_", " ")
    name = f"{short} {kind}".strip()
    series = "Virtual Machines " + short.split()[0] + " Series" + (" Windows" if windows else "")
    return {
        "currencyCode": "USD",
        "tierMinimumUnits": 0.0,
        "retailPrice": usd,
        "unitPrice": usd,
        "armRegionName": region,
        "location": region,
        "effectiveStartDate": "2026-11-01T00:00:00Z",
        "meterId": f"meter-{sku}-{region}-{kind}-{windows}-{price_type}",
        "meterName": name,
        "productId": "DZH318Z0BQ4L",
        "skuId": "DZH318Z0BQ4L/00TG",
        "productName": series,
        "skuName": name,
        "serviceName": "Virtual Machines",
        "serviceId": "DZH313Z7MMC8",
        "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour",
        "type": price_type,
        "isPrimaryMeterRegion": True,
        "armSkuName": sku,
    }


class _AzureHandler(LoopbackHandler):
    def do_GET(self) -> None:
        fake: AzureRetailPrices = self.server.owner
        status, answer = fake.answer(self.path)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class AzureRetailPrices(LoopbackHTTPServer):
    """The Retail Prices API over ``items``, ``page_size`` a page; ``api_url`` is what
    the provider is given."""

    handler_class = _AzureHandler
    thread_name = "fake-azure-retail-prices"

    def __init__(self, items: list[dict[str, Any]], page_size: int = 2) -> None:
        self.items = items
        self.page_size = page_size
        self.requests: list[str] = []
        self.next_page_origin: str | None = None  # a NextPageLink elsewhere, if set

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/retail/prices"

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        split = urllib.parse.urlsplit(path)
        query = dict(urllib.parse.parse_qsl(split.query))
        if split.path != "/api/retail/prices":
            return 404, {"Error": {"Code": "NotFound", "Message": split.path}}
        wanted = dict(re.findall(r"(\w+) eq '((?:[^']|'')*)'", query.get("$filter", "")))
        items = [
            i
            for i in self.items
            if all(
                str(i.get("type" if k == "priceType" else k)) == v.replace("''", "'")
                for k, v in wanted.items()
            )
        ]
        skip = int(query.get("$skip", 0))
        page = items[skip : skip + self.page_size]
        next_link = None
        if skip + self.page_size < len(items):
            query["$skip"] = str(skip + self.page_size)
            origin = self.next_page_origin or self.url
            next_link = f"{origin}{split.path}?{urllib.parse.urlencode(query)}"
        return 200, {
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": page,
            "NextPageLink": next_link,
            "Count": len(page),
        }


# --------------------------------------------------------- Cloud Billing Catalog
#
# services.skus.list (cloud.google.com/billing/docs/reference/rest/v1/services.skus/
# list): GET /v1/services/{service}/skus, pageSize (at most 5,000) and pageToken;
# {"skus": [...], "nextPageToken": ""} with an empty token on the last page. Answers are
# built from google-cloud-billing's own message types, so field names match the API.
# machineTypes.get (compute/docs/reference/rest/v1/machineTypes/get) answers guestCpus
# and memoryMb; the front answers it and hands every other request to ``upstream`` (the
# Compute fake, tests/fakes/gcp.py), so the provider keeps one Compute endpoint.

COMPUTE_SERVICE = "services/6F81-5844-456A"


def compute_sku(
    description: str, region: str, usd: float, *, usage: str = "OnDemand", unit: str = "h"
) -> Any:
    """A Compute Engine SKU (billing_v1.Sku) with one tier from zero usage."""
    from google.cloud import billing_v1
    from google.type import money_pb2

    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return billing_v1.Sku(
        name=f"{COMPUTE_SERVICE}/skus/{abs(hash((description, region))) % 10**12:012X}",
        sku_id=f"{abs(hash((description, region))) % 10**12:012X}",
        description=description,
        category=billing_v1.Category(
            service_display_name="Compute Engine",
            resource_family="Compute",
            resource_group="N2Standard",
            usage_type=usage,
        ),
        service_regions=[region],
        pricing_info=[
            billing_v1.PricingInfo(
                summary="",
                pricing_expression=billing_v1.PricingExpression(
                    usage_unit=unit,
                    display_quantity=1,
                    tiered_rates=[
                        billing_v1.PricingExpression.TierRate(
                            start_usage_amount=0,
                            unit_price=money_pb2.Money(
                                currency_code="USD", units=units, nanos=nanos
                            ),
                        )
                    ],
                ),
                currency_conversion_rate=1,
            )
        ],
        service_provider_name="Google",
    )


class _GcpHandler(LoopbackHandler):
    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        fake: GcpPrices = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        status, headers, data = fake.answer(self.command, self.path, dict(self.headers), body)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class GcpPrices(LoopbackHTTPServer):
    """The Billing Catalog over ``skus`` (``page_size`` a page) and machineTypes.get
    over ``machine_types`` (name -> (vCPUs, MiB)), in front of ``upstream``."""

    handler_class = _GcpHandler
    thread_name = "fake-gcp-prices"

    def __init__(
        self,
        skus: list[Any],
        machine_types: dict[str, tuple[int, int]],
        upstream: str,
        page_size: int = 2,
    ) -> None:
        self.skus = skus
        self.machine_types = machine_types
        self.upstream = upstream
        self.page_size = page_size
        self.requests: list[str] = []

    def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, dict[str, str], bytes]:
        from google.cloud import billing_v1, compute_v1

        split = urllib.parse.urlsplit(path)
        query = dict(urllib.parse.parse_qsl(split.query))
        json_type = {"Content-Type": "application/json"}
        if split.path == f"/v1/{COMPUTE_SERVICE}/skus":
            self.requests.append(path)
            start = int(query.get("pageToken") or 0)
            end = start + min(self.page_size, int(query.get("pageSize") or 5000))
            page = billing_v1.ListSkusResponse(
                skus=self.skus[start:end],
                next_page_token=str(end) if end < len(self.skus) else "",
            )
            return 200, json_type, billing_v1.ListSkusResponse.to_json(page).encode()
        machine = re.fullmatch(
            r"/compute/v1/projects/[^/]+/zones/([^/]+)/machineTypes/([^/]+)", split.path
        )
        if machine:
            self.requests.append(path)
            zone, name = machine.groups()
            if name not in self.machine_types:
                error = {"error": {"code": 404, "message": f"machine type {name} not found"}}
                return 404, json_type, json.dumps(error).encode()
            cpus, memory_mb = self.machine_types[name]
            found = compute_v1.MachineType(
                name=name,
                zone=zone,
                guest_cpus=cpus,
                memory_mb=memory_mb,
                kind="compute#machineType",
            )
            return 200, json_type, compute_v1.MachineType.to_json(found).encode()
        kept = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        forwarded = urllib.request.Request(
            self.upstream + path, data=body, method=method, headers=kept
        )
        try:
            with urllib.request.urlopen(forwarded, timeout=30) as answer:
                return (
                    answer.status,
                    {"Content-Type": answer.headers["Content-Type"]},
                    answer.read(),
                )
        except urllib.error.HTTPError as error:
            return error.code, {"Content-Type": error.headers["Content-Type"]}, error.read()
