"""The task list's backfill: a range asked for, a preview of each task's fire times without an
execution, then their creation (scheduler.backfill)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from scheduler_app.admin import display
from scheduler_app.admin.common import acting, tell
from scheduler_app.backfill import range_errors
from scheduler_app.exceptions import SchedulerError
from scheduler_app.models import Task
from scheduler_app.services import scheduler

if TYPE_CHECKING:
    from scheduler_app.admin.tasks import TaskAdmin

WHEN_HELP = "YYYY-MM-DD HH:MM[:SS], with an offset (+02:00) or in the site's time zone."
# The fire times a preview lists per task; it counts them all.
SHOWN = 20


class BackfillForm(forms.Form):
    """The range of a backfill, checked as scheduler.backfill() checks it."""

    start = forms.DateTimeField(label="From", help_text=WHEN_HELP)
    end = forms.DateTimeField(label="Until (left out)", help_text=WHEN_HELP)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None
        if not self.errors:
            for field, messages in range_errors(data["start"], data["end"]).items():
                self.add_error(field, messages)
        return data


@dataclass
class Preview:
    """One task's part of the preview: its fire times without an execution, or why none can be made."""

    task: Task
    fire_times: list[datetime] = field(default_factory=list)
    refused: str = ""

    @property
    def hidden(self) -> int:
        return max(0, len(self.fire_times) - SHOWN)

    @property
    def shown(self) -> list[SafeString | str]:
        return [display.instant(moment) for moment in self.fire_times[:SHOWN]]

    @property
    def last(self) -> SafeString | str:
        return display.instant(self.fire_times[-1]) if self.fire_times else ""


@admin.action(description="Backfill selected tasks...", permissions=["trigger"])
def backfill(
    modeladmin: TaskAdmin, request: HttpRequest, queryset: QuerySet[Task]
) -> TemplateResponse | None:
    posted = request.POST if request.POST.get("post") == "yes" else None
    form = BackfillForm(posted)
    if not form.is_valid():
        return modeladmin._ask(
            request,
            queryset,
            form,
            "backfill",
            title="Backfill tasks",
            intro="A backfill runs the fire times of a past range that have no execution (minutes "
            "the task was paused, or skipped as misfires), each as the scheduled run it would have "
            "been. The next page shows what it will create before anything is written.",
            note="fire times from a task's next run on are left to the runners.",
            submit="Preview",
        )
    start, end = form.cleaned_data["start"], form.cleaned_data["end"]
    if request.POST.get("confirm") != "yes":
        return _preview(modeladmin, request, queryset, form, start, end)
    done, nothing, refused = [], [], []
    for task in queryset:
        try:
            with acting(request):
                created = scheduler.backfill(task.id, start, end, dry_run=False)
        except SchedulerError as exc:
            refused.append(f"{task.id} ({exc.explained()})")
            continue
        if not created:
            nothing.append(task.id)
            continue
        modeladmin.log_change(
            request, task, f"Backfilled {len(created)} fire times from {start} until {end}."
        )
        done.append(f"{task.id} ({ngettext('%d fire time', '%d fire times', len(created)) % len(created)})")
    tell(
        modeladmin,
        request,
        ngettext(
            "Backfilled %(count)d task: %(items)s.", "Backfilled %(count)d tasks: %(items)s.", len(done)
        ),
        done,
        messages.SUCCESS,
    )
    tell(
        modeladmin,
        request,
        ngettext(
            "Nothing to backfill for %(count)d task: %(items)s.",
            "Nothing to backfill for %(count)d tasks: %(items)s.",
            len(nothing),
        ),
        nothing,
        messages.INFO,
    )
    modeladmin._could_not(request, "backfill", refused)
    return None


def _preview(
    modeladmin: TaskAdmin,
    request: HttpRequest,
    queryset: QuerySet[Task],
    form: BackfillForm,
    start: datetime,
    end: datetime,
) -> TemplateResponse:
    previews = []
    for task in queryset:
        try:
            planned = scheduler.backfill(task.id, start, end)
        except SchedulerError as exc:
            previews.append(Preview(task, refused=exc.explained()))
            continue
        previews.append(Preview(task, [e.scheduled_for for e in planned if e.scheduled_for is not None]))
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Backfill tasks: what will be created",
        "subtitle": None,
        "opts": modeladmin.opts,
        "previews": previews,
        "form": form,
        "start": display.instant(start),
        "end": display.instant(end),
        "total": sum(len(preview.fire_times) for preview in previews),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "zone": timezone.get_current_timezone_name(),
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, "admin/scheduler_app/task/backfill_preview.html", context)
