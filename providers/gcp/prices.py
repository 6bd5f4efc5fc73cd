"""What one VM of a managed instance group costs an hour, from the Cloud Billing
Catalog API (google-cloud-billing's CloudCatalogClient).

Compute Engine bills a predefined machine type by its vCPUs and memory: price = vCPUs x
the family's Core SKU + GiB x its Ram SKU, each the SKU for the group's region, spot
("Spot Preemptible N2 Instance Core running in Americas", ``usageType``
``Preemptible``) or on-demand ("N2 Instance Core running in Americas", ``OnDemand``).
The machine type's vCPUs and memory come from machineTypes.get.

``services.skus.list`` (Cloud Billing Catalog API reference,
https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list): parent
``services/6F81-5844-456A`` (Compute Engine), up to 5,000 SKUs a page, ``nextPageToken``
until the last. A Sku has ``description``, ``category`` (``resourceFamily`` Compute,
``resourceGroup``, ``usageType``), ``serviceRegions`` and ``pricingInfo[]``, whose
``pricingExpression.tieredRates[]`` each have ``startUsageAmount`` and ``unitPrice``
(Money: ``units`` and ``nanos``) per ``usageUnit`` (``h`` for a core, ``GiBy.h`` for
memory). No IAM permission is needed: the catalog is public to any authenticated caller
("Before you begin": the Cloud Billing API enabled, an API key or OAuth token), with the
``cloud-billing.readonly`` (or ``cloud-platform``) scope.

Machine families whose SKUs are named otherwise (C2's "Compute optimized Core", custom
and sole-tenant types) have no price here: unknown, and ``--price`` gives one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from spotring.providers.base import ConfigurationError

COMPUTE_SERVICE = "services/6F81-5844-456A"
SOURCE = "gcp:cloudbilling.skus.list"
BILLING_SCOPE = "https://www.googleapis.com/auth/cloud-billing.readonly"
SKU_PAGE_SIZE = 5000
SKU_PAGES = 20
"""At most this many pages (100,000 SKUs) per reading."""

_SPOT_PREFIXES = ("Spot Preemptible ", "Preemptible ")
_NOT_PREDEFINED = ("Custom", "Sole Tenancy", "Extended", "Commitment", "Reserved")


def catalog_client(credentials: Any, endpoint: str | None) -> Any:
    """A REST CloudCatalogClient with ``credentials`` scoped for the catalog."""
    import google.auth.credentials
    from google.api_core.client_options import ClientOptions

    try:
        from google.cloud import billing_v1
    except ImportError:
        raise ConfigurationError(
            "the gcp provider reads prices with google-cloud-billing: pip install 'spotring[gcp]'"
        ) from None

    scoped = google.auth.credentials.with_scopes_if_required(credentials, [BILLING_SCOPE])
    options = ClientOptions(api_endpoint=endpoint.rstrip("/")) if endpoint else None
    return billing_v1.CloudCatalogClient(
        transport="rest", credentials=scoped, client_options=options
    )


def sku_pages(client: Any, timeout: float) -> Iterator[Iterable[Any]]:
    """The Compute Engine SKUs, page by page, at most :data:`SKU_PAGES` pages."""
    request = {"parent": COMPUTE_SERVICE, "page_size": SKU_PAGE_SIZE}
    pager = client.list_skus(request=request, timeout=timeout, retry=None)
    for number, page in enumerate(pager.pages):
        if number == SKU_PAGES:
            return
        yield page.skus


def machine_price(
    pages: Iterable[Iterable[Any]], family: str, region: str, spot: bool, vcpus: int, gib: float
) -> float | None:
    """USD per hour of a predefined machine of ``family`` (``n2``) with ``vcpus`` and
    ``gib`` in ``region``: vCPUs x core + GiB x ram; None unless both SKUs are listed."""
    core = ram = None
    for page in pages:
        for sku in page:
            kind = _resource(sku, family.upper(), region, spot)
            if kind == "Core" and core is None:
                core = _hourly(sku)
            elif kind == "Ram" and ram is None:
                ram = _hourly(sku)
            if core is not None and ram is not None:
                return vcpus * core + gib * ram
    return None


def _resource(sku: Any, family: str, region: str, spot: bool) -> str | None:
    """ "Core" or "Ram" when ``sku`` prices that of ``family`` in ``region``, else None."""
    category = sku.category
    if category.resource_family != "Compute" or region not in sku.service_regions:
        return None
    if category.usage_type != ("Preemptible" if spot else "OnDemand"):
        return None
    description: str = sku.description
    if spot:
        prefix = next((p for p in _SPOT_PREFIXES if description.startswith(p)), None)
        if prefix is None:
            return None
        description = description[len(prefix) :]
    if not description.startswith(f"{family} ") or any(w in description for w in _NOT_PREDEFINED):
        return None
    for kind in ("Core", "Ram"):
        if f"Instance {kind} " in description:
            return kind
    return None


def _hourly(sku: Any) -> float | None:
    """The first tier's unit price (from zero usage) of the SKU's current pricing."""
    for info in sku.pricing_info[:1]:
        for rate in info.pricing_expression.tiered_rates:
            if rate.start_usage_amount == 0:
                money = rate.unit_price
                return int(money.units) + money.nanos / 1e9
    return None
