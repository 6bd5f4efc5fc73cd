"""The base class of providers for a cloud's instance group: the options they share,
the API-call counters, the ``--spot-only`` filter and the scale-down at a job's end."""

from __future__ import annotations

import abc
import argparse
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    Instance,
    Lifecycle,
    Provider,
    ProviderError,
)
from spotring.providers.cloud.errors import MalformedAnswer, one_line
from spotring.providers.cloud.retries import DEFAULT_MAX_API_ATTEMPTS, call_with_retries
from spotring.providers.cloud.slots import SlotResolver
from spotring.providers.options import positive_int

log = logging.getLogger(__package__)

T = TypeVar("T")


class CloudGroupProvider(Provider):
    """Base of providers for a cloud's instance group.

    Subclasses implement :meth:`list_members` (every member, unfiltered, counting
    their API calls in :attr:`api_calls` / :attr:`api_retries`) and
    :meth:`scale_down_size`; this class filters ``--spot-only``, counts the calls
    of each refresh in :attr:`last_refresh_calls`, and scales the group down when the
    job ends if the user asked for it.
    """

    slots_label_option: str = "--slots-label"
    """The option naming the label (AWS and Azure: tag) that holds a host's slots."""
    default_slots_label: str = "spotring-slots"

    def __init__(
        self,
        *,
        spot_only: bool = False,
        slots_per_host: int | None = None,
        slots_label: str | None = None,
        scale_down_on_exit: bool = False,
        max_api_attempts: int = DEFAULT_MAX_API_ATTEMPTS,
    ) -> None:
        if slots_per_host is not None and slots_per_host < 1:
            raise ConfigurationError("--slots-per-host must be at least 1")
        if max_api_attempts < 1:
            raise ConfigurationError("--max-api-attempts must be at least 1")
        self.spot_only = spot_only
        self.scale_down_on_exit = scale_down_on_exit
        self.max_api_attempts = max_api_attempts
        what = self.slots_label_option.removeprefix("--slots-")
        self.slots = SlotResolver(slots_per_host, slots_label or self.default_slots_label, what)
        self.api_calls = 0
        """API operations made, all time (each page and each retry counts)."""
        self.api_retries = 0
        """Attempts repeated after throttling, 5xx or network errors."""
        self.last_refresh_calls = 0
        """API operations the last :meth:`list_instances` made."""

    @property
    def slots_per_host(self) -> int | None:
        return self.slots.slots_per_host

    # ----------------------------------------------------------------- options

    @classmethod
    def add_common_arguments(cls, group: argparse._ArgumentGroup, prefix: str) -> None:
        """Add ``--spot-only``, the slots label, ``--scale-down-on-exit`` and
        ``--max-api-attempts``, stored as ``{prefix}_spot_only`` and so on."""
        what = cls.slots_label_option.removeprefix("--slots-")
        group.add_argument(
            "--spot-only",
            dest=f"{prefix}_spot_only",
            action="store_true",
            help="use only the group's spot members (groups that mix spot and on-demand)",
        )
        group.add_argument(
            cls.slots_label_option,
            dest=f"{prefix}_slots_label",
            default=cls.default_slots_label,
            metavar="KEY",
            help=f"instance {what} holding a host's slot count when --slots-per-host is not"
            " given; without it, the number of GPUs (default: %(default)s)",
        )
        group.add_argument(
            "--scale-down-on-exit",
            dest=f"{prefix}_scale_down_on_exit",
            action="store_true",
            help="shrink the group to its minimum when the job ends",
        )
        group.add_argument(
            "--max-api-attempts",
            dest=f"{prefix}_max_api_attempts",
            type=positive_int,
            default=DEFAULT_MAX_API_ATTEMPTS,
            metavar="N",
            help="attempts per API call on throttling, 5xx and network errors"
            " (default: %(default)s)",
        )

    @classmethod
    def common_options(
        cls, options: argparse.Namespace, core: CoreOptions, prefix: str
    ) -> dict[str, Any]:
        """The keyword arguments of :meth:`__init__` from options added with ``prefix``
        and the core ``--slots-per-host``."""
        return {
            "spot_only": getattr(options, f"{prefix}_spot_only", False),
            "slots_per_host": core.slots_per_host,
            "slots_label": getattr(options, f"{prefix}_slots_label", cls.default_slots_label),
            "scale_down_on_exit": getattr(options, f"{prefix}_scale_down_on_exit", False),
            "max_api_attempts": getattr(
                options, f"{prefix}_max_api_attempts", DEFAULT_MAX_API_ATTEMPTS
            ),
        }

    # ----------------------------------------------------------------- listing

    def list_instances(self) -> list[Instance]:
        """Every member (only spot ones with ``--spot-only``); see :meth:`list_members`."""
        calls_before = self.api_calls
        instances = [
            i for i in self.list_members() if not self.spot_only or i.lifecycle is Lifecycle.SPOT
        ]
        self.last_refresh_calls = self.api_calls - calls_before
        logging.getLogger(type(self).__module__).debug(
            "%s refresh: %d instances, %d API calls",
            self.name,
            len(instances),
            self.last_refresh_calls,
        )
        return instances

    @abc.abstractmethod
    def list_members(self) -> Sequence[Instance]:
        """Every member of the group, spot or not; raises :class:`ProviderError`."""

    # ------------------------------------------------------------- API calls

    def call_api(self, call_name: str, call: Callable[[], T]) -> T:
        """One API call with :func:`call_with_retries` (``--max-api-attempts``), counted
        in :attr:`api_calls` / :attr:`api_retries`; any failure it ends with becomes a
        :class:`ProviderError` through :meth:`translate_error`.

        ``call`` should also read the answer into what the provider keeps, so that an
        answer it cannot read (any exception, or a :class:`MalformedAnswer` it raises)
        is a failure of this call, retried and named in the error like a network one.
        """
        logger = logging.getLogger(type(self).__module__)

        def attempt() -> T:
            self.api_calls += 1
            return call()

        def retry_after(error: Exception) -> float | None:
            return 0.0 if isinstance(error, MalformedAnswer) else self.retry_delay(error)

        def retried(error: Exception, delay: float) -> None:
            self.api_retries += 1
            logger.debug("%s: %s failed (%s); retrying in %.1f s", self.name, call_name, error,
                         delay)  # fmt: skip

        try:
            return call_with_retries(
                attempt,
                attempts=self.max_api_attempts,
                retry_after=retry_after,
                on_retry=retried,
            )
        except ProviderError:
            raise
        except Exception as error:
            raise self.translate_error(call_name, error) from None

    def retry_delay(self, error: Exception) -> float | None:
        """Seconds to wait before retrying ``error`` (0: the backoff decides), or None
        when retrying cannot help. By default nothing is retried."""
        return None

    def translate_error(self, call_name: str, error: Exception) -> ProviderError:
        """The one-line :class:`ProviderError` (:class:`ConfigurationError` for what the
        user must fix) a failed call ends with."""
        return ProviderError(f"{call_name} failed: {type(error).__name__}: {one_line(error)}")

    # ------------------------------------------------------------------ ending

    @abc.abstractmethod
    def scale_down_size(self) -> int:
        """The size ``--scale-down-on-exit`` shrinks the group to (its minimum),
        read fresh from the cloud: the job may have run for days."""

    def job_finished(self) -> None:
        """With ``--scale-down-on-exit``, shrink the group to :meth:`scale_down_size`."""
        if not self.scale_down_on_exit:
            return
        if not self.can_resize:
            log.warning("%s: not scaling down on exit: spotring does not size it", self.describe())
            return
        self.set_target_size(self.scale_down_size())
