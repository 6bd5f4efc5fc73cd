"""spotring for PyTorch training scripts: ``from spotring.torch import TorchState``.

:class:`TorchState` is a drop-in for ``hvd.elastic.TorchState`` whose commits copy into
preallocated buffers (see :mod:`spotring.worker_image.state`). Importing this module
imports torch and ``horovod.torch``; nothing else of spotring imports it.
"""

from spotring.worker_image.state import Offload, TorchState

__all__ = ["Offload", "TorchState"]
