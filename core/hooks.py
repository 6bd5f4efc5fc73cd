"""The markers of spotring's pluggy hooks.

The hook specifications themselves are in ``spotring.autoscaler.hookspecs``; the
markers live here so a plugin (a provider module among them) marks its hooks without
importing the controller. ``spotring.autoscaler.hookimpl`` is the same object.
"""

from __future__ import annotations

import pluggy

PROJECT = "spotring"
"""pluggy's project name: the markers' and the plugin manager's."""

hookspec = pluggy.HookspecMarker(PROJECT)
"""Marks a function of ``spotring.autoscaler.hookspecs`` as a hook specification."""

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's function as an implementation of one of spotring's hooks."""
