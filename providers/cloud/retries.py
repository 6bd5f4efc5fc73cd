"""Retrying a cloud call: capped exponential backoff with full jitter, honouring a
server's Retry-After."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_MAX_API_ATTEMPTS = 5


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
