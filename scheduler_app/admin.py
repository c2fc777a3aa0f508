"""Admin pages: tasks, the execution journal with its history, logs and runners."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from scheduler_app.logs import log_alias
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Runner, Task


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "cron", "timezone", "enabled", "next_run_at")
    list_filter = ("enabled",)
    search_fields = ("id", "name")
    readonly_fields = ("revision", "next_run_at", "created_at", "updated_at")


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EventInline(admin.TabularInline):
    model = ExecutionEvent
    fields = ("at", "from_status", "to_status", "reason", "node", "attempt")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = ("occurrence_id", "task_id", "trigger_type", "status", "attempt", "due_at", "finished_at")
    list_filter = ("status", "trigger_type", "log_persistence")
    search_fields = ("task_id", "occurrence_id")
    exclude = ("execution_token",)
    inlines = [EventInline]


@admin.register(ExecutionLog)
class ExecutionLogAdmin(ReadOnlyAdmin):
    list_display = (
        "task_id",
        "status",
        "attempt",
        "trigger_type",
        "started_at",
        "finished_at",
        "duration_ms",
    )
    list_filter = ("status", "trigger_type")
    search_fields = ("task_id",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ExecutionLog]:
        return super().get_queryset(request).using(log_alias())


@admin.register(Runner)
class RunnerAdmin(ReadOnlyAdmin):
    list_display = ("node_id", "host", "pid", "started_at", "last_seen_at", "stopped_at", "version")
