"""The capacity policy, on a fake clock: backoff, fallback, base, hand-backs, demotion."""

from __future__ import annotations

import pytest

from spotring.autoscaler.capacity import (
    BELOW_TARGET_CODE,
    DEMOTE_AFTER_PREEMPTIONS,
    DEMOTION_SECONDS,
    PREEMPTION_WINDOW_SECONDS,
    CapacityOptions,
    CapacityPolicy,
    ShortageBackoff,
)
from spotring.core import CapacityShortage, ShortageCause

SHORT = CapacityShortage(ShortageCause.CAPACITY, "InsufficientInstanceCapacity", "no spot")
QUOTA = CapacityShortage(ShortageCause.QUOTA, "QUOTA_EXCEEDED", "CPUS")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ids(group: str, n: int) -> list[str]:
    return [f"{group}-{k}" for k in range(n)]


def make(
    groups: tuple[str, ...] = ("spot", "od"), rng: float = 0.5, **options: object
) -> tuple[CapacityPolicy, Clock]:
    clock = Clock()
    policy = CapacityPolicy(
        groups,
        CapacityOptions(**options),  # type: ignore[arg-type]
        clock=clock,
        wall_clock=lambda: clock.now + 1e9,
        rng=lambda: rng,
    )
    return policy, clock


def see(policy: CapacityPolicy, **ready: int) -> None:
    for group, n in ready.items():
        policy.observe(group, ids(group, n), n)


# ------------------------------------------------------------------ backoff


def test_backoff_grows_by_1_6_up_to_300s_within_40_percent_jitter() -> None:
    backoff = ShortageBackoff()
    nominal = [backoff.delay(n, ShortageCause.CAPACITY, lambda: 0.5) for n in range(1, 7)]
    assert nominal == pytest.approx([60, 96, 153.6, 245.76, 300, 300])
    for failures in (1, 3, 10):
        middle = backoff.delay(failures, ShortageCause.CAPACITY, lambda: 0.5)
        low = backoff.delay(failures, ShortageCause.CAPACITY, lambda: 0.0)
        high = backoff.delay(failures, ShortageCause.CAPACITY, lambda: 0.999999)
        assert low == pytest.approx(0.6 * middle)
        assert high == pytest.approx(1.4 * middle, rel=1e-5)


def test_quota_backs_off_longer() -> None:
    backoff = ShortageBackoff()
    assert backoff.delay(1, ShortageCause.QUOTA, lambda: 0.5) == 300
    assert backoff.delay(9, ShortageCause.QUOTA, lambda: 0.5) == 1800
    policy, _clock = make()
    policy.distribute(4)
    see(policy, spot=0, od=0)
    policy.report_shortage("spot", QUOTA)
    assert policy.status("spot").backoff_left_s == pytest.approx(300)


# ---------------------------------------------------------------- fallback


def test_a_signal_makes_the_group_short_and_its_shortfall_goes_to_the_next() -> None:
    policy, _clock = make()
    asked, _ = policy.distribute(4)
    assert asked == {"spot": 4, "od": 0}
    see(policy, spot=2, od=0)
    assert policy.wants_signal("spot") and not policy.wants_signal("od")
    decision = policy.report_shortage("spot", SHORT)
    assert decision is not None and decision.kind == "capacity_shortage"
    assert decision.shortage == SHORT
    asked, decisions = policy.distribute(4)
    assert asked == {"spot": 2, "od": 2}
    assert [(d.kind, d.group, d.to_group, d.hosts) for d in decisions] == [
        ("fell_back", "spot", "od", 2)
    ]
    # Told once: the same fallback on the next refresh is no new decision.
    assert policy.distribute(4)[1] == []
    assert not policy.wants_signal("spot")  # backed off: the cloud is not asked


def test_no_signal_counts_as_short_only_after_fallback_after() -> None:
    policy, clock = make(fallback_after=300)
    policy.distribute(4)
    see(policy, spot=2, od=0)
    clock.now += 299
    see(policy, spot=2, od=0)
    assert policy.report_shortage("spot", None) is None
    assert policy.distribute(4)[0] == {"spot": 4, "od": 0}
    clock.now += 1
    see(policy, spot=2, od=0)
    decision = policy.report_shortage("spot", None)
    assert decision is not None and decision.shortage is not None
    assert decision.shortage.code == BELOW_TARGET_CODE
    assert policy.distribute(4)[0] == {"spot": 2, "od": 2}


def test_a_group_at_its_size_is_never_short() -> None:
    policy, clock = make()
    policy.distribute(4)
    see(policy, spot=4)
    assert policy.report_shortage("spot", SHORT) is None
    clock.now += 10_000
    see(policy, spot=4)
    assert policy.report_shortage("spot", None) is None


