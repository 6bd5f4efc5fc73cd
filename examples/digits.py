"""The digits examples' model, data and sample audit, shared by ``train_digits.py``
(Horovod) and ``train_digits_torch.py`` (the torch backend, in place). Imports no
Horovod."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(64, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(x)))


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (pixels, labels), read from the file its ``load_digits``
    reads, without importing scikit-learn: that import costs a worker's start as much
    as torch's does."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the digits examples need scikit-learn's data: pip install scikit-learn")
    csv = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    with gzip.open(csv, "rt") as stream:
        table = np.loadtxt(stream, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """The digits, shuffled (seed 0): 80 % to train, the rest to test."""
    pixels, labels = load_digits()
    x = torch.tensor(pixels / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])


class SampleIds(torch.utils.data.Dataset):
    """A dataset's items with their index appended; a negative index ``-1 - i`` stands
    for sample ``i`` repeated as padding (the samplers that mark their padding so)."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        sample = -1 - index if index < 0 else index
        return (*self.dataset[sample], torch.tensor(index))


def marked_padding(padding: list[int]) -> list[int]:
    """Padding indices marked as ``-1 - index``, so that they can be left out of the
    loss and of the count (see :class:`SampleIds`)."""
    return [-1 - i for i in padding]


def padded_loss(logits: torch.Tensor, targets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The batch's loss with padding weighing nothing: each sample once per epoch."""
    real = (ids >= 0).float()
    losses = F.cross_entropy(logits, targets, reduction="none")
    return (losses * real).sum() / real.sum().clamp(min=1)


def sample_counts(everyone: torch.Tensor, total: int) -> torch.Tensor:
    """How often each of ``total`` samples appears among ``everyone``'s ids (padding
    left out)."""
    return torch.bincount(everyone[everyone >= 0], minlength=total).to(torch.int32)


def audit(seen: torch.Tensor) -> dict[str, int]:
    """An epoch's sample counts summed up."""
    return {
        "samples": len(seen),
        "once": int((seen == 1).sum()),
        "missing": int((seen == 0).sum()),
        "repeated": int((seen > 1).sum()),
    }
