"""The shared base of cloud providers: retries, describe-once, slots, episode warnings."""

from __future__ import annotations

import logging

import pytest

from spotring.providers.base import ConfigurationError, InstanceState, ProviderError
from spotring.providers.cloud import (
    CloudGroupProvider,
    DescribeOnce,
    EpisodeWarnings,
    SlotResolver,
    backoff_delay,
    call_with_retries,
    worst_state,
)


class Throttled(Exception):
    pass


def test_worst_state_wins() -> None:
    assert worst_state(InstanceState.READY, InstanceState.PENDING) is InstanceState.PENDING
    assert worst_state(InstanceState.GONE, InstanceState.DRAINING) is InstanceState.GONE
    assert worst_state(InstanceState.READY) is InstanceState.READY


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    assert [backoff_delay(n, rng=lambda: 1.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_delay(30, rng=lambda: 1.0) == 20.0
    assert backoff_delay(3, rng=lambda: 0.0) == 0.0


def test_retries_then_succeeds_and_honours_retry_after() -> None:
    outcomes: list[object] = [Throttled(), Throttled(), "ok"]
    slept: list[float] = []
    retried: list[float] = []

    def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    result = call_with_retries(
        call,
        attempts=3,
        retry_after=lambda e: 7.0 if isinstance(e, Throttled) else None,
        on_retry=lambda e, delay: retried.append(delay),
        sleep=slept.append,
        rng=lambda: 0.0,
    )
    assert result == "ok"
    assert slept == retried == [7.0, 7.0]


def test_gives_up_after_the_attempts_and_never_retries_a_permanent_error() -> None:
    calls = []

    def throttled() -> None:
        calls.append(1)
        raise Throttled()

    with pytest.raises(Throttled):
        call_with_retries(throttled, attempts=4, retry_after=lambda e: 0.0, sleep=lambda s: None)
    assert len(calls) == 4

    calls.clear()
    with pytest.raises(Throttled):
        call_with_retries(throttled, attempts=4, retry_after=lambda e: None, sleep=lambda s: None)
    assert len(calls) == 1


def test_describe_once_remembers_only_what_keep_accepts() -> None:
    asked: list[list[str]] = []
    states = {"a": "running", "b": "pending"}

    def describe(keys: list[str]) -> dict[str, dict[str, str]]:
        asked.append(list(keys))
        return {k: {"state": states[k]} for k in keys if k in states}

    cache: DescribeOnce[str, dict[str, str]] = DescribeOnce(
        describe, lambda d: d["state"] == "running"
    )
    assert set(cache.get(["a", "b", "gone"])) == {"a", "b"}
    states["b"] = "running"
    assert set(cache.get(["a", "b"])) == {"a", "b"}
    assert cache.get(["a", "b"])["b"] == {"state": "running"}
    assert asked == [["a", "b", "gone"], ["b"]]  # the third listing asked nothing
    cache.get(["b"])  # "a" left the group: forgotten
    assert len(cache) == 1


def test_slots_come_from_option_then_label_then_accelerators(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert SlotResolver(4, "slots").slots("vm", {"slots": "2"}, 8) == 4
    resolver = SlotResolver(None, "slots")
    assert resolver.slots("vm", {"slots": "2"}, 8) == 2
    assert resolver.slots("vm", {}, 8) == 8
    assert resolver.slots("vm", {}, 0) == 1
    assert resolver.slots("vm", {}, None) == 1
    with caplog.at_level(logging.WARNING):
        assert resolver.slots("bad", {"slots": "two"}, 3) == 3
        assert resolver.slots("bad", {"slots": "two"}, 3) == 3
    assert caplog.text.count("is not a positive integer") == 1


def test_episode_warnings_start_once_and_clear(caplog: pytest.LogCaptureFixture) -> None:
    warnings = EpisodeWarnings(logging.getLogger("episode-test"))
    with caplog.at_level(logging.INFO, logger="episode-test"):
        for _ in range(3):
            warnings.update({"zone-a": "no capacity in zone-a"})
        warnings.update({})
        warnings.update({"zone-a": "no capacity in zone-a"})
    assert caplog.text.count("no capacity in zone-a") == 2
    assert caplog.text.count("zone-a: resolved") == 1


class _Group(CloudGroupProvider):
    """A cloud group whose API the test scripts: Throttled is retried at once."""

    name = "scripted-cloud"

    @classmethod
    def from_options(cls, options: object, core: object) -> _Group:  # type: ignore[override]
        return cls()

    def list_members(self) -> list:  # type: ignore[type-arg]
        return []

    def set_target_size(self, size: int) -> None: ...

    def replace_instance(self, instance_id: str) -> None: ...

    def scale_down_size(self) -> int:
        return 0

    def retry_delay(self, error: Exception) -> float | None:
        return 0.0 if isinstance(error, Throttled) else None

    def translate_error(self, call_name: str, error: Exception) -> ProviderError:
        return ConfigurationError(f"{call_name}: {error}")


def test_call_api_counts_retries_and_words_the_last_failure() -> None:
    group = _Group(max_api_attempts=3)
    outcomes: list[object] = [Throttled(), "ok"]

    def call() -> object:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert group.call_api("groups.get", call) == "ok"
    assert (group.api_calls, group.api_retries) == (2, 1)
    with pytest.raises(ConfigurationError, match=r"groups\.get: denied"):
        group.call_api("groups.get", lambda: (_ for _ in ()).throw(PermissionError("denied")))
    assert (group.api_calls, group.api_retries) == (3, 1)  # a permanent error: one attempt
