"""Combining a cloud's several state tables into one :class:`InstanceState`."""

from __future__ import annotations

from collections.abc import Mapping

from spotring.providers.base import InstanceState

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
