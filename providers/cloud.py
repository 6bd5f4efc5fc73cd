"""What every cloud instance-group provider needs, written once.

The AWS, GCP and Azure providers (and third-party ones) build on
:class:`CloudGroupProvider`, which holds the options they share (``--spot-only``,
``--scale-down-on-exit``, ``--max-api-attempts``, a slots label), the API-call
counters, the ``--spot-only`` filter and the scale-down at the end of a job. Beside it:

* :func:`worst_state` combines a cloud's several state tables (group lifecycle,
  VM status, health) into one :class:`InstanceState`: the least usable one wins;
* :func:`call_with_retries` retries throttling, 5xx and network failures with
  capped exponential backoff and full jitter, honouring a server's Retry-After;
* :class:`DescribeOnce` remembers the details of running members (address, type,
  zone, spot-ness do not change while a VM runs), so a steady group costs one call;
* :class:`SlotResolver` turns ``--slots-per-host``, a label/tag, or the number of
  accelerators into a member's slot count, warning once per bad label;
* :class:`EpisodeWarnings` reports a condition (no capacity in a zone) once when it
  starts and once when it clears, not on every refresh;
* :func:`one_line` shapes an API message for a one-line error;
* :func:`check_endpoint` refuses an ``--endpoint`` that would send a token in clear;
* :class:`MalformedAnswer` is the retryable error of an answer broken as a whole.

Nothing here imports a cloud SDK.
"""

from __future__ import annotations

import abc
import argparse
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    Lifecycle,
    Provider,
    ProviderError,
)
from spotring.providers.options import positive_int

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
D = TypeVar("D")

DEFAULT_MAX_API_ATTEMPTS = 5

# ------------------------------------------------------------------ state tables

_SEVERITY: Mapping[InstanceState, int] = {
    InstanceState.READY: 0,
    InstanceState.PENDING: 1,
    InstanceState.DRAINING: 2,
    InstanceState.TERMINATING: 3,
    InstanceState.GONE: 4,
}


def worst_state(*states: InstanceState) -> InstanceState:
    """The least usable of ``states`` (READY < PENDING < DRAINING < TERMINATING < GONE)."""
    return max(states, key=_SEVERITY.__getitem__)


def lookup_state(table: Mapping[str, InstanceState], cloud_state: str) -> InstanceState:
    """``table[cloud_state]``; a state the cloud adds later counts as PENDING: not
    usable, not gone."""
    return table.get(cloud_state, InstanceState.PENDING)


# ------------------------------------------------------------------------ retries


def backoff_delay(
    failures: int, *, base: float = 0.5, cap: float = 20.0, rng: Callable[[], float] = random.random
) -> float:
    """Seconds to wait after ``failures`` failed attempts: full jitter over a capped
    exponential (so many drivers throttled at once do not retry in lockstep)."""
    return rng() * min(cap, base * 2 ** max(0, failures - 1))


