"""The deadline policy (``spotring run --deadline``): the parse of WHEN, the projection,
uniform progress, hysteresis and the safety net on a fake clock, and its answers to the
decision hooks through a real plugin manager (a plugin's answer still wins)."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from spotring.autoscaler import hookimpl
from spotring.autoscaler.capacity import CapacityOptions, GroupStatus
from spotring.autoscaler.cli import main
from spotring.autoscaler.composition import deadline_policy
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.deadline import (
    DeadlineOptions,
    DeadlinePolicy,
    Mode,
    deadline_plugin,
    parse_deadline,
)
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import ConfigurationError, Instance, InstanceState, JobShape, Lifecycle
from tests.fakes.scripted import ScriptedProvider
from tests.unit.test_group_set import Pool

NOW = 1_000_000.0
JOB = JobShape(num_proc=4, min_num_proc=1, max_num_proc=4)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ WHEN


@pytest.mark.parametrize(("when", "seconds"), [("90s", 90), ("45m", 2700), ("2h", 7200)])
def test_a_duration_counts_from_now(when: str, seconds: float) -> None:
    assert parse_deadline(when, NOW) == NOW + seconds


def test_an_iso_time_is_that_moment() -> None:
    moment = datetime.datetime(2030, 1, 2, 3, 4, tzinfo=datetime.UTC)
    assert parse_deadline("2030-01-02T03:04Z", NOW) == moment.timestamp()
    assert parse_deadline("2030-01-02T05:04+02:00", NOW) == moment.timestamp()


@pytest.mark.parametrize("when", ["", "5x", "-3m", "0s", "h", "tomorrow", "1970-01-01T00:00Z"])
def test_anything_else_is_refused(when: str) -> None:
    with pytest.raises(ValueError, match="--deadline"):
        parse_deadline(when, NOW)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--deadline", "5x", "--total-steps", "9"], "give a duration (90s, 45m, 2h)"),
        (["--deadline", "2020-01-01T00:00Z", "--total-steps", "9"], "is not in the future"),
        (["--deadline", "5m"], "--deadline needs --total-steps N or --total-epochs N"),
        (["--total-steps", "9"], "--total-steps is for --deadline WHEN"),
        (["--total-epochs", "9"], "--total-epochs is for --deadline WHEN"),
        (["--deadline", "5m", "--total-steps", "0"], "--total-steps"),
        (["--deadline", "5m", "--total-epochs", "0"], "--total-epochs"),
        (
            ["--deadline", "5m", "--total-steps", "9", "--total-epochs", "9"],
            "give --total-steps or --total-epochs, not both",
        ),
    ],
)
def test_bad_deadline_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--provider", "local", "-np", "1", *args, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err and "Traceback" not in err


# ------------------------------------------------------------------ the policy


def policy(
    clock: Clock, deadline_s: float = 1000.0, steps: int = 1000, restart: float = 50.0
) -> DeadlinePolicy:
    return DeadlinePolicy(DeadlineOptions(NOW + deadline_s, steps, 4, restart), clock=clock)


def test_the_rate_is_per_slot_so_a_bigger_ring_projects_sooner() -> None:
    clock = Clock()
    deadline = policy(clock)
    deadline.ring_progress(1, 2, 10)  # the first commit: the rate is measured from here
    clock.now += 100
    deadline.ring_progress(1, 2, 210)  # 200 steps in 200 slot-seconds: 1 per slot-second
    small = deadline.project()
    assert small.rate_per_slot == pytest.approx(1.0)
    assert small.projected_finish == pytest.approx(clock.now + 790 / 2)
    assert small.needed_s == pytest.approx(790 / 4)  # on a full ring of -np slots
    assert small.slack_s == pytest.approx(900 - 790 / 4)
    deadline.ring_progress(2, 4, 0)  # a ring of 4 formed: its steps count from 0
    bigger = deadline.project()
    assert bigger.done == 210
    assert bigger.projected_finish == pytest.approx(clock.now + 790 / 4)


def test_with_total_epochs_the_work_is_the_epochs_the_rings_commit() -> None:
    """An epoch's samples split across the ring: the steps per epoch fall as it grows,
    so steps would not measure the work; the sampler's position does."""
    clock = Clock()
    options = DeadlineOptions(NOW + 1000, None, 4, 50.0, total_epochs=10)
    deadline = DeadlinePolicy(options, clock=clock)
    deadline.ring_progress(1, 2, 1, 0.5)  # restored mid-epoch: counted from here
    clock.now += 100
    deadline.ring_progress(1, 2, 400, 2.5)  # 2 epochs in 200 slot-seconds
    small = deadline.project()
    assert (small.done, small.total) == (2.5, 10)
    assert small.rate_per_slot == pytest.approx(0.01)
    assert small.projected_finish == pytest.approx(clock.now + 7.5 / 0.02)
    assert small.needed_s == pytest.approx(7.5 / 0.04)
    assert small.expected == pytest.approx(1.0)  # a tenth of the way to the deadline
    assert deadline.decide()[0] is Mode.SPOT  # 2.5 epochs done, 1 due
    deadline.ring_progress(2, 4, 0, 2.5)  # a bigger ring: its steps start again, not the epochs
    assert deadline.project().done == 2.5
    clock.now += 600
    deadline.ring_progress(2, 4, 50, 2.6)  # far too slow now: behind uniform progress
    assert deadline.decide()[0] is not Mode.SPOT


