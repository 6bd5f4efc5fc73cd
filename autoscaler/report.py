"""Deprecated path of :mod:`spotring.autoscaler.observers.report` (``spotring report``), kept so
that existing imports work: import from ``spotring.autoscaler.observers.report``."""

from spotring.autoscaler.observers.report import (
    NO_PROGRESS_LABEL,
    NO_PROGRESS_NOTE,
    ReportError,
    Run,
    chart_png,
    cost_line,
    group_cost_line,
    read_events,
    render_html,
    write_report,
)

__all__ = [
    "NO_PROGRESS_LABEL",
    "NO_PROGRESS_NOTE",
    "ReportError",
    "Run",
    "chart_png",
    "cost_line",
    "group_cost_line",
    "read_events",
    "render_html",
    "write_report",
]
