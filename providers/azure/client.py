"""The management clients, made (options, credential, a sovereign cloud's token scope, a
loopback test server) and shared by the scale sets of a job, and :class:`ScaleSetApi`,
the calls about one set: each page of a list, the VM list read as plain JSON, an
operation's status, deletes and capacity changes, each through the provider's
``call_api`` (retries, counting, error translation)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

from spotring.providers.azure.answers import Member, json_object
from spotring.providers.base import ConfigurationError
from spotring.providers.cloud import MalformedAnswer, check_endpoint

T = TypeVar("T")

DEFAULT_ENDPOINT = "https://management.azure.com"
"""Azure Resource Manager of the public cloud (``--endpoint`` names another)."""

CONNECTION_TIMEOUT = 5.0
READ_TIMEOUT = 20.0
"""Seconds; a stuck call must not hold the controller thread for azure-core's 300 s."""

COMPUTE_API_VERSION = "2024-07-01"
"""Of the VM lists spotring reads as plain JSON (the SDK's models cost too much CPU)."""


class SharedClients:
    """The management clients, shared by the providers of one job's scale sets and
    closed when the last of them closes."""

    def __init__(self, compute: Any, network: Any) -> None:
        self.compute = compute
        self.network = network
        self._users = 0

    def share(self) -> SharedClients:
        """Count one more provider using the clients."""
        self._users += 1
        return self

    def release(self) -> None:
        """One provider is done with the clients; the last closes them."""
        self._users -= 1
        if self._users <= 0:
            for client in (self.compute, self.network):
                client.close()


class CallApi(Protocol):
    """``CloudGroupProvider.call_api``: one call, retried, counted, its failure translated."""

    def __call__(self, call_name: str, call: Callable[[], T], /) -> T: ...


def make_clients(
    credential: Any | None, endpoint: str | None, subscription: str
) -> tuple[Any, Any]:
    """The compute and network management clients of ``subscription`` at ``endpoint``
    (default: the public cloud's Resource Manager)."""
    try:
        from azure.mgmt.compute import ComputeManagementClient
        from azure.mgmt.network import NetworkManagementClient
    except ImportError:
        raise ConfigurationError(
            "the azure provider needs azure-mgmt-compute, azure-mgmt-network and"
            " azure-identity: pip install 'spotring[azure]'"
        ) from None
    options = client_options(endpoint)
    if "authentication_policy" in options:  # a loopback test server: no token
        credential = credential or _NoCredential()
    if credential is None:
        credential = _default_credential()
    return (
        ComputeManagementClient(credential, subscription, **options),
        NetworkManagementClient(credential, subscription, **options),
    )


def client_options(endpoint: str | None) -> dict[str, Any]:
    """Keyword arguments for the management clients talking to ``endpoint``.

    An https endpoint (a sovereign cloud's Resource Manager) also sets the token scope,
    which the clients would otherwise leave at the public cloud's. A plain-http one is
    accepted only on loopback (a test server) and gets an authentication policy that
    adds nothing: azure-core refuses to send a bearer token over plain HTTP.
    """
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    options: dict[str, Any] = {
        # Our retries (counted, --max-api-attempts, Retry-After) replace azure-core's.
        "retry_total": 0,
        "connection_timeout": CONNECTION_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
    }
    if not endpoint:
        return options
    if check_endpoint(endpoint):
        options["authentication_policy"] = SansIOHTTPPolicy()
    else:
        options["credential_scopes"] = [f"https://{urlsplit(endpoint).netloc}/.default"]
    options["base_url"] = endpoint.rstrip("/")
    return options


class _NoCredential:
    """The credential of a loopback test server: the SDK wants one, nothing asks it."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.exceptions import ClientAuthenticationError

        raise ClientAuthenticationError("no credentials are sent to a plain-http endpoint")


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            "the azure provider needs azure-identity: pip install 'spotring[azure]'"
        ) from None
    # On failure it logs every credential it tried, over many lines; spotring says
    # it in one (see errors.translate_arm_error).
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    # No browser prompt: spotring runs unattended.
    return DefaultAzureCredential(exclude_interactive_browser_credential=True)


def credential_source() -> str | None:
    """Where DefaultAzureCredential would find credentials: a service principal in
    the environment, the Azure CLI's login, or a managed identity."""
    if os.environ.get("AZURE_CLIENT_ID") and os.environ.get("AZURE_TENANT_ID"):
        return "found (AZURE_CLIENT_ID / AZURE_TENANT_ID environment)"
    if (Path.home() / ".azure" / "msal_token_cache.json").is_file():
        return "found (Azure CLI login)"
    if os.environ.get("IDENTITY_ENDPOINT") or os.environ.get("MSI_ENDPOINT"):
        return "found (managed identity)"
    return None


