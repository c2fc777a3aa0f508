"""The audit trail's admin: every change of every task, kept after the task is deleted."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import SafeString

from scheduler_app.admin import display
from scheduler_app.admin.common import ReadOnlyAdmin
from scheduler_app.models import Task, TaskChange

ABSENT = "-"


def shown(value: Any) -> str:
    """A field's value as JSON text, the way the REST API gives it."""
    return ABSENT if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def table(changes: list[TaskChange]) -> SafeString:
    """Changes as one table: when, what, who, and each field old -> new."""
    rows = [
        {
            "change": change,
            "at": display.instant(change.at),
            "url": reverse("admin:scheduler_app_taskchange_change", args=[change.pk]),
            "fields": [
                {
                    "name": name,
                    "old": shown(old),
                    "new": shown(new),
                    # The handler is masked: a changed secret shows the same on both sides.
                    "masked": old == new,
                }
                for name, (old, new) in sorted(change.changes.items())
            ],
        }
        for change in changes
    ]
    return render_to_string("admin/scheduler_app/taskchange/table.html", {"rows": rows})


@admin.register(TaskChange)
class TaskChangeAdmin(ReadOnlyAdmin):
    list_display = ("when", "task", "action", "via", "by", "revision", "fields_changed")
    list_filter = ("action", "via")
    search_fields = ("=task_id", "by")
    linked_lookups = ("task_id",)
    fields = ("task", "when", "action", "via", "by", "revision", "changed")
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskChange]:
        changes: QuerySet[TaskChange] = super().get_queryset(request)
        return changes.annotate(task_exists=Exists(Task.objects.filter(id=OuterRef("task_id"))))

    @admin.display(description="at", ordering="id")
    def when(self, change: TaskChange) -> SafeString | str:
        return display.instant(change.at)

    @admin.display(description="task", ordering="task_id")
    def task(self, change: TaskChange) -> SafeString | str:
        if getattr(change, "task_exists", False):
            return display.task_link(change.task_id)
        return display.task_link(change.task_id, exists=False)

    @admin.display(description="fields")
    def fields_changed(self, change: TaskChange) -> str:
        return ", ".join(sorted(change.changes))

    @admin.display(description="changes")
    def changed(self, change: TaskChange) -> SafeString:
        return table([change])