def test_total_epochs_and_total_steps_are_one_or_the_other() -> None:
    for steps, epochs in ((None, None), (10, 10)):
        with pytest.raises(ValueError, match="--total-steps and --total-epochs"):
            DeadlinePolicy(DeadlineOptions(NOW + 60, steps, 4, total_epochs=epochs))


def test_the_rate_is_unknown_until_measured_for_a_restart() -> None:
    clock = Clock()
    deadline = policy(clock, restart=50)
    deadline.ring_progress(1, 4, 0)
    clock.now += 500  # the hosts' boot and the first formation: not in the rate
    deadline.ring_progress(1, 4, 10)
    clock.now += 49
    deadline.ring_progress(1, 4, 206)
    assert deadline.project().rate_per_slot is None
    clock.now += 1
    assert deadline.project().rate_per_slot == pytest.approx(196 / 200)


def test_no_step_since_the_first_commit_is_no_rate() -> None:
    clock = Clock()
    deadline = policy(clock, restart=50)
    deadline.ring_progress(1, 4, 10)
    clock.now += 100
    deadline.ring_progress(1, 4, 10)  # a ring that commits less often than it reports
    projection = deadline.decide()[1]
    assert projection.rate_per_slot is None and projection.slack_s is None


def test_a_rings_formation_is_not_in_the_rate() -> None:
    """C(t) is the compute the rest needs, a restart its own cost (the paper's d): a
    formation counted in the rate would be extrapolated over the whole job (on the Can't
    Be Late traces a few early hand-backs tripped the safety net with hours of slack)."""
    clock = Clock()
    deadline = policy(clock, deadline_s=10_000, steps=10_000)
    deadline.ring_progress(1, 4, 10)
    clock.now += 100
    deadline.ring_progress(1, 4, 410)  # 400 steps in 400 slot-seconds
    clock.now += 30
    deadline.ring_progress(2, 4, 0)  # a host changed: the ring formed again since
    clock.now += 10
    deadline.ring_progress(2, 4, 40)  # its first commit: timed from here
    clock.now += 100
    deadline.ring_progress(2, 4, 440)
    projection = deadline.project()
    assert projection.rate_per_slot == pytest.approx(1.0)  # not 840 steps in 960 slot-seconds
    assert projection.slack_s == pytest.approx(10_000 - 240 - (10_000 - 850) / 4)


def test_no_ring_makes_no_progress_and_projects_no_finish() -> None:
    clock = Clock()
    deadline = policy(clock)
    deadline.ring_progress(1, 4, 10)
    clock.now += 50
    deadline.ring_progress(1, 4, 210)
    deadline.ring_lost()
    clock.now += 50
    lost = deadline.project()
    assert lost.projected_finish is None and lost.ring_slots == 0
    assert lost.rate_per_slot == pytest.approx(1.0)  # the time with no ring costs no slots