def same_origin(url: str, endpoint: str | None) -> bool:
    """Whether ``url`` is on the Resource Manager at ``endpoint`` (default: the public
    cloud's): only there may the credentials' token go."""
    base = urlsplit(endpoint or DEFAULT_ENDPOINT)
    given = urlsplit(url)
    return (given.scheme, given.netloc.lower()) == (base.scheme, base.netloc.lower())


def _pages(call_api: CallApi, call_name: str, make_pager: Callable[[], Any]) -> list[Any]:
    """Every item of a paged list, one retried call per page."""
    items: list[Any] = []
    token: str | None = None

    def fetch_page() -> tuple[list[Any], str | None]:
        pages = make_pager().by_page(continuation_token=token)
        page = list(next(pages, []))
        return page, pages.continuation_token

    while True:
        page, token = call_api(call_name, fetch_page)
        items.extend(page)
        if not token:
            return items


def _json_pages(
    call_api: CallApi, compute: Any, call_name: str, path: str, params: dict[str, str]
) -> list[dict]:
    """Every item of a paged ARM list as plain JSON, one retried call per page.

    For the VM list, the bulk of every refresh: azure-mgmt-compute building its
    models from it costs about ten times the request itself. The request still
    goes through the client's pipeline (credentials, timeouts, policies).
    """
    from azure.core.exceptions import HttpResponseError
    from azure.core.rest import HttpRequest
    from azure.mgmt.core.exceptions import ARMErrorFormat

    items: list[dict] = []
    request = HttpRequest("GET", path, params={"api-version": COMPUTE_API_VERSION, **params})
    while True:

        def fetch(request: HttpRequest = request) -> dict[str, Any]:
            response = compute.send_request(request)
            if response.status_code != 200:
                raise HttpResponseError(response=response, error_format=ARMErrorFormat)
            page = response.json()
            if not isinstance(page, dict) or not isinstance(page.get("value"), list):
                # ARM always sends "value", if only [] for an empty set.
                raise MalformedAnswer(call_name, "a page without its value list")
            return page

        page = call_api(call_name, fetch)
        items.extend(item for item in page["value"] if isinstance(item, dict))
        next_link = page.get("nextLink")
        if not next_link:
            return items
        request = HttpRequest("GET", str(next_link))


def _operation_status(compute: Any, url: str) -> Mapping[str, Any]:
    """The status document of a long-running operation at ``url`` (one request; a
    404, the operation expired, reads as ``Canceled``)."""
    from azure.core.exceptions import HttpResponseError
    from azure.core.rest import HttpRequest
    from azure.mgmt.core.exceptions import ARMErrorFormat

    response = compute.send_request(HttpRequest("GET", url))
    if response.status_code == 404:
        return {"status": "Canceled"}  # expired: nothing more to learn
    if response.status_code != 200:
        raise HttpResponseError(response=response, error_format=ARMErrorFormat)
    return json_object(response.json())


def vm_list_call(flexible: bool) -> str:
    """The call that lists a set's VMs: a Flexible set's are the resource group's VMs."""
    return "virtualMachines.list" if flexible else "virtualMachineScaleSetVMs.list"


