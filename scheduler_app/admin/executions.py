"""The execution journal admin: read-only rows, their history, and the operator's repairs."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from scheduler_app import listing
from scheduler_app.admin import resolve
from scheduler_app.admin.common import ReadOnlyAdmin, actor, tell
from scheduler_app.exceptions import SchedulerError
from scheduler_app.models import (
    RESOLVE_UNKNOWN_PERMISSION,
    TERMINAL,
    Execution,
    ExecutionEvent,
    LogPersistence,
    Status,
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
    fields = ("at", "from_status", "to_status", "reason", "node", "attempt", "result", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = (
        "occurrence",
        "status",
        "task_id",
        "trigger",
        "scheduled_for",
        "attempt_of",
        "owner",
        "lease_expires_at",
        "log_persistence",
    )
    list_filter = (StatusFilter, "trigger_type", LogFilter, "stop_requested")
    search_fields = ("task_id", "occurrence_id", "trigger_source", "owner")
    # The runner list links to the executions a runner holds.
    linked_lookups = ("owner", "status__in")
    fields = (
        ("occurrence_id", "sequence"),
        ("task_id", "task_revision"),
        ("trigger_type", "trigger_source", "idempotency_key"),
        ("status", "attempt", "max_attempts"),
        ("scheduled_for", "due_at"),
        ("owner", "lease_expires_at", "stop_requested"),
        ("created_at", "started_at", "finished_at", "updated_at"),
        "log_persistence",
        "params",
        "result",
        "error",
        "attempt_outcomes",
    )
    readonly_fields = ("attempt_outcomes",)
    inlines = [EventInline]
    actions = ["resolve_as_success", "resolve_as_discarded", "repair_logs", "request_stop"]

    def has_resolve_unknown_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RESOLVE_UNKNOWN_PERMISSION))

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(OPERATE_PERMISSION))

    # -- columns ---------------------------------------------------------------

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
                    f"{event.at:%Y-%m-%d %H:%M:%S} UTC",
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
                refused.append(f"{execution_name(execution)} ({exc.message})")
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
                refused.append(f"{execution_name(execution)} ({exc.message})")
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
                "Asked the runner to stop %(count)d execution at its next lease renewal: %(items)s.",
                "Asked the runners to stop %(count)d executions at their next lease renewal: %(items)s.",
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
