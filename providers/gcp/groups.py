"""The ``gcp`` provider's ``--group`` values: ``NAME``, ``ZONE/NAME`` or ``REGION/NAME``,
and what each group of a job is called in it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from spotring.providers.base import ConfigurationError
from spotring.providers.cloud import group_labels

# A zone is a region and a letter (us-central1-a); a region ends in its number.
_ZONE_FORM = re.compile(r"[a-z][-a-z0-9]*[0-9]-[a-z]")
_REGION_FORM = re.compile(r"[a-z][-a-z0-9]*[0-9]")
_GROUP_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1035, as Compute names


@dataclass(frozen=True)
class GroupSpec:
    """One ``--group`` value: the MIG's name and its zone or region."""

    name: str
    zone: str | None
    region: str | None

    @property
    def location(self) -> str:
        """The zone or the region."""
        return self.zone or self.region or ""


def parse_group(text: str, zone: str | None, region: str | None) -> GroupSpec:
    """``NAME`` (in ``--zone``/``--region``), ``ZONE/NAME`` (a zonal group) or
    ``REGION/NAME`` (a regional one); a zone is told from a region by its form (it ends
    in ``-`` and a letter). Raises :class:`ConfigurationError`."""
    where, _, name = text.rpartition("/")
    if not _GROUP_NAME.fullmatch(name) or where.count("/"):
        raise ConfigurationError(
            f"--group {text!r}: expected NAME, ZONE/NAME or REGION/NAME"
            " (a group name is lowercase letters, digits and hyphens)"
        )
    if not where:
        if bool(zone) == bool(region):
            raise ConfigurationError(
                f"--group {name}: give exactly one of --zone (zonal group) or --region,"
                " or write it as ZONE/NAME or REGION/NAME"
            )
        return GroupSpec(name, zone, region)
    if _ZONE_FORM.fullmatch(where):
        return GroupSpec(name, where, None)
    if _REGION_FORM.fullmatch(where):
        return GroupSpec(name, None, where)
    raise ConfigurationError(
        f"--group {text!r}: {where!r} is neither a zone (us-central1-a) nor a region (us-central1)"
    )


def group_specs(
    texts: str | Sequence[str] | None, zone: str | None, region: str | None
) -> list[tuple[GroupSpec, str]]:
    """Every ``--group`` value parsed, in order, with its :meth:`GcpProvider.group_name`:
    the name alone where no other group has it, else ``LOCATION/NAME``. Raises
    :class:`ConfigurationError` for none, a malformed one or one given twice."""
    values = [texts] if isinstance(texts, str) else list(texts or ())
    if not values or not all(values):
        raise ConfigurationError("--group is required for --provider gcp")
    specs = [parse_group(text, zone, region) for text in values]
    labels = group_labels([(spec.location, spec.name) for spec in specs])
    return list(zip(specs, labels, strict=True))


__all__ = ["GroupSpec", "group_specs", "parse_group"]
