"""The embedded ``local`` provider: a simulated instance group on this machine.

Hosts are named ``host-0``, ``host-1``, ... and their workers run as local processes
(the launcher tells the provider which process groups run on which host). Like a cloud
group, it keeps a desired size: a host that is preempted or replaced is followed by a
new one that boots for ``--boot-seconds``. Chaos options script what a spot group does
to a job: a scale-up at a given time, hard preemptions that kill a host's workers with
SIGKILL and then report the host GONE, and noticed preemptions: the host announces its
interruption through an EC2-style metadata service on loopback
(:mod:`.metadata`, read by the real AWS notice watcher on the host)
``--notice-lead`` seconds before the same hard preemption.

A local group is two groups in one simulated pool, as a job spanning a spot group and an
on-demand group sees them (:meth:`LocalProvider.groups_from_options`): ``local-spot``
(``host-0``, ``host-1``, ...), which chaos acts on and which ``--spot-capacity N``
limits (a launch beyond N fails with the capacity error an Auto Scaling activity
reports, which :meth:`LocalProvider.capacity_shortage` returns), and ``local-on-demand``
(``od-0``, ``od-1``, ...), unlimited and never preempted, which starts empty.

Rooms:

* :mod:`.provider`: :class:`LocalProvider` (the pool, its spot group, chaos, spot
  capacity), :class:`LocalOnDemandGroup` and the provider's registration;
* :mod:`.control`: the ``--control`` file, read line by line as it grows;
* :mod:`.metadata`: :class:`FakeImds`, the hosts' EC2-style metadata service.
"""

from spotring.providers.local.metadata import FakeImds
from spotring.providers.local.provider import (
    CAPACITY_CODE,
    DEFAULT_NOTICE_LEAD_SECONDS,
    NOTICE_POLL_SECONDS,
    ON_DEMAND_GROUP,
    SPOT_GROUP,
    LocalOnDemandGroup,
    LocalProvider,
    spotring_register_providers,
)

__all__ = [
    "CAPACITY_CODE",
    "DEFAULT_NOTICE_LEAD_SECONDS",
    "NOTICE_POLL_SECONDS",
    "ON_DEMAND_GROUP",
    "SPOT_GROUP",
    "FakeImds",
    "LocalOnDemandGroup",
    "LocalProvider",
    "spotring_register_providers",
]
