"""The torch restart mode's pure parts: ranks over the hosts' slots, torchrun's
environment, the port of each attempt's store, and what counts as a membership change."""

from __future__ import annotations

import socket

import pytest

from spotring.driver.torch_restart import (
    Attempt,
    Slot,
    assign_ranks,
    free_port,
    membership_change,
    torchrun_env,
)


def test_ranks_are_consecutive_per_host_and_stop_at_the_most_workers() -> None:
    slots = assign_ranks({"b": 2, "a": 3, "c": 2}, max_workers=4)
    assert slots == [
        Slot("b", 0, 0, 0, 2),
        Slot("b", 1, 1, 0, 2),
        Slot("a", 0, 2, 1, 2),  # a gets the 2 slots left: its local world size is 2
        Slot("a", 1, 3, 1, 2),
    ]  # c is left out, so it has no group rank


def test_a_host_with_no_slot_left_takes_no_group_rank() -> None:
    slots = assign_ranks({"a": 2, "b": 0, "c": 1}, max_workers=8)
    assert [(s.host, s.rank, s.group_rank) for s in slots] == [
        ("a", 0, 0),
        ("a", 1, 0),
        ("c", 2, 1),
    ]


ATTEMPT = Attempt(
    world_size=3,
    group_world_size=2,
    master_addr="10.0.0.5",
    master_port=29511,
    run_id="r1",
    restart_count=2,
    max_restarts=3,
)


def test_the_environment_is_torchruns() -> None:
    env = torchrun_env(Slot("a", 1, 1, 0, 2), ATTEMPT, omp_num_threads=None)
    assert env == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "0",
        "ROLE_RANK": "1",
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "3",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "3",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29511",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "r1",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",  # torchrun's default with several workers per host
    }


@pytest.mark.parametrize(
    ("local_world_size", "user", "expected"), [(1, None, None), (2, "4", "4"), (1, "4", "4")]
)
def test_omp_threads_as_torchrun_sets_them(
    local_world_size: int, user: str | None, expected: str | None
) -> None:
    env = torchrun_env(Slot("a", 0, 0, 0, local_world_size), ATTEMPT, omp_num_threads=user)
    assert env.get("OMP_NUM_THREADS") == expected


def test_each_attempt_gets_a_port_no_earlier_attempt_had() -> None:
    picks = iter([29500, 29501, 29502])
    assert free_port("127.0.0.1", [29500, 29501], lambda address: next(picks)) == 29502


def test_the_kernel_picks_a_free_port() -> None:
    port = free_port("127.0.0.1", ())
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))  # free: nothing listens there


@pytest.mark.parametrize(
    ("hosts_now", "size", "expected"),
    [
        ({"a": 1, "b": 1}, 2, ""),
        ({"a": 1}, 2, "b left"),  # gone, failed, or draining after its notice
        ({"a": 1, "b": 1, "c": 1}, 2, "c joined"),
        ({"a": 1, "b": 1, "c": 1}, 3, ""),  # already at --max-np: a new host waits
    ],
)
def test_membership_changes(hosts_now: dict[str, int], size: int, expected: str) -> None:
    assert membership_change({"a", "b"}, size, hosts_now, max_workers=3) == expected
