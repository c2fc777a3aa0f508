"""How the admin pages show instants, durations and the links between tasks, executions, logs and
runners: to the second, in UTC, the way the journal records them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

NONE = "-"


def instant(value: datetime | None) -> SafeString | str:
    """An instant to the second in UTC; hovering shows it to the microsecond."""
    if value is None:
        return NONE
    utc = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}">{} UTC</time>',
        utc.isoformat(),
        utc.isoformat(),
        f"{utc:%Y-%m-%d %H:%M:%S}",
    )


def instant_column(
    field: str, description: str, *, sortable: bool = True
) -> Callable[[Any, Any], SafeString | str]:
    """An admin column or read-only field showing a model's instant to the second."""

    @admin.display(description=description, ordering=field if sortable else None)
    def column(model_admin: Any, obj: Any) -> SafeString | str:
        return instant(getattr(obj, field)) if obj is not None else NONE

    return column


def duration(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end``: milliseconds under a second, then seconds, minutes, hours."""
    if start is None or end is None:
        return NONE
    return seconds_text((end - start).total_seconds())


def seconds_text(seconds: float) -> str:
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{sign}{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{sign}{minutes} min {rest:02d} s"
    hours, rest = divmod(round(seconds) // 60, 60)
    return f"{sign}{hours} h {rest:02d} min"


def changelist(model_name: str, **query: Any) -> str:
    url = reverse(f"admin:scheduler_app_{model_name}_changelist")
    return f"{url}?{urlencode(query)}" if query else url


def task_link(task_id: str, exists: bool = True) -> SafeString:
    if not exists:
        return format_html("{} <small>(deleted)</small>", task_id)
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:scheduler_app_task_change", args=[quote(task_id)]), task_id
    )


def runner_link(node_id: str) -> SafeString | str:
    if not node_id:
        return NONE
    return format_html('<a href="{}">{}</a>', changelist("runner", q=node_id), node_id)