def test_ahead_of_uniform_progress_it_waits_for_spot_behind_it_catches_up() -> None:
    clock = Clock()
    deadline = policy(clock, deadline_s=1000, steps=1000, restart=10)
    deadline.ring_progress(1, 4, 0)
    clock.now += 100
    deadline.ring_progress(1, 4, 150)  # 150 done, 100 due
    assert deadline.decide()[0] is Mode.SPOT
    deadline.ring_lost()
    clock.now += 100  # spot gone: no progress, 200 due
    mode, projection = deadline.decide()
    assert mode is Mode.CATCH_UP and projection.expected == pytest.approx(200)


def test_hysteresis_keeps_catching_up_until_two_restarts_ahead() -> None:
    clock = Clock()
    deadline = policy(clock, deadline_s=10_000, steps=10_000, restart=100)
    deadline.ring_progress(1, 1, 1)  # a ring of 1 slot of -np 4: slack aplenty
    clock.now += 1000
    deadline.ring_progress(1, 1, 900)  # 900 of 1,000 due: behind
    assert deadline.decide()[0] is Mode.CATCH_UP
    deadline.ring_progress(1, 1, 1100)  # ahead of ep(t), not of ep(t + 2d) = 1,200
    assert deadline.decide()[0] is Mode.CATCH_UP
    deadline.ring_progress(1, 1, 1200)
    assert deadline.decide()[0] is Mode.SPOT


def test_the_safety_net_holds_for_the_rest_of_the_job() -> None:
    clock = Clock()
    deadline = policy(clock, deadline_s=1000, steps=1000, restart=50)
    deadline.ring_progress(1, 4, 1)
    clock.now += 400
    deadline.ring_progress(1, 4, 401)  # 400 in 1,600 slot-s: 599 left need 599 s of 600
    mode, projection = deadline.decide()
    assert mode is Mode.SAFETY_NET and projection.slack_s == pytest.approx(1)
    clock.now += 1
    deadline.ring_progress(1, 4, 999)  # far ahead now: still on-demand for the rest
    assert deadline.decide()[0] is Mode.SAFETY_NET
    deadline.ring_progress(1, 4, 1000)
    assert deadline.decide()[0] is Mode.DONE


def test_before_the_rate_is_known_there_is_no_safety_net() -> None:
    clock = Clock()
    deadline = policy(clock, deadline_s=1000, restart=400)
    deadline.ring_progress(1, 4, 1)
    clock.now += 1
    mode, projection = deadline.decide()
    assert projection.slack_s is None and mode is Mode.SPOT  # 1 step done, 1 due


# ------------------------------------------------------------------ the hooks


def status(name: str, lifecycle: Lifecycle, position: int) -> GroupStatus:
    return GroupStatus(name, lifecycle, position, 2, 0, 0, False, None, 0.0, 0.0, 0, 0.0)


SPOT = status("spot", Lifecycle.SPOT, 0)
OD = status("od", Lifecycle.ON_DEMAND, 1)


def host(lifecycle: Lifecycle) -> Instance:
    return Instance("i-1", "a", InstanceState.READY, 1, lifecycle, group=lifecycle.value)


class Recorder:
    def __init__(self) -> None:
        self.modes: list[str] = []

    @hookimpl
    def spotring_deadline_decided(self, mode: str, reason: str, slack_s: float | None) -> None:
        self.modes.append(mode)


class AlwaysFallBack:
    @hookimpl
    def spotring_fall_back_hosts(self, hosts: int) -> int:
        return hosts


