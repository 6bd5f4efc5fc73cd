"""Worker side: join the next ring when a member dies while the ring is forming.

Each reset ends in ``hvd.init``, whose Gloo context connects every member to every
other. When a member dies during that (a spot reclaim, a kill), the others' connects
fail. Stock Horovod 0.28.1 lets that exception escape its background thread, so every
other member dies of ``std::terminate`` and the committed state in their memory dies
with them; when they were all the hosts of the previous ring, the job is over.
spotring's Horovod build (``worker_image/horovod-failure-paths.patch``, applied by
``scripts/setup.sh`` and by the hosts' bootstrap) makes ``hvd.init`` fail
with Horovod's "initialization failed" error instead. This wrapper then shuts Horovod
down and calls ``init`` again: the driver records the dead worker, the round ends
without it, and the process joins the next ring with its state intact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

FORMATION_FAILED = "Horovod initialization failed"
"""The start of the message of the ``ValueError`` ``hvd.init`` raises when it fails."""

MAX_ATTEMPTS = 10
"""Rings tried before giving up: a failure that repeats is not a dead peer."""


def retry_failed_formation(
    init: Callable[..., Any], shutdown: Callable[[], Any], attempts: int = MAX_ATTEMPTS
) -> Callable[..., Any]:
    """``init``, called again after ``shutdown`` when the ring failed to form."""

    def init_until_formed(*args: Any, **kwargs: Any) -> Any:
        attempt = 1
        while True:
            try:
                return init(*args, **kwargs)
            except ValueError as error:
                if not str(error).startswith(FORMATION_FAILED) or attempt >= attempts:
                    raise
            attempt += 1
            log.warning(
                "spotring: the ring failed to form (a member died while it formed?); "
                "joining the next one (attempt %d of %d)",
                attempt,
                attempts,
            )
            shutdown()

    init_until_formed.__wrapped__ = init  # type: ignore[attr-defined]
    return init_until_formed