def test_a_short_group_is_probed_when_its_backoff_expires_then_backs_off_longer() -> None:
    policy, clock = make()
    policy.distribute(4)
    see(policy, spot=2, od=0)
    policy.report_shortage("spot", SHORT)
    policy.distribute(4)
    see(policy, spot=2, od=2)
    clock.now += 59  # 60 s nominal with rng 0.5
    assert policy.distribute(4)[0] == {"spot": 2, "od": 2}
    clock.now += 1
    # The probe: spot is asked for the whole job again; od keeps its live hosts.
    assert policy.distribute(4)[0] == {"spot": 4, "od": 2}
    see(policy, spot=2, od=2)
    assert policy.wants_signal("spot")
    policy.report_shortage("spot", SHORT)
    assert policy.status("spot").backoff_left_s == pytest.approx(96)


def test_a_stale_signal_is_not_asked_for_past_the_probe() -> None:
    policy, clock = make()
    policy.distribute(4)
    see(policy, spot=2)
    first = policy.below_since_wall("spot")
    policy.report_shortage("spot", SHORT)
    clock.now += 60
    policy.distribute(4)
    see(policy, spot=2)
    later = policy.below_since_wall("spot")
    assert first is not None and later is not None and later >= first + 60


def test_a_group_that_reaches_its_size_forgets_its_failures() -> None:
    policy, clock = make()
    policy.distribute(4)
    see(policy, spot=2)
    policy.report_shortage("spot", SHORT)
    clock.now += 60
    policy.distribute(4)
    see(policy, spot=4)
    policy.distribute(4)
    see(policy, spot=3)  # a preemption later: a new shortage starts at 60 s again
    policy.report_shortage("spot", SHORT)
    assert policy.status("spot").backoff_left_s == pytest.approx(60)


def test_every_short_group_passes_its_shortfall_on_in_order() -> None:
    policy, _clock = make(("a", "b", "od"))
    policy.distribute(6)
    see(policy, a=1, b=0, od=0)
    policy.report_shortage("a", SHORT)
    asked, _ = policy.distribute(6)
    assert asked == {"a": 1, "b": 5, "od": 0}
    see(policy, a=1, b=2, od=0)
    policy.report_shortage("b", SHORT)
    asked, decisions = policy.distribute(6)
    assert asked == {"a": 1, "b": 2, "od": 3}
    assert ("fell_back", "b", "od", 3) in [
        (d.kind, d.group, d.to_group, d.hosts) for d in decisions
    ]


def test_a_vetoed_group_is_skipped() -> None:
    policy, _clock = make(("a", "b", "od"))
    policy.distribute(4)
    see(policy, a=1, b=0, od=0)
    policy.report_shortage("a", SHORT)
    asked, _ = policy.distribute(4, allow=lambda group, short, hosts: 0 if group == "b" else hosts)
    assert asked == {"a": 1, "b": 0, "od": 3}


def test_limits_pass_what_a_group_cannot_hold_on() -> None:
    policy, _clock = make()
    asked, _ = policy.distribute(4, limits={"spot": 3})
    assert asked == {"spot": 3, "od": 1}


# ----------------------------------------------------------- on-demand base


def test_on_demand_base_stays_in_the_last_group() -> None:
    policy, _clock = make(on_demand_base=1)
    assert policy.distribute(4)[0] == {"spot": 3, "od": 1}
    see(policy, spot=1, od=1)
    policy.report_shortage("spot", SHORT)
    assert policy.distribute(4)[0] == {"spot": 1, "od": 3}
    assert make(on_demand_base=5)[0].distribute(4)[0] == {"spot": 0, "od": 4}


# --------------------------------------------------------------- hand-backs


def fall_back_and_recover(policy: CapacityPolicy, clock: Clock) -> None:
    """spot short at 2 of 4, od takes 2; later spot is probed and gets all 4."""
    policy.distribute(4)
    see(policy, spot=2, od=0)
    policy.report_shortage("spot", SHORT)
    policy.distribute(4)
    see(policy, spot=2, od=2)
    clock.now += 60
    policy.distribute(4)
    see(policy, spot=4, od=2)
    policy.distribute(4)


def ready(policy: CapacityPolicy, **counts: int) -> dict[str, list[str]]:
    return {group: ids(group, n) for group, n in counts.items()}