def call_with_retries(
    call: Callable[[], T],
    *,
    attempts: int,
    retry_after: Callable[[Exception], float | None],
    on_retry: Callable[[Exception, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[], float] = random.random,
) -> T:
    """``call()``, tried up to ``attempts`` times.

    :param retry_after: classifies a failure: None when it must not be retried
        (raised at once), else the seconds the server asked to wait (0 for "not said",
        which means the backoff's own delay).
    :param on_retry: told of each failure that will be retried and the delay chosen.
    """
    failures = 0
    while True:
        try:
            return call()
        except Exception as error:
            wait = retry_after(error)
            failures += 1
            if wait is None or failures >= attempts:
                raise
            delay = max(wait, backoff_delay(failures, rng=rng))
            if on_retry is not None:
                on_retry(error, delay)
            sleep(delay)


# ------------------------------------------------------------------ member details


class DescribeOnce(Generic[K, D]):
    """Details of group members, described once and remembered while they stay valid.

    ``describe(keys)`` fetches details for members not remembered (in as few calls as
    the cloud allows) and returns them by key; a key it leaves out is a member the
    cloud no longer knows. ``keep(detail)`` says whether a detail may be reused next
    time (typically: the VM is running, so its address and type are final). Key a
    member by whatever changes when the cloud puts a new VM in its place (an id, or
    a name and an id where names are reused).
    """

    def __init__(
        self, describe: Callable[[Sequence[K]], Mapping[K, D]], keep: Callable[[D], bool]
    ) -> None:
        self._describe = describe
        self._keep = keep
        self._known: dict[K, D] = {}

    def get(self, keys: Sequence[K]) -> dict[K, D]:
        """Details of ``keys``: remembered ones, plus one ``describe`` of the rest."""
        missing = [k for k in keys if k not in self._known]
        fresh = self._describe(missing) if missing else {}
        details: dict[K, D] = {}
        for key in keys:
            detail = self._known[key] if key in self._known else fresh.get(key)
            if detail is not None:
                details[key] = detail
        # Forget members that left or stopped running: the next VM gets described anew.
        self._known = {k: d for k, d in details.items() if self._keep(d)}
        return details

    def __len__(self) -> int:
        return len(self._known)


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -------------------------------------------------------------------------- slots


class SlotResolver:
    """A member's slot count: ``--slots-per-host``, else its label (or tag), else the
    number of accelerators attached, else 1.

    A label that is not a positive integer is warned about once per member and
    ignored, not fatal: one mislabelled VM must not stop a job.
    """

    def __init__(self, slots_per_host: int | None, label: str, what: str = "label") -> None:
        self.slots_per_host = slots_per_host
        self.label = label
        self.what = what
        self._warned: set[str] = set()

    def from_label(self, member: str, labels: Mapping[str, str]) -> int | None:
        """The slots the member's label gives, or None (absent or not a positive int)."""
        value = labels.get(self.label)
        if value is None:
            return None
        try:
            slots = int(value)
        except ValueError:
            slots = 0
        if slots >= 1:
            return slots
        if member not in self._warned:
            self._warned.add(member)
            log.warning(
                "instance %s: %s %s=%r is not a positive integer; using the accelerator count",
                member,
                self.what,
                self.label,
                value,
            )
        return None

    def needs_accelerator_count(self, member: str, labels: Mapping[str, str]) -> bool:
        """Whether the accelerator count decides this member's slots."""
        return self.slots_per_host is None and self.from_label(member, labels) is None

    def slots(self, member: str, labels: Mapping[str, str], accelerators: int | None) -> int:
        """The member's slots; ``accelerators`` None or 0 means one slot."""
        if self.slots_per_host is not None:
            return self.slots_per_host
        labelled = self.from_label(member, labels)
        if labelled is not None:
            return labelled
        return max(1, accelerators or 0)


# ----------------------------------------------------------------------- warnings


class EpisodeWarnings:
    """Warn when a condition starts, say so when it ends, stay quiet in between.

    Each refresh passes every condition that holds now, keyed (e.g. by zone) with its
    message; a key seen on the last refresh is not warned about again.
    """

    def __init__(self, logger: logging.Logger = log) -> None:
        self._logger = logger
        self.active: dict[str, str] = {}

    def update(self, conditions: Mapping[str, str]) -> None:
        """Record the conditions of this refresh, logging the ones that start or end."""
        for key, message in conditions.items():
            if key not in self.active:
                self._logger.warning("%s", message)
        for key in self.active.keys() - conditions.keys():
            self._logger.info("%s: resolved", key)
        self.active = dict(conditions)


def refuse_repeated_groups(
    groups: Sequence[tuple[str, str]], fold: Callable[[str], str] = str
) -> None:
    """Raise :class:`ConfigurationError` when one of a job's groups, ``(location,
    name)``, is given twice; ``fold`` makes names equal (``str.lower`` where the cloud
    ignores case)."""
    seen: set[tuple[str, str]] = set()
    for location, name in groups:
        key = (fold(location), fold(name))
        if key in seen:
            raise ConfigurationError(f"--group {location}/{name} is given more than once")
        seen.add(key)


def group_labels(groups: Sequence[tuple[str, str]], fold: Callable[[str], str] = str) -> list[str]:
    """What each of a job's groups, ``(location, name)`` in ``--group`` order, is called
    in it: the name alone where no other group has that name, else ``LOCATION/NAME``.
    Raises :class:`ConfigurationError` for a group given twice (see
    :func:`refuse_repeated_groups`)."""
    refuse_repeated_groups(groups, fold)
    names = [fold(name) for _, name in groups]
    return [
        name if names.count(fold(name)) == 1 else f"{location}/{name}" for location, name in groups
    ]


# ------------------------------------------------------------------------- errors


def one_line(text: object, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_endpoint(endpoint: str) -> bool:
    """Check an ``--endpoint`` URL; returns whether it is plain http.

    https anywhere; plain http only to a test server on loopback, since the calls
    carry the credentials' access token, which must not cross a network in clear.
    Raises :class:`ConfigurationError` (one line) otherwise.
    """
    parts = urlsplit(endpoint)
    try:
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        raise ConfigurationError(f"--endpoint must be an http(s) URL, got {endpoint!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or _has_space(endpoint):
        raise ConfigurationError(f"--endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
        raise ConfigurationError("--endpoint over plain http is only for a test server on loopback")
    return parts.scheme == "http"


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


class MalformedAnswer(ProviderError):
    """The cloud answered ``call_name``, but with an answer broken as a whole: the list
    of members (or a page of it) is missing, a member or VM comes without the id that
    says whose it is, or a value has the wrong type.

    A refresh built on such an answer would show members in the wrong state, or none,
    so the whole listing fails instead, and the controller keeps the last good inventory.
    (A member that lacks only its own fields, a state or a running VM's address, costs
    only itself: the provider lists it as not usable, warned once with
    :class:`EpisodeWarnings`.) Retryable: the next answer may be whole. Raised inside a
    call given to :meth:`CloudGroupProvider.call_api` it is retried there like a network
    failure.
    """

    def __init__(self, call_name: str, problem: str) -> None:
        super().__init__(f"malformed answer to {call_name}: {one_line(problem, 160)}")


# ----------------------------------------------------------------------- provider


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


__all__ = [
    "DEFAULT_MAX_API_ATTEMPTS",
    "CloudGroupProvider",
    "ConfigurationError",
    "DescribeOnce",
    "EpisodeWarnings",
    "MalformedAnswer",
    "ProviderError",
    "SlotResolver",
    "backoff_delay",
    "batches",
    "call_with_retries",
    "check_endpoint",
    "lookup_state",
    "one_line",
    "worst_state",
]
