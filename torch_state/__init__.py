"""spotring for PyTorch training scripts.

``from spotring.torch import TorchState``: the Horovod path's state, a drop-in for
``hvd.elastic.TorchState`` whose commits copy into preallocated buffers (see
:mod:`spotring.worker_image.state`); importing that name imports ``horovod.torch``.

``from spotring.torch import inplace``: the torch.distributed backend's in-place mode
(:mod:`spotring.torch.inplace`), which imports no Horovod. Nothing else of spotring
imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotring.worker_image.state import Offload, TorchState

__all__ = ["Offload", "TorchState"]


def __getattr__(name: str) -> Any:
    # PEP 562: the Horovod path's names load Horovod only when asked for, so the
    # torch backend's modules (spotring.torch.inplace, ...) import without it.
    if name in __all__:
        from spotring.worker_image import state

        return getattr(state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