def answers(clock: Clock, deadline: DeadlinePolicy | None, *plugins: object) -> dict[str, object]:
    pm = get_plugin_manager(load_entry_points=False)
    for plugin in plugins:
        pm.register(plugin)
    with deadline_plugin(pm, deadline):
        hook = pm.hook
        return {
            "order": hook.spotring_order_groups(groups=[SPOT, OD], job=JOB),
            "fall_back": hook.spotring_fall_back_hosts(
                group=OD, short=SPOT, hosts=2, total=4, job=JOB
            ),
            "hand_od_back": hook.spotring_return_to_spot(
                instance=host(Lifecycle.ON_DEMAND), group=OD, job=JOB
            ),
            "hand_spot_back": hook.spotring_return_to_spot(
                instance=host(Lifecycle.SPOT), group=SPOT, job=JOB
            ),
        }


def ahead(clock: Clock) -> DeadlinePolicy:
    deadline = policy(clock)
    deadline.ring_progress(1, 4, 1)
    clock.now += 100
    deadline.ring_progress(1, 4, 201)
    return deadline


def test_ahead_a_short_spot_group_does_not_fall_back_to_on_demand() -> None:
    clock = Clock()
    recorder = Recorder()
    got = answers(clock, ahead(clock), recorder)
    assert got == {"order": ["spot", "od"], "fall_back": 0, "hand_od_back": True,
                   "hand_spot_back": True}  # fmt: skip
    assert recorder.modes == ["spot"]  # once, not once per hook


def test_a_plugins_answer_still_wins() -> None:
    clock = Clock()
    assert answers(clock, ahead(clock), AlwaysFallBack())["fall_back"] == 2


def test_behind_it_falls_back_and_keeps_on_demand_hosts() -> None:
    clock = Clock()
    deadline = policy(clock, restart=10)
    clock.now += 100  # nothing done, 100 due
    got = answers(clock, deadline)
    assert got["fall_back"] == 2 and got["hand_od_back"] is False  # the rate unknown: all


def test_the_safety_net_asks_on_demand_first_and_hands_spot_back() -> None:
    clock = Clock()
    deadline = policy(clock, restart=100)
    deadline.ring_progress(1, 4, 1)
    clock.now += 100
    deadline.ring_progress(1, 4, 101)  # 899 need 899 s of 900: slack 1 < 2d
    recorder = Recorder()
    got = answers(clock, deadline, recorder)
    assert got == {"order": ["od", "spot"], "fall_back": 2, "hand_od_back": False,
                   "hand_spot_back": True}  # fmt: skip
    assert recorder.modes == ["safety-net"]


def test_without_a_deadline_spotrings_defaults_answer() -> None:
    got = answers(Clock(), None)
    assert got["fall_back"] == 2 and got["hand_od_back"] is True


def test_a_job_of_one_group_cannot_have_a_deadline() -> None:
    with pytest.raises(ConfigurationError, match="--deadline needs a job of several groups"):
        deadline_policy(NOW + 60, (10, None), 5.0, JOB, [ScriptedProvider()])
    assert deadline_policy(None, (None, None), 5.0, JOB, [ScriptedProvider()]) is None


def behind_with_two_slots_enough(clock: Clock) -> DeadlinePolicy:
    """Behind uniform progress (81 of 100 steps due), at 0.8 steps per slot-second: the
    919 left need 2 slots to finish 3d before the deadline (919 / 0.8 / 750 s)."""
    deadline = policy(clock)
    deadline.ring_progress(1, 1, 1)
    clock.now += 100
    deadline.ring_progress(1, 1, 81)
    return deadline


def test_behind_the_on_demand_group_is_asked_only_for_the_hosts_that_close_the_gap() -> None:
    clock = Clock()
    deadline = behind_with_two_slots_enough(clock)
    assert deadline.hosts_to_finish(4) == 2
    spot = Pool("spot", Lifecycle.SPOT, capacity=1)  # short: 3 of the job's 4 hosts missing
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=10)
    pm = get_plugin_manager(load_entry_points=False)
    with deadline_plugin(pm, deadline):
        controller = Controller([spot, od], pm.hook, job=JOB)
        controller.step()
        controller.step()
    assert deadline.mode is Mode.CATCH_UP
    assert od.targets[-1] == 1  # with the spot host, 2 slots: not the 3 spot lacks


