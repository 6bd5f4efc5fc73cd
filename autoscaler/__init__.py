"""spotring's controller: plugin manager, inventory, reconcile loop and CLI."""

from spotring.autoscaler.hookspecs import hookimpl

__all__ = ["hookimpl"]
