"""The scale sets of a job: ``--group`` (``NAME`` or ``RESOURCE_GROUP/NAME``, given once
per set) read into a :class:`ScaleSetSpec` each, with its label in the job."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from spotring.providers.base import ConfigurationError
from spotring.providers.cloud import group_labels


@dataclass(frozen=True)
class ScaleSetSpec:
    """One ``--group``: a scale set, its resource group, and its name in the job."""

    resource_group: str
    name: str
    label: str
    """What :meth:`AzureProvider.group_name` answers: unique within the job."""


def scale_set_specs(options: argparse.Namespace) -> list[ScaleSetSpec]:
    """The scale sets ``--group`` names (``NAME`` or ``RG/NAME``), in the order given.

    ARM names are case-insensitive, so ``rg/Workers`` and ``RG/workers`` are the same
    set: named twice, it is a :class:`ConfigurationError`. A set's label is its name,
    or ``RG/NAME`` where another set of the job has the same name.
    """
    given = getattr(options, "azure_group", None)
    values = [given] if isinstance(given, str) else list(given or [])
    default_rg = getattr(options, "azure_resource_group", None) or ""
    if not values:
        raise ConfigurationError("--group is required for --provider azure")
    pairs: list[tuple[str, str]] = []
    for value in values:
        rg, _, name = value.strip().rpartition("/")
        if "/" in rg or not name or (value.strip().count("/") and not rg):
            raise ConfigurationError(f"--group {value!r}: write NAME or RESOURCE_GROUP/NAME")
        rg = rg or default_rg
        if not rg:
            raise ConfigurationError(
                f"--group {name}: no resource group (pass --resource-group, or write"
                f" --group RESOURCE_GROUP/{name})"
            )
        pairs.append((rg, name))
    labels = group_labels(pairs, fold=str.lower)
    return [ScaleSetSpec(rg, name, label) for (rg, name), label in zip(pairs, labels, strict=True)]
