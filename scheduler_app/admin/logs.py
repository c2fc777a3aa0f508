"""The log admin: read-only rows from LOG_DATABASE, filtered like scheduler.get_logs()."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, time
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from scheduler_app.admin.common import ReadOnlyAdmin
from scheduler_app.logs import log_alias
from scheduler_app.models import ExecutionLog


class InputFilter(admin.SimpleListFilter):
    """A filter typed into a text box: its value goes to ``lookup`` as it is."""

    template = "admin/scheduler_app/input_filter.html"
    lookup = ""
    placeholder = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("", "any")]

    def convert(self, request: HttpRequest, value: str) -> Any:
        return value

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = (self.value() or "").strip()
        if not value:
            return queryset
        converted = self.convert(request, value)
        return queryset if converted is None else queryset.filter(**{self.lookup: converted})

    def choices(self, changelist: Any) -> Iterator[Any]:
        everything = next(iter(super().choices(changelist)))
        params = changelist.get_filters_params()
        yield {
            **everything,
            "parameter_name": self.parameter_name,
            "value": self.value(),
            "placeholder": self.placeholder,
            "query_parts": [(name, values) for name, values in params.items() if name != self.parameter_name],
        }


class TaskFilter(InputFilter):
    title = "task id"
    parameter_name = "task_id"
    lookup = "task_id"


class SourceFilter(InputFilter):
    title = "trigger source"
    parameter_name = "trigger_source"
    lookup = "trigger_source"


class InstantFilter(InputFilter):
    placeholder = "YYYY-MM-DD or YYYY-MM-DD HH:MM"

    def convert(self, request: HttpRequest, value: str) -> datetime | None:
        try:
            moment = parse_datetime(value)
            day = None if moment else parse_date(value)
        except ValueError:
            moment = day = None
        if day is not None:
            moment = datetime.combine(day, time())
        if moment is None:
            messages.warning(request, f"Ignored the {self.title} filter: not a date or date and time.")
            return None
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


class StartedAfterFilter(InstantFilter):
    title = "started after"
    parameter_name = "started_after"
    lookup = "started_at__gte"


class StartedBeforeFilter(InstantFilter):
    title = "started before"
    parameter_name = "started_before"
    lookup = "started_at__lt"


@admin.register(ExecutionLog)
class ExecutionLogAdmin(ReadOnlyAdmin):
    list_display = (
        "task_id",
        "task_name",
        "status",
        "attempt",
        "trigger_type",
        "trigger_source",
        "started_at",
        "finished_at",
        "duration_ms",
        "occurrence_id",
    )
    list_filter = (
        TaskFilter,
        "status",
        "trigger_type",
        SourceFilter,
        StartedAfterFilter,
        StartedBeforeFilter,
    )
    search_fields = ("task_id", "task_name", "occurrence_id")

    def get_queryset(self, request: HttpRequest) -> QuerySet[ExecutionLog]:
        return super().get_queryset(request).using(log_alias())
