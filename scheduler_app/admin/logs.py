"""The log admin: read-only rows from LOG_DATABASE, filtered like scheduler.get_logs()."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, time
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString

from scheduler_app.admin import display
from scheduler_app.admin.common import ReadOnlyAdmin
from scheduler_app.logs import ids_of, log_alias
from scheduler_app.models import Execution, ExecutionLog


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


class OccurrenceFilter(InputFilter):
    title = "occurrence id"
    parameter_name = "occurrence_id"
    lookup = "occurrence_id"

    def convert(self, request: HttpRequest, value: str) -> Any:
        try:
            return uuid.UUID(value)
        except ValueError:
            messages.warning(request, "Ignored the occurrence id filter: not a UUID.")
            return None


class LogOccurrenceFilter(OccurrenceFilter):
    """The log rows of one occurrence, read by their ids: the log table has no index on occurrence_id."""

    lookup = "id__in"

    def convert(self, request: HttpRequest, value: str) -> Any:
        occurrence_id = super().convert(request, value)
        if occurrence_id is None:
            return None
        attempts = Execution.objects.filter(occurrence_id=occurrence_id).values_list("attempt", flat=True)
        reached = attempts.first()
        return [] if reached is None else ids_of(occurrence_id, reached)


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
        "task",
        "task_name",
        "status",
        "attempt",
        "trigger_type",
        "trigger_source",
        "started",
        "finished",
        "duration",
        "execution",
    )
    list_filter = (
        TaskFilter,
        LogOccurrenceFilter,
        "status",
        "trigger_type",
        SourceFilter,
        StartedAfterFilter,
        StartedBeforeFilter,
    )
    # Exact task ids only: a search for part of a text column reads every log row.
    search_fields = ("=task_id",)
    search_help_text = "An exact task id."

    @admin.display(description="task id", ordering="task_id")
    def task(self, log: ExecutionLog) -> SafeString:
        return format_html('<a href="{}">{}</a>', display.changelist("task", q=log.task_id), log.task_id)

    started = display.instant_column("started_at", "started")
    finished = display.instant_column("finished_at", "finished")

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, log: ExecutionLog) -> str:
        return display.NONE if log.duration_ms is None else display.seconds_text(log.duration_ms / 1000)

    @admin.display(description="execution")
    def execution(self, log: ExecutionLog) -> SafeString:
        url = display.changelist("execution", occurrence_id=str(log.occurrence_id))
        return format_html('<a href="{}">{}</a>', url, log.occurrence_id)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ExecutionLog]:
        return super().get_queryset(request).using(log_alias())