class ScaleSetApi:
    """The calls about one scale set: each made through ``call_api`` (so retried,
    counted and its failure translated), every page followed. Long-running operations
    are started, never waited on."""

    def __init__(
        self,
        clients: SharedClients,
        call_api: CallApi,
        *,
        subscription: str,
        resource_group: str,
        name: str,
    ) -> None:
        self._compute, self._network = clients.compute, clients.network
        self._call_api = call_api
        self.subscription = subscription
        self.resource_group = resource_group
        self.name = name

    def get(self) -> Any:
        """The scale set (azure-mgmt-compute's model): capacity, mode, spot settings."""

        def get() -> Any:
            found = self._compute.virtual_machine_scale_sets.get(self.resource_group, self.name)
            if not all(getattr(found, name, None) for name in ("id", "location", "properties")):
                raise MalformedAnswer(
                    "virtualMachineScaleSets.get", "the scale set without its id or properties"
                )
            return found

        return self._call_api("virtualMachineScaleSets.get", get)

    def list_vms(self, flexible_set_id: str = "") -> list[dict]:
        """Every VM of the set with its instance view, as plain JSON: a Uniform set's own
        list, or (``flexible_set_id`` given) the resource group's VMs filtered to the
        Flexible set of that id."""
        group = f"/subscriptions/{quote(self.subscription, safe='')}/resourceGroups/"
        group += quote(self.resource_group, safe="")
        if flexible_set_id:
            set_filter = f"'virtualMachineScaleSet/id' eq '{flexible_set_id}'"
            return _json_pages(
                self._call_api,
                self._compute,
                vm_list_call(flexible=True),
                f"{group}/providers/Microsoft.Compute/virtualMachines",
                {"$filter": set_filter, "$expand": "instanceView"},
            )
        return _json_pages(
            self._call_api,
            self._compute,
            vm_list_call(flexible=False),
            f"{group}/providers/Microsoft.Compute/virtualMachineScaleSets/"
            f"{quote(self.name, safe='')}/virtualMachines",
            {"$expand": "instanceView"},
        )

    def network_interfaces(self, flexible: bool) -> list[Any]:
        """The set's network interfaces (a Flexible set's: the resource group's)."""
        if flexible:
            return _pages(
                self._call_api,
                "networkInterfaces.list",
                lambda: self._network.network_interfaces.list(self.resource_group),
            )
        return _pages(
            self._call_api,
            "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces",
            lambda: (
                self._network.network_interfaces.list_virtual_machine_scale_set_network_interfaces(
                    self.resource_group, self.name
                )
            ),
        )

    def resource_skus(self, location: str) -> list[Any]:
        """The resource SKUs (VM sizes and their capabilities) of ``location``."""
        return _pages(
            self._call_api,
            "resourceSkus.list",
            lambda: self._compute.resource_skus.list(filter=f"location eq '{location}'"),
        )

    def operation_status(self, url: str) -> Mapping[str, Any]:
        """The status document of the long-running operation at ``url``."""
        return self._call_api("operations.get", lambda: _operation_status(self._compute, url))

    def delete(self, member: Member, flexible: bool) -> None:
        """Start deleting ``member``; one already gone (a 404) is deleted already."""
        from azure.core.exceptions import ResourceNotFoundError
        from azure.mgmt.core.tools import parse_resource_id

        def delete() -> None:
            try:
                if flexible:
                    # By the id the listing gave: the VM it found in the set, wherever
                    # its resource group is spelled.
                    vm = parse_resource_id(member.resource_id)
                    self._compute.virtual_machines.begin_delete(
                        vm["resource_group"], vm["name"], polling=False
                    )
                else:
                    self._compute.virtual_machine_scale_sets.begin_delete_instances(
                        self.resource_group,
                        self.name,
                        {"instanceIds": [member.instance_id]},
                        polling=False,
                    )
            except ResourceNotFoundError:
                pass  # deleted meanwhile (an eviction with policy Delete): done already

        call_name = (
            "virtualMachines.delete" if flexible else "virtualMachineScaleSets.deleteInstances"
        )
        self._call_api(call_name, delete)

    def set_capacity(self, size: int) -> str:
        """Start setting the set's capacity to ``size``; the status URL of the operation
        (its ``Azure-AsyncOperation`` header), or "" without one."""
        status_urls: list[str] = []

        def note_status_url(pipeline_response: Any) -> None:
            headers = pipeline_response.http_response.headers
            status_urls.append(headers.get("Azure-AsyncOperation") or "")

        self._call_api(
            "virtualMachineScaleSets.update",
            lambda: self._compute.virtual_machine_scale_sets.begin_update(
                self.resource_group,
                self.name,
                {"sku": {"capacity": size}},
                polling=False,
                raw_response_hook=note_status_url,
            ),
        )
        return status_urls[-1] if status_urls else ""
