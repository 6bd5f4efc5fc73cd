"""The job's price book: overrides first, each provider asked at most once per refresh,
the last good answer kept, one warning for a price that cannot be read."""

from __future__ import annotations

import logging
import threading

import pytest

from spotring.core import Lifecycle
from spotring.core.prices import HourlyPrice, PriceBook


class Group:
    """A group as the price book sees it, whose price API answers what it is told."""

    def __init__(self, name: str, lifecycle: Lifecycle | None, answers: list[object]) -> None:
        self.name, self.lifecycle, self.answers, self.asked = name, lifecycle, answers, 0

    def group_name(self) -> str:
        return self.name

    def group_lifecycle(self) -> Lifecycle | None:
        return self.lifecycle

    def hourly_price(self) -> HourlyPrice | None:
        self.asked += 1
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, Exception):
            raise answer
        return None if answer is None else HourlyPrice(float(answer), "test", 0.0)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_groups_name_overrides_its_lifecycle_and_both_override_the_cloud() -> None:
    spot = Group("a", Lifecycle.SPOT, [0.1])
    named = Group("b", Lifecycle.SPOT, [0.1])
    book = PriceBook([spot, named], {"spot": 0.3, "b": 0.5})
    assert book.price("a") is None  # its lifecycle not asked yet: no price call here
    book.read_due()
    assert (book.price("a").usd, book.price("a").source) == (0.3, "--price")  # type: ignore[union-attr]
    assert book.price("b").usd == 0.5  # type: ignore[union-attr]
    assert spot.asked == named.asked == 0
    assert book.price("nobody") is None


def test_the_provider_is_asked_once_per_refresh_and_its_last_good_answer_kept() -> None:
    clock = Clock()
    group = Group("g", None, [0.2, RuntimeError("throttled"), None, 0.4])
    book = PriceBook([group], {}, refresh_s=60.0, clock=clock)
    assert book.price("g") is None and group.asked == 0  # reading never asks
    assert book.read_due() == 60.0
    assert book.price("g").usd == 0.2  # type: ignore[union-attr]
    clock.now += 59
    assert book.read_due() == 1.0
    assert group.asked == 1
    for _ in range(3):  # the error, then unknown, then a new price
        clock.now += 60
        book.read_due()
        if group.asked < 4:
            assert book.price("g").usd == 0.2  # type: ignore[union-attr]  # kept
    assert book.price("g").usd == 0.4  # type: ignore[union-attr]
    assert group.asked == 4


def test_an_unknown_price_warns_once_and_is_not_asked_again_until_the_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    group = Group("g", Lifecycle.ON_DEMAND, [RuntimeError("denied"), None, None])
    book = PriceBook([group], {"spot": 0.3}, refresh_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            book.read_due()
            assert book.price("g") is None
            assert book.per_slot("g") is None
        clock.now += 60
        book.read_due()
        assert book.price("g") is None
    assert group.asked == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "group g: its price could not be read: denied; cost is not counted for it "
        "(give --price g=USD_PER_HOUR)"
    ]


def test_a_group_with_no_price_to_read_is_noted_once_not_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "spotring.core.prices")
    book = PriceBook([Group("local", Lifecycle.SPOT, [])], {}, refresh_s=0.0)
    for _ in range(3):
        book.read_due()
        assert book.price("local") is None
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            logging.INFO,
            "group local: no price from its cloud; cost is not counted for it "
            "(give --price local=USD_PER_HOUR)",
        )
    ]


def test_per_slot_divides_by_the_slots_the_groups_hosts_hold() -> None:
    book = PriceBook([Group("g", None, [])], {"g": 2.0})
    assert book.per_slot("g") == 2.0
    book.note_slots("g", 4)
    assert book.per_slot("g") == 0.5


def test_a_failure_of_the_books_own_is_logged_and_read_again_after_the_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    times = iter([RuntimeError("clock broke"), 1000.0])

    def clock() -> float:
        now = next(times)
        if isinstance(now, Exception):
            raise now
        return now

    group = Group("g", None, [0.2])
    book = PriceBook([group], {}, refresh_s=60.0, clock=clock)
    assert book.read_due() == 60.0  # not a tight loop
    assert "reading the groups' prices failed; retrying in 60s" in caplog.text
    book.read_due()
    assert book.price("g").usd == 0.2  # type: ignore[union-attr]


def test_the_books_thread_reads_the_prices_and_stops_when_told() -> None:
    asked = threading.Event()
    release = threading.Event()

    class Blocking(Group):
        def hourly_price(self) -> HourlyPrice | None:
            asked.set()
            release.wait()
            return super().hourly_price()

    book = PriceBook([Blocking("g", None, [0.2])], {})
    book.start()
    assert asked.wait(10)
    assert book.price("g") is None  # the reader is not held by the call
    book.stop(wait=0)
    release.set()
    book.stop(wait=10)
    assert book._thread is not None and not book._thread.is_alive()
    assert book.price("g").usd == 0.2  # type: ignore[union-attr]
