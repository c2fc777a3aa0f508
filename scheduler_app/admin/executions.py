"""The execution journal admin: read-only rows, their history, and the operator's repairs."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from scheduler_app import listing
from scheduler_app.admin import display, resolve
from scheduler_app.admin.common import ObjectActions, ReadOnlyAdmin, actor, tell
from scheduler_app.admin.logs import OccurrenceFilter, TaskFilter
from scheduler_app.exceptions import SchedulerError
from scheduler_app.models import (
    LEASED,
    RESOLVE_UNKNOWN_PERMISSION,
    TERMINAL,
    Execution,
    ExecutionEvent,
    LogPersistence,
    Status,
    Task,
)
from scheduler_app.services import scheduler

# Unknown first: those are the rows waiting for an operator.
STATUS_ORDER = (
    Status.UNKNOWN,
    Status.PENDING,
    Status.CLAIMED,
    Status.RUNNING,
    Status.FAILED,
    Status.INTERRUPTED,
    Status.SUCCESS,
    Status.DISCARDED,
)
LOG_FAILURES = "failures"
OPERATE_PERMISSION = "scheduler_app.change_execution"


def execution_name(execution: Execution) -> str:
    """How messages name an execution: its task and the start of its occurrence id."""
    return f"{execution.task_id} {str(execution.occurrence_id)[:8]}"


def as_json(value: Any) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True)


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(status.value, status.value) for status in STATUS_ORDER]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in Status.values:
            return queryset.filter(status=self.value())
        return queryset


class LogFilter(admin.SimpleListFilter):
    title = "log persistence"
    parameter_name = "log"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(LOG_FAILURES, "needs repair"), *((value, value) for value in LogPersistence.values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == LOG_FAILURES:
            failures = listing.log_failures().values("sequence")
            return queryset.filter(sequence__in=failures)
        if self.value() in LogPersistence.values:
            return queryset.filter(log_persistence=self.value())
        return queryset


class EventInline(admin.TabularInline):
    model = ExecutionEvent
    verbose_name = "state change"
    verbose_name_plural = "state history"
    fields = ("when", "after", "from_status", "to_status", "reason", "node", "attempt", "result", "error")
    readonly_fields = fields

    @admin.display(description="at")
    def when(self, event: ExecutionEvent) -> SafeString | str:
        return display.instant(event.at)

    @admin.display(description="after")
    def after(self, event: ExecutionEvent) -> str:
        """Time since the execution was created: a run's steps apart, even within one minute."""
        return display.duration(event.execution.created_at, event.at)

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Execution)
class ExecutionAdmin(ObjectActions, ReadOnlyAdmin):
    list_display = (
        "occurrence",
        "status",
        "task",
        "trigger",
        "due",
        "started",
        "ran_for",
        "attempt_of",
        "runner",
        "log_persistence",
    )
    list_filter = (StatusFilter, "trigger_type", LogFilter, "stop_requested", TaskFilter, OccurrenceFilter)
    # Exact task ids only: a search for part of a text column reads every row of the journal.
    search_fields = ("=task_id",)
    search_help_text = "An exact task id."
    # The runner list links to the executions a runner holds.
    linked_lookups = ("owner", "status__in")
    fields = (
        ("occurrence_id", "sequence"),
        ("task", "task_revision"),
        ("trigger_type", "trigger_source", "idempotency_key"),
        ("status", "attempt", "max_attempts"),
        ("scheduled", "due"),
        "missed",
        ("runner", "lease_expires", "stop_requested"),
        ("created", "started", "finished", "updated"),
        ("waited", "ran_for"),
        "log_persistence",
        "links",
        "params",
        "result",
        "error",
        "attempt_outcomes",
    )
    readonly_fields = (
        "task",
        "scheduled",
        "missed",
        "due",
        "runner",
        "lease_expires",
        "created",
        "started",
        "finished",
        "updated",
        "waited",
        "ran_for",
        "links",
        "attempt_outcomes",
    )
    inlines = [EventInline]
    actions = ["resolve_as_success", "resolve_as_discarded", "repair_logs", "request_stop"]

    def has_resolve_unknown_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RESOLVE_UNKNOWN_PERMISSION))

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(OPERATE_PERMISSION))

    def object_actions(self, request: HttpRequest, obj: Execution) -> list[str]:
        if obj.status == Status.UNKNOWN:
            return ["resolve_as_success", "resolve_as_discarded", "repair_logs"]
        if obj.status in (Status.PENDING, *LEASED):
            return ["request_stop"]
        return ["repair_logs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Execution]:
        executions: QuerySet[Execution] = super().get_queryset(request)
        return executions.annotate(task_exists=Exists(Task.objects.filter(id=OuterRef("task_id"))))

    # -- columns ---------------------------------------------------------------

    @admin.display(description="task", ordering="task_id")
    def task(self, execution: Execution) -> SafeString:
        return display.task_link(execution.task_id, getattr(execution, "task_exists", True))

    @admin.display(description="runner", ordering="owner")
    def runner(self, execution: Execution) -> SafeString | str:
        return display.runner_link(execution.owner)

    scheduled = display.instant_column("scheduled_for", "scheduled for")

    @admin.display(description="other fire times")
    def missed(self, execution: Execution) -> SafeString | str:
        """The fire times this occurrence merged into its run, or skipped as a misfire."""
        record = execution.missed_fire_times
        if not record:
            return "-"
        how = (
            "skipped (misfire)"
            if execution.error and execution.error.get("reason") == "misfire"
            else "merged"
        )
        listed = ", ".join(record["listed"])
        more = record["count"] - len(record["listed"])
        return format_html(
            "{} {} from {} to {}<br><small>{}{}</small>",
            record["count"],
            how,
            record["first"],
            record["last"],
            listed,
            f" and {more} more" if more > 0 else "",
        )

    due = display.instant_column("due_at", "due")
    lease_expires = display.instant_column("lease_expires_at", "lease expires", sortable=False)
    created = display.instant_column("created_at", "created", sortable=False)
    started = display.instant_column("started_at", "started")
    finished = display.instant_column("finished_at", "finished", sortable=False)
    updated = display.instant_column("updated_at", "updated", sortable=False)

    @admin.display(description="waited (due to start)")
    def waited(self, execution: Execution) -> str:
        return display.duration(execution.due_at, execution.started_at)

    @admin.display(description="ran for")
    def ran_for(self, execution: Execution) -> str:
        return display.duration(execution.started_at, execution.finished_at)

    @admin.display(description="see also")
    def links(self, execution: Execution) -> SafeString:
        return format_html(
            '<a href="{}">its log rows</a> · <a href="{}">every execution of {}</a>',
            display.changelist("executionlog", occurrence_id=str(execution.occurrence_id)),
            display.changelist("execution", task_id=execution.task_id),
            execution.task_id,
        )

    @admin.display(description="occurrence", ordering="sequence")
    def occurrence(self, execution: Execution) -> str:
        return str(execution.occurrence_id)

    @admin.display(description="trigger", ordering="trigger_type")
    def trigger(self, execution: Execution) -> str:
        if execution.trigger_source:
            return f"{execution.trigger_type} by {execution.trigger_source}"
        return execution.trigger_type

    @admin.display(description="attempt", ordering="attempt")
    def attempt_of(self, execution: Execution) -> str:
        return f"{execution.attempt} of {execution.max_attempts}"

    @admin.display(description="each attempt's outcome")
    def attempt_outcomes(self, execution: Execution) -> SafeString | str:
        ends = [
            event
            for event in execution.events.all()
            if event.result is not None
            or event.error is not None
            or event.to_status in (*TERMINAL, Status.UNKNOWN)
        ]
        if not ends:
            return "no attempt has ended yet"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td></tr>",
            (
                (
                    event.attempt,
                    display.instant(event.at),
                    event.to_status,
                    as_json(event.result),
                    as_json(event.error),
                )
                for event in ends
            ),
        )
        return format_html(
            "<table><thead><tr><th>attempt</th><th>at</th><th>ended as</th><th>result</th>"
            "<th>error</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # -- actions ---------------------------------------------------------------

    @admin.action(description="Resolve unknown as success", permissions=["resolve_unknown"])
    def resolve_as_success(
        self, request: HttpRequest, queryset: QuerySet[Execution]
    ) -> TemplateResponse | None:
        return resolve.confirm_or_resolve(self, request, queryset, Status.SUCCESS)

    @admin.action(description="Resolve unknown as discarded", permissions=["resolve_unknown"])
    def resolve_as_discarded(
        self, request: HttpRequest, queryset: QuerySet[Execution]
    ) -> TemplateResponse | None:
        return resolve.confirm_or_resolve(self, request, queryset, Status.DISCARDED)

    @admin.action(description="Repair logs (rebuild from the journal)", permissions=["operate"])
    def repair_logs(self, request: HttpRequest, queryset: QuerySet[Execution]) -> None:
        done, refused = [], []
        for execution in queryset:
            try:
                scheduler.executions.repair_log(execution.occurrence_id)
            except SchedulerError as exc:
                refused.append(f"{execution_name(execution)} ({exc.explained()})")
                continue
            self.log_change(request, execution, "Log rows rebuilt from the journal.")
            done.append(execution_name(execution))
        tell(
            self,
            request,
            ngettext(
                "Rebuilt the log rows of %(count)d execution: %(items)s.",
                "Rebuilt the log rows of %(count)d executions: %(items)s.",
                len(done),
            ),
            done,
            messages.SUCCESS,
        )
        tell(
            self,
            request,
            ngettext(
                "Could not repair the logs of %(count)d execution: %(items)s.",
                "Could not repair the logs of %(count)d executions: %(items)s.",
                len(refused),
            ),
            refused,
            messages.ERROR,
        )

    @admin.action(description="Request stop", permissions=["operate"])
    def request_stop(self, request: HttpRequest, queryset: QuerySet[Execution]) -> None:
        stopped: list[str] = []
        flagged: list[str] = []
        refused: list[str] = []
        for execution in queryset:
            try:
                after = scheduler.executions.request_stop(execution.occurrence_id, by=actor(request))
            except SchedulerError as exc:
                refused.append(f"{execution_name(execution)} ({exc.explained()})")
                continue
            ended = after.status == Status.INTERRUPTED
            self.log_change(request, execution, "Stopped." if ended else "Stop requested.")
            (stopped if ended else flagged).append(execution_name(execution))
        tell(
            self,
            request,
            ngettext(
                "Stopped %(count)d pending execution: %(items)s.",
                "Stopped %(count)d pending executions: %(items)s.",
                len(stopped),
            ),
            stopped,
            messages.SUCCESS,
        )
        tell(
            self,
            request,
            ngettext(
                "Asked the runner to stop %(count)d execution within about a tick: %(items)s.",
                "Asked the runners to stop %(count)d executions within about a tick: %(items)s.",
                len(flagged),
            ),
            flagged,
            messages.SUCCESS,
        )
        tell(
            self,
            request,
            ngettext(
                "Refused to stop %(count)d execution: %(items)s.",
                "Refused to stop %(count)d executions: %(items)s.",
                len(refused),
            ),
            refused,
            messages.WARNING,
        )