def test_an_unknown_rate_or_no_time_left_asks_for_the_whole_shortfall() -> None:
    clock = Clock()
    assert policy(clock).hosts_to_finish(4) is None  # no rate yet
    deadline = behind_with_two_slots_enough(clock)
    clock.now += 760  # 140 s left: less than the margin and a restart (3d)
    assert deadline.hosts_to_finish(4) is None


def test_ahead_with_spot_short_the_on_demand_hosts_held_are_kept() -> None:
    """Ahead with spot short, no on-demand host is bought and none held is handed back:
    the work left costs the same on-demand host-hours on fewer of them, and a hand-back
    costs a restart (and a boot if it is bought again): 7 of 90 simulated flapping-pool
    traces cost more than today's policy for it (bench/deadline_sim.py)."""
    clock, capacity_clock = Clock(), Clock()
    deadline = policy(clock)
    clock.now += 100  # nothing done, 100 steps due: behind, the rate unknown: all of it
    spot = Pool("spot", Lifecycle.SPOT, capacity=2)  # short: 2 of the job's 4 hosts
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=10)
    pm = get_plugin_manager(load_entry_points=False)
    with deadline_plugin(pm, deadline):
        controller = Controller([spot, od], pm.hook, job=JOB,
                                capacity=CapacityOptions(return_after=0),
                                capacity_clock=capacity_clock)  # fmt: skip
        for _ in range(3):
            controller.step()
            capacity_clock.now += 1
        assert od.targets[-1] == 2 and deadline.mode is Mode.CATCH_UP
        deadline.ring_progress(1, 4, 1)
        clock.now += 100
        deadline.ring_progress(1, 4, 901)  # far ahead now
        for _ in range(3):
            controller.step()
            capacity_clock.now += 1
        assert deadline.mode is Mode.SPOT
        assert controller.inventory is not None
        states = {i.state for i in controller.inventory.instances}
        assert states == {InstanceState.READY}  # none draining
        assert od.removed == [] and od.targets[-1] == 2


def fall_back_hosts(deadline: DeadlinePolicy, held: int, hosts: int) -> int:
    """The deadline plugin's answer for the on-demand group holding ``held`` hosts,
    ``hosts`` of the job's 4 still wanted."""
    pm = get_plugin_manager(load_entry_points=False)
    with deadline_plugin(pm, deadline):
        group = dataclasses.replace(OD, live=held, ready=held)
        return pm.hook.spotring_fall_back_hosts(
            group=group, short=SPOT, hosts=hosts, total=4, job=JOB
        )


def test_ahead_nothing_is_bought_and_what_is_held_is_kept() -> None:
    clock = Clock()
    deadline = ahead(clock)  # 0.5 steps per slot-second, 799 left: 3 slots by D - 3d
    assert deadline.hosts_to_finish(4) == 3
    assert fall_back_hosts(deadline, held=2, hosts=2) == 2  # not 1: kept while spot is short
    assert fall_back_hosts(deadline, held=0, hosts=2) == 0  # nothing bought while ahead


def test_catching_up_the_hosts_held_are_kept_when_fewer_would_do() -> None:
    clock = Clock()
    deadline = behind_with_two_slots_enough(clock)
    assert fall_back_hosts(deadline, held=3, hosts=4) == 3  # 2 would do: no restart for it


def test_catching_up_a_purchase_has_a_restarts_time_of_headroom() -> None:
    """Nothing progresses while the hosts bought boot: sized without headroom, a minute
    later the need can be one host more, bought in a second step (a second restart)."""
    clock = Clock()
    deadline = behind_with_two_slots_enough(clock)
    clock.now += 20  # 2 hosts finish by D - 3d; with d more of headroom, 3
    assert (deadline.hosts_to_finish(4), deadline.hosts_to_finish(4, 50.0)) == (2, 3)
    assert fall_back_hosts(deadline, held=0, hosts=4) == 3
    assert fall_back_hosts(deadline, held=2, hosts=4) == 2  # holding enough: no growth
