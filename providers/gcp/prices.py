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

The SKUs' descriptions (services.skus.list's ``description``, as Google's SKU explorer
https://cloud.google.com/skus lists Compute Engine's, 6F81-5844-456A; the C2 and custom
names as public tools that parse the catalog's answers match them), ``{loc}`` the
location ("Americas", "Paris", ...), and spot's the same with "Spot Preemptible "
(older SKUs: "Preemptible ") before them:

* a predefined type of a family: "N2 Instance Core running in {loc}", "N1 Predefined
  Instance Ram running in {loc}", "N2D AMD Instance Core running in {loc}";
* C2, named by its family's kind rather than its name: "Compute optimized Core running
  in {loc}", "Compute optimized Ram running in {loc}";
* custom machine types (``n2-custom-4-16384``): "N2 Custom Instance Core running in
  {loc}", "N2D AMD Custom Instance Ram running in {loc}"; N1's (``custom-4-16384``):
  "Custom Instance Core running in {loc}", "Custom Instance Ram running in {loc}".

No price here (unknown: ``--price`` gives one) for a custom type with extended memory
(``-ext``: its memory beyond the family's per-vCPU limit is billed at the "Custom
Extended Instance Ram" SKU, a split this module does not make) and for sole-tenant
nodes (billed per node, not per VM: out of scope), nor for E2's shared-core custom types
(``e2-custom-micro-...``: a fraction of a core).
"""

from __future__ import annotations

import re
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
_KIND = r"(?P<kind>Core|Ram) running in "
_SHARED_CORE = {"micro", "small", "medium"}


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
    pages: Iterable[Iterable[Any]],
    machine_type: str,
    region: str,
    spot: bool,
    vcpus: int,
    gib: float,
) -> float | None:
    """USD per hour of a machine of ``machine_type`` (``n2-standard-4``,
    ``n2-custom-4-16384``) with ``vcpus`` and ``gib`` in ``region``: vCPUs x core + GiB
    x ram; None unless both SKUs are listed (or the type's SKUs are not known here)."""
    pattern = sku_description(machine_type)
    if pattern is None:
        return None
    core = ram = None
    for page in pages:
        for sku in page:
            kind = _resource(sku, pattern, region, spot)
            if kind == "Core" and core is None:
                core = _hourly(sku)
            elif kind == "Ram" and ram is None:
                ram = _hourly(sku)
            if core is not None and ram is not None:
                return vcpus * core + gib * ram
    return None


def sku_description(machine_type: str) -> re.Pattern[str] | None:
    """The on-demand description of the machine type's Core and Ram SKUs, as a pattern
    whose group ``kind`` is "Core" or "Ram" (the names: the module's docstring); None
    for a custom type with extended memory or of shared cores (``e2-custom-micro-...``)."""
    parts = machine_type.split("-")
    family = parts[0]
    if parts[-1] == "ext" or _SHARED_CORE & set(parts):
        return None
    if family == "custom":  # N1's custom types
        return re.compile(f"Custom Instance {_KIND}")
    if "custom" in parts:
        return re.compile(rf"{re.escape(family.upper())} (?:\S+ )*?Custom Instance {_KIND}")
    if family == "c2":
        return re.compile(f"Compute optimized {_KIND}")
    excluded = "|".join(_NOT_PREDEFINED)
    return re.compile(
        rf"{re.escape(family.upper())} (?!.*(?:{excluded}))(?:\S+ )*?Instance {_KIND}"
    )


def _resource(sku: Any, pattern: re.Pattern[str], region: str, spot: bool) -> str | None:
    """ "Core" or "Ram" when ``sku`` prices that of the machine type whose on-demand
    description ``pattern`` matches, in ``region``, spot or not; else None."""
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
    match = pattern.match(description)
    return None if match is None else match.group("kind")


def _hourly(sku: Any) -> float | None:
    """The first tier's unit price (from zero usage) of the SKU's current pricing."""
    for info in sku.pricing_info[:1]:
        for rate in info.pricing_expression.tiered_rates:
            if rate.start_usage_amount == 0:
                money = rate.unit_price
                return int(money.units) + money.nanos / 1e9
    return None
