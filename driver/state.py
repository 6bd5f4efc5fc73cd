"""The old import path of spotring's ``TorchState``, kept working.

``TorchState`` runs in the workers, so it lives in :mod:`spotring.worker_image.state`;
write ``from spotring.torch import TorchState``. ``from spotring.driver.state import
TorchState`` gives the same class.
"""

from spotring.torch import Offload, TorchState

__all__ = ["Offload", "TorchState"]
