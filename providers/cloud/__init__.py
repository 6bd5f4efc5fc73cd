"""What every cloud instance-group provider needs, written once.

The AWS, GCP and Azure providers (and third-party ones) build on
:class:`CloudGroupProvider`, which holds the options they share (``--spot-only``,
``--scale-down-on-exit``, ``--max-api-attempts``, a slots label), the API-call
counters, the ``--spot-only`` filter and the scale-down at the end of a job. Beside it,
one room each:

* :mod:`.states`: :func:`worst_state` combines a cloud's several state tables (group
  lifecycle, VM status, health) into one :class:`InstanceState`: the least usable one
  wins; :func:`lookup_state` reads one table;
* :mod:`.retries`: :func:`call_with_retries` retries throttling, 5xx and network
  failures with capped exponential backoff and full jitter, honouring a server's
  Retry-After;
* :mod:`.details`: :class:`DescribeOnce` remembers the details of running members
  (address, type, zone, spot-ness do not change while a VM runs), so a steady group
  costs one call; :func:`batches` slices ids for calls that take a bounded number;
* :mod:`.slots`: :class:`SlotResolver` turns ``--slots-per-host``, a label/tag, or the
  number of accelerators into a member's slot count, warning once per bad label;
* :mod:`.episodes`: :class:`EpisodeWarnings` reports a condition (no capacity in a
  zone) once when it starts and once when it clears, not on every refresh;
* :mod:`.groups`: :func:`group_labels` names a job's groups and refuses one given twice;
* :mod:`.errors`: :func:`one_line` shapes an API message for a one-line error;
  :class:`MalformedAnswer` is the retryable error of an answer broken as a whole;
* :mod:`.endpoints`: :func:`check_endpoint` refuses an ``--endpoint`` that would send a
  token in clear;
* :mod:`.group_provider`: :class:`CloudGroupProvider`.

Nothing here imports a cloud SDK. Every name is importable from this package.
"""

from spotring.providers.base import ConfigurationError, ProviderError
from spotring.providers.cloud.details import DescribeOnce, batches
from spotring.providers.cloud.endpoints import LOOPBACK_HOSTS, check_endpoint
from spotring.providers.cloud.episodes import EpisodeWarnings
from spotring.providers.cloud.errors import MalformedAnswer, one_line
from spotring.providers.cloud.group_provider import CloudGroupProvider
from spotring.providers.cloud.groups import group_labels, refuse_repeated_groups
from spotring.providers.cloud.retries import (
    DEFAULT_MAX_API_ATTEMPTS,
    backoff_delay,
    call_with_retries,
)
from spotring.providers.cloud.slots import SlotResolver
from spotring.providers.cloud.states import lookup_state, worst_state

__all__ = [
    "DEFAULT_MAX_API_ATTEMPTS",
    "LOOPBACK_HOSTS",
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
    "group_labels",
    "lookup_state",
    "one_line",
    "refuse_repeated_groups",
    "worst_state",
]