def test_fallback_hosts_go_back_one_at_a_time_after_return_after() -> None:
    policy, clock = make(return_after=600)
    fall_back_and_recover(policy, clock)
    assert policy.return_candidate(4, ready(policy, spot=4, od=2)) is None  # 60 s only
    clock.now += 540
    candidate = policy.return_candidate(4, ready(policy, spot=4, od=2))
    assert candidate is not None and candidate[1] == "od"
    policy.start_return(*candidate)
    assert policy.return_candidate(4, ready(policy, spot=4, od=2)) is None  # one at a time
    policy.finish_return(removed=True)
    assert policy.asked("od") == 1
    policy.observe("od", ids("od", 1), 1)
    assert policy.return_candidate(4, ready(policy, spot=4, od=1)) == ("od-0", "od")


def test_a_group_left_with_a_host_being_handed_back_is_not_below_target() -> None:
    """The fallback group keeps a draining host until it is removed: asked to keep it,
    it holds none ready, yet it is not short (no BelowTarget shortage)."""
    policy, clock = make(return_after=0, fallback_after=20)
    fall_back_and_recover(policy, clock)
    policy.observe("od", ids("od", 1), 0)  # od-0 gone, od-1 draining
    policy.distribute(4)
    clock.now += 30
    policy.observe("od", ids("od", 1), 0)
    assert policy.below_since("od") is None
    assert policy.report_shortage("od", None) is None


def test_members_beyond_what_a_group_was_asked_do_not_grow_it() -> None:
    """A noticed host drains while the provider launches its replacement: the group
    holds one more live member than it was asked. Asking for its live members would
    make the provider launch yet another each refresh (13 hosts for a job of 3 seen
    in the demo)."""
    policy, _clock = make()
    policy.distribute(3)
    see(policy, spot=3)
    for _ in range(3):
        policy.observe("spot", ids("spot", 4), 3)  # the replacement is launching
        asked, _ = policy.distribute(3)
        assert asked["spot"] == 3
    policy2, _ = make()
    policy2.observe("od", ids("od", 2), 2)  # members before the job's first ask
    assert policy2.distribute(0)[0]["od"] == 2  # never shrunk below them


def test_no_hand_back_while_the_job_would_fall_below_its_total() -> None:
    policy, clock = make(return_after=0)
    fall_back_and_recover(policy, clock)
    assert policy.return_candidate(4, ready(policy, spot=2, od=2)) is None
    assert policy.return_candidate(4, ready(policy, spot=3, od=2)) is not None


def test_the_base_is_never_handed_back() -> None:
    policy, _clock = make(return_after=0, on_demand_base=1)
    policy.distribute(3)
    see(policy, spot=3, od=1)  # one more than the job wants: a spot host goes
    policy.distribute(3)
    candidate = policy.return_candidate(3, ready(policy, spot=3, od=1))
    assert candidate is not None and candidate[1] == "spot"


# ---------------------------------------------------------------- demotion


def test_a_group_preempted_three_times_an_hour_is_demoted_for_an_hour() -> None:
    policy, clock = make(("a", "b", "od"))
    assert DEMOTE_AFTER_PREEMPTIONS == 3
    decisions = []
    for _ in range(DEMOTE_AFTER_PREEMPTIONS):
        decisions.append(policy.preempted("a"))
        clock.now += 60
    assert decisions[:-1] == [None, None]
    demoted = decisions[-1]
    assert demoted is not None and demoted.kind == "group_demoted"
    assert policy.default_order() == ["b", "a", "od"]
    assert policy.distribute(4)[0] == {"a": 0, "b": 4, "od": 0}
    clock.now += DEMOTION_SECONDS
    assert policy.default_order() == ["a", "b", "od"]


def test_preemptions_older_than_an_hour_do_not_count() -> None:
    policy, clock = make(("a", "b", "od"))
    policy.preempted("a")
    policy.preempted("a")
    clock.now += PREEMPTION_WINDOW_SECONDS
    assert policy.preempted("a") is None
    assert policy.default_order() == ["a", "b", "od"]


def test_the_last_group_stays_last() -> None:
    policy, _clock = make(("a", "od"))
    for _ in range(DEMOTE_AFTER_PREEMPTIONS):
        policy.preempted("a")
    assert policy.default_order() == ["a", "od"]


def test_time_backed_off_does_not_count_toward_the_next_fallback_after() -> None:
    policy, clock = make(fallback_after=30)
    policy.distribute(4)
    policy.observe("spot", ids("spot", 4), 2)  # two members stuck launching
    policy.report_shortage("spot", SHORT)
    for _ in range(3):  # 57 s backed off, below its ask all along
        clock.now += 19
        policy.distribute(4)
        policy.observe("spot", ids("spot", 4), 2)
    clock.now += 3
    policy.distribute(4)
    policy.observe("spot", ids("spot", 4), 2)
    assert policy.status("spot").short is False
    # The probe: asked anew and timed anew, not short at once for want of a signal.
    assert policy.report_shortage("spot", None) is None
