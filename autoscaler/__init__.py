"""spotring's controller: plugin manager, inventory, reconcile loop and CLI."""

from spotring.core.hooks import hookimpl

__all__ = ["hookimpl"]
