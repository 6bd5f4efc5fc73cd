"""What one VM of a scale set costs an hour, from the Azure Retail Prices API.

The API is unauthenticated REST (Azure Retail Prices overview,
https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices):
``GET https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview`` with
an OData ``$filter``, values case-sensitive from that version on; ``meterRegion=
'primary'`` keeps the primary meters only. The answer: ``{"BillingCurrency": "USD",
"Items": [...], "NextPageLink": URL or null, "Count": n}``; each item has
``retailPrice`` (USD), ``unitOfMeasure`` (``1 Hour``), ``type`` (``Consumption``,
``Reservation``, ``DevTestConsumption``), ``armRegionName``, ``armSkuName``,
``meterName``, ``skuName`` and ``productName``. A spot VM's meter has "Spot" in its
meterName and skuName ("D4s v5 Spot"); "Low Priority" meters are the retired batch
priority, and a Windows VM's product name ends in "Windows": both are left out.

Every read is bounded: a timeout per request, at most :data:`MAX_BYTES` per page, at
most :data:`MAX_PAGES` pages, and a NextPageLink is only followed to the same origin.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from spotring.providers.base import ProviderError

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
SOURCE = "azure:retail-prices"
TIMEOUT_S = 10.0
MAX_BYTES = 4 << 20
MAX_PAGES = 10


def vm_price(size: str, region: str, spot: bool, url: str = RETAIL_PRICES_URL) -> float | None:
    """USD per hour of one Linux VM of ``size`` (an ARM SKU name such as
    ``Standard_D4s_v5``) in ``region`` (``eastus``), spot or regular; the lowest if
    several primary meters match; None when none is listed. Raises
    :class:`ProviderError` (one line) when the API cannot be read."""
    query = {
        "api-version": API_VERSION,
        "meterRegion": "'primary'",
        "$filter": " and ".join(
            [
                "serviceName eq 'Virtual Machines'",
                f"armRegionName eq {_quoted(region)}",
                f"armSkuName eq {_quoted(size)}",
                "priceType eq 'Consumption'",
            ]
        ),
    }
    page_url: str | None = f"{url}?{urllib.parse.urlencode(query)}"
    prices = []
    for _ in range(MAX_PAGES):
        if page_url is None:
            break
        page = _get(page_url, url)
        prices += [float(i["retailPrice"]) for i in page.get("Items") or [] if _fits(i, spot)]
        page_url = page.get("NextPageLink") or None
    return min(prices) if prices else None


def _fits(item: dict[str, Any], spot: bool) -> bool:
    """Whether ``item`` is the hourly Linux meter of a spot (or a regular) VM."""
    names = f"{item.get('meterName', '')} {item.get('skuName', '')}"
    return (
        isinstance(item.get("retailPrice"), (int, float))
        and item.get("unitOfMeasure") == "1 Hour"
        and item.get("type", "Consumption") == "Consumption"
        and "Low Priority" not in names
        and not str(item.get("productName", "")).endswith("Windows")
        and ("Spot" in names) == spot
    )


def _quoted(value: str) -> str:
    """An OData string literal (a quote doubled)."""
    return "'" + value.replace("'", "''") + "'"


def _get(page_url: str, base: str) -> dict[str, Any]:
    """One page, bounded; only from ``base``'s origin."""
    if urllib.parse.urlsplit(page_url)[:2] != urllib.parse.urlsplit(base)[:2]:
        raise ProviderError(f"azure retail prices: a next page outside {base} refused")
    request = urllib.request.Request(page_url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            body = answer.read(MAX_BYTES + 1)
    except (urllib.error.URLError, OSError) as error:
        raise ProviderError(f"azure retail prices: {error}") from None
    if len(body) > MAX_BYTES:
        raise ProviderError(f"azure retail prices: a page over {MAX_BYTES} bytes refused")
    try:
        page = json.loads(body)
    except ValueError:
        raise ProviderError("azure retail prices: the answer is not JSON") from None
    if not isinstance(page, dict):
        raise ProviderError("azure retail prices: the answer is not a JSON object")
    return page
