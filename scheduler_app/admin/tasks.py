"""The task admin: definitions edited through the services, run now, pause and resume."""

from __future__ import annotations

import json
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import ngettext

from scheduler_app.admin import display, task_health
from scheduler_app.admin.backfill import backfill
from scheduler_app.admin.changes import table as changes_table
from scheduler_app.admin.common import ObjectActions, TaskCountPaginator, acting, actor, tell
from scheduler_app.admin.crontext import describe
from scheduler_app.admin.forms import TaskForm
from scheduler_app.exceptions import SchedulerError, TaskDeclared, TaskNotFound
from scheduler_app.handlers import registry
from scheduler_app.models import (
    CHANGE_HANDLER_PERMISSION,
    TERMINAL,
    DeclaredIn,
    Status,
    Task,
    TaskChange,
)
from scheduler_app.services import CODE_OWNED, MAX_REASON_LENGTH, due_errors, pause_errors, scheduler

PREVIEW_COUNT = 5
RECENT_CHANGES = 3
# The task's history page; the audit trail's own list pages through the rest.
HISTORY_SHOWN = 100
# A trigger creates an execution: the same permission as POST tasks/{id}/trigger/ in the REST API.
TRIGGER_PERMISSION = "scheduler_app.add_execution"
OUTCOMES = (*TERMINAL, Status.UNKNOWN)


class LastOutcomeFilter(admin.SimpleListFilter):
    title = "last outcome"
    parameter_name = "last_outcome"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(status, status) for status in OUTCOMES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in OUTCOMES:
            return queryset.filter(last_status=self.value())
        return queryset


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name or "UTC")
    except (ValueError, OSError, ZoneInfoNotFoundError):  # a zone a tzdata update dropped
        return None


def _both_zones(instant: datetime, zone_name: str) -> SafeString:
    """An instant in the task's zone, and in UTC beneath it."""
    utc = f"{instant.astimezone(ZoneInfo('UTC')):%Y-%m-%d %H:%M} UTC"
    zone = _zone(zone_name)
    if zone is None or not zone_name or zone_name == "UTC":
        return format_html("{}", utc)
    return format_html("{}<br><small>{}</small>", f"{instant.astimezone(zone):%Y-%m-%d %H:%M %Z}", utc)


def _fire_note(task: Task, fire: datetime) -> SafeString | str:
    """What becomes of one of the task's next fire times: not run while paused, or due later by
    its jitter."""
    if task.pause_skips(fire):
        return format_html("<br><small>{}</small>", "paused: does not run")
    if task.jitter_seconds:
        due = task.due_time(fire)
        return format_html(
            "<br><small>due {} UTC (jitter)</small>", f"{due.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
        )
    return ""


WHEN_HELP = "YYYY-MM-DD HH:MM[:SS], with an offset (+02:00) or in the site's time zone."


class RunAtForm(forms.Form):
    """When the manual executions are due, checked as scheduler.trigger() checks it."""

    run_at = forms.DateTimeField(label="Run at", help_text=WHEN_HELP)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None
        if not self.errors:
            for field, messages in due_errors(data["run_at"], None).items():
                self.add_error(field if field in self.fields else None, messages)
        return data


class PauseForm(forms.Form):
    """The reason and end of a pause, checked as scheduler.pause() checks them."""

    reason = forms.CharField(
        label="Reason", max_length=MAX_REASON_LENGTH, required=False, help_text="Shown with the task."
    )
    until = forms.DateTimeField(
        label="Resume at",
        required=False,
        help_text=f"{WHEN_HELP} Empty: paused until resumed by hand.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None
        if not self.errors:
            for field, messages in pause_errors(data["reason"], data["until"]).items():
                self.add_error(field if field in self.fields else None, messages)
        return data


class TaskChangeList(ChangeList):
    """The task list, with each listed task's recent runs read in one go, and a filtered list that
    fits on a page read once (TaskCountPaginator)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # Django reads a list that fits on one page again, whole: the paginator has read it.
        whole = self.paginator.whole_list() if isinstance(self.paginator, TaskCountPaginator) else None
        if whole is not None:
            self.result_list = whole
        runs = task_health.recent_runs([task.id for task in self.result_list])
        for task in self.result_list:
            task.recent = runs.get(task.id, [])


@admin.register(Task)
class TaskAdmin(ObjectActions):
    form = TaskForm
    paginator = TaskCountPaginator
    list_display = ("id", "health", "name", "schedule", "next_run", "last_outcome", "recent_runs", "declared")
    list_filter = (
        task_health.HealthFilter,
        "enabled",
        "declared_in",
        LastOutcomeFilter,
        "overlap",
        "idempotent",
    )
    search_fields = ("id", "name", "description")
    actions = ["run_now", "run_at", backfill, "pause", "resume"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        return task_health.annotate(super().get_queryset(request), timezone.now())

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TaskChangeList

    # -- the form --------------------------------------------------------------

    def _handler_fields(self, request: HttpRequest, obj: Task | None) -> tuple[str, ...]:
        """The editable handler (and the choice of a registered Python function) only for those
        allowed to change it; everyone else sees it masked."""
        can_save = self.has_change_permission(request, obj) if obj else self.has_add_permission(request)
        declared = obj is not None and obj.declared_in != DeclaredIn.NOWHERE
        if can_save and not declared and request.user.has_perm(CHANGE_HANDLER_PERMISSION):
            return ("handler", "function")
        return ("masked_handler",)

    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None) -> Any:
        paused = ("paused_because", "paused_by", "paused_since", "paused_until")
        return [
            (
                None,
                {
                    "fields": (
                        "id",
                        "name",
                        "description",
                        "enabled",
                        *(paused if obj is not None and not obj.enabled else ()),
                        "declared",
                    )
                },
            ),
            (
                "Schedule",
                {
                    "fields": (
                        "cron",
                        "run_at",
                        "timezone",
                        ("starts_at", "ends_at"),
                        "jitter_seconds",
                        "next_fire_times",
                        "misfire_grace_seconds",
                        "misfire_policy",
                    )
                },
            ),
            (
                "Runs",
                {
                    "fields": (
                        "retry_max_attempts",
                        "retry_backoff",
                        "idempotent",
                        "max_concurrency",
                        "overlap",
                        "delete_after_run",
                    )
                },
            ),
            ("Handler", {"fields": ("params", *self._handler_fields(request, obj))}),
            (
                "Record",
                {"fields": ("revision", "next_run", "created", "updated", "runs", "recent_changes")},
            ),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None) -> Any:
        fields = [
            "masked_handler",
            "declared",
            "paused_because",
            "paused_by",
            "paused_since",
            "paused_until",
            "next_fire_times",
            "revision",
            "next_run",
            "recent_changes",
            "runs",
            "created",
            "updated",
        ]
        if obj is not None and obj.declared_in != DeclaredIn.NOWHERE:
            # Its declaration owns the definition: only enabled stays editable.
            fields += sorted(CODE_OWNED - {"handler"})
        return ["id", *fields] if obj is not None else fields

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        if obj is not None and obj.declared_in != DeclaredIn.NOWHERE:
            return False  # removing its declaration disables it at the next runner start
        return super().has_delete_permission(request, obj)

    # -- who changes it: the audit trail ----------------------------------------

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        with acting(request):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        with acting(request):
            return super().delete_view(request, object_id, extra_context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        with acting(request):
            return super().changelist_view(request, extra_context)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The task's audit trail (Django's own history lists only admin edits)."""
        task = self.get_object(request, unquote(object_id))
        if task is None:
            # Django's answer for a missing object: back to the list, with a message.
            return super().history_view(request, object_id, extra_context)
        if not self.has_view_or_change_permission(request, task):
            raise PermissionDenied
        changes = list(TaskChange.objects.filter(task_id=task.id).order_by("-id")[: HISTORY_SHOWN + 1])
        context = {
            **self.admin_site.each_context(request),
            "title": f"Changes of {task.id}",
            "subtitle": None,
            "module_name": capfirst(self.opts.verbose_name_plural),
            "opts": self.opts,
            "object": task,
            "changes": changes_table(changes[:HISTORY_SHOWN]),
            "more": len(changes) > HISTORY_SHOWN,
            "all_url": f"{reverse('admin:scheduler_app_taskchange_changelist')}?{urlencode({'task_id': task.id})}",
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/scheduler_app/task/history.html", context)

    def save_model(self, request: HttpRequest, obj: Task, form: ModelForm, change: bool) -> None:
        # TaskForm saved the task through the services when it was validated.
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        with suppress(TaskNotFound):
            scheduler.unregister(obj.id)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        refused = []
        for task in queryset:
            try:
                self.delete_model(request, task)
            except TaskDeclared:
                refused.append(task.id)
        tell(
            self,
            request,
            ngettext(
                "Did not delete %(count)d task declared in code (remove its declaration instead): %(items)s.",
                "Did not delete %(count)d tasks declared in code (remove their declarations instead): "
                "%(items)s.",
                len(refused),
            ),
            refused,
            messages.ERROR,
        )

    # -- columns and read-only fields -----------------------------------------

    @admin.display(description="schedule", ordering="cron")
    def schedule(self, task: Task) -> SafeString:
        if task.run_at is not None:
            return format_html("once<br><small>at {}</small>", display.instant(task.run_at))
        text = format_html("<code>{}</code><br><small>{}</small>", task.cron, describe(task.cron))
        if task.starts_at or task.ends_at:
            text = format_html(
                "{}<br><small>from {} until {}</small>",
                text,
                display.instant(task.starts_at) if task.starts_at else "-",
                display.instant(task.ends_at) if task.ends_at else "-",
            )
        if task.jitter_seconds:
            text = format_html("{}<br><small>jitter up to {} s</small>", text, task.jitter_seconds)
        return text

    @admin.display(description="declared in", ordering="declared_in")
    def declared(self, task: Task) -> str:
        """Where the definition is declared: the code owns those tasks' fields."""
        if task is None or task.declared_in == DeclaredIn.NOWHERE:
            return "-"
        where = "SCHEDULER_APP['TASKS']" if task.declared_in == DeclaredIn.SETTINGS else "@job"
        return f"code ({where})"

    @admin.display(description="timezone", ordering="timezone")
    def zone(self, task: Task) -> str:
        return task.timezone or "UTC"

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, task: Task) -> SafeString | str:
        if task.next_run_at is None:
            return "-"
        return _both_zones(task.next_run_at, task.timezone)

    @admin.display(description="health", ordering="health_rank")
    def health(self, task: Task) -> SafeString:
        health = str(getattr(task, "health", "ok"))
        return task_health.badge(health, pause_summary(task) if health == task_health.PAUSED else "")

    @admin.display(description="paused because")
    def paused_because(self, task: Task) -> str:
        return (task.disabled_reason if task is not None else "") or "-"

    @admin.display(description="paused by")
    def paused_by(self, task: Task) -> str:
        return (task.disabled_by if task is not None else "") or "-"

    paused_since = display.instant_column("disabled_at", "paused since", sortable=False)
    paused_until = display.instant_column("disabled_until", "resumes at", sortable=False)

    @admin.display(description="last outcome", ordering="last_status")
    def last_outcome(self, task: Task) -> SafeString | str:
        status, at = getattr(task, "last_status", None), getattr(task, "last_at", None)
        if not status:
            return "-"
        url = display.changelist("execution", task_id=task.id)
        return format_html('<a href="{}">{}</a><br><small>{}</small>', url, status, display.instant(at))

    @admin.display(description=f"last {task_health.RECENT_RUNS} runs")
    def recent_runs(self, task: Task) -> SafeString | str:
        return task_health.runs_bar(getattr(task, "recent", []))

    @admin.display(description="next five fire times")
    def next_fire_times(self, task: Task) -> SafeString | str:
        if task is None or not task.pk:
            return "-"
        try:
            times = scheduler.next_runs(task.id, PREVIEW_COUNT)
        except TaskNotFound:  # a new task whose save was refused
            return "-"
        if not times and (task.run_at or task.ends_at):
            return "none left: its run at time has passed or its window has ended"
        if not times:
            return "the stored cron expression or timezone cannot be evaluated"
        return format_html(
            "<ol>{}</ol>",
            format_html_join(
                "", "<li>{}{}</li>", ((_both_zones(t, task.timezone), _fire_note(task, t)) for t in times)
            ),
        )

    def object_actions(self, request: HttpRequest, obj: Task) -> list[str]:
        return ["run_now", "run_at", "pause" if obj.enabled else "resume"]

    created = display.instant_column("created_at", "created", sortable=False)
    updated = display.instant_column("updated_at", "updated", sortable=False)

    @admin.display(description="runs")
    def runs(self, task: Task) -> SafeString | str:
        if task is None or not task.pk:
            return "-"
        return format_html(
            '<a href="{}">its executions</a> · <a href="{}">its log rows</a>',
            display.changelist("execution", task_id=task.id),
            display.changelist("executionlog", task_id=task.id),
        )

    @admin.display(description="recent changes")
    def recent_changes(self, task: Task) -> SafeString | str:
        if task is None or not task.pk:
            return "-"
        changes = list(TaskChange.objects.filter(task_id=task.id).order_by("-id")[:RECENT_CHANGES])
        url = reverse("admin:scheduler_app_task_history", args=[quote(task.pk)])
        return format_html('{}<p><a href="{}">Every change</a></p>', changes_table(changes), url)

    @admin.display(description="handler")
    def masked_handler(self, task: Task) -> SafeString | str:
        if task is None or task.handler is None:
            return "none: the on_task_execute hook runs the task"
        shown = json.dumps(registry.masked(task.handler), indent=2, sort_keys=True)
        return format_html("<pre>{}</pre>", shown)

    # -- actions ---------------------------------------------------------------

    def has_trigger_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(TRIGGER_PERMISSION))

    @admin.action(description="Run selected tasks now", permissions=["trigger"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        self._trigger_each(request, queryset, None)

    @admin.action(description="Run selected tasks at a time...", permissions=["trigger"])
    def run_at(self, request: HttpRequest, queryset: QuerySet[Task]) -> TemplateResponse | None:
        form = RunAtForm(_confirmed(request))
        if form.is_valid():
            self._trigger_each(request, queryset, form.cleaned_data["run_at"])
            return None
        return self._ask(
            request,
            queryset,
            form,
            "run_at",
            title="Run at a time",
            intro="Each task gets one manual execution, written now and run when it is due (never "
            "before); it can be stopped until then.",
            note="a time already passed runs at once.",
            submit="Run at that time",
        )

    def _ask(
        self,
        request: HttpRequest,
        queryset: QuerySet[Task],
        form: forms.Form,
        action: str,
        **text: str,
    ) -> TemplateResponse:
        """The page an action shows to ask for its values (``form``) about the selected tasks; it
        posts the action again with ``post=yes``. ``text``: title, intro, note and submit."""
        context = {
            **self.admin_site.each_context(request),
            **text,
            "subtitle": None,
            "opts": self.opts,
            "tasks": list(queryset),
            "form": form,
            "action": action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "zone": timezone.get_current_timezone_name(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/scheduler_app/task/action_form.html", context)

    def _trigger_each(self, request: HttpRequest, queryset: QuerySet[Task], run_at: datetime | None) -> None:
        """A manual execution of each task, due now or at ``run_at``, and one message per outcome."""
        done, refused = [], []
        for task in queryset:
            try:
                execution = scheduler.trigger(task.id, source=actor(request), run_at=run_at)
            except SchedulerError as exc:
                refused.append(f"{task.id} ({exc.explained()})")
                continue
            when = "Run now" if run_at is None else f"Run at {run_at.isoformat()}"
            self.log_change(request, task, f"{when}: execution {execution.occurrence_id} created.")
            done.append(task.id)
        if run_at is None:
            triggered = ngettext(
                "Triggered %(count)d task; its execution is pending: %(items)s.",
                "Triggered %(count)d tasks; their executions are pending: %(items)s.",
                len(done),
            )
        else:
            triggered = ngettext(
                "Triggered %(count)d task, due %(due)s: %(items)s.",
                "Triggered %(count)d tasks, due %(due)s: %(items)s.",
                len(done),
            )
        due = f"{run_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if run_at is not None else ""
        tell(self, request, triggered, done, messages.SUCCESS, due=due)
        tell(
            self,
            request,
            ngettext(
                "Could not trigger %(count)d task: %(items)s.",
                "Could not trigger %(count)d tasks: %(items)s.",
                len(refused),
            ),
            refused,
            messages.ERROR,
        )

    @admin.action(description="Pause selected tasks...", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Task]) -> TemplateResponse | None:
        form = PauseForm(_confirmed(request))
        if not form.is_valid():
            return self._ask(
                request,
                queryset,
                form,
                "pause",
                title="Pause tasks",
                intro="Paused tasks are disabled: they create no scheduled runs, and a scheduled run "
                "already waiting ends interrupted; manual runs still run. Pausing a paused task "
                "changes its reason and when it resumes.",
                note="at that time a runner resumes each task: its schedule goes on from the next "
                "fire time, the paused minutes are not run.",
                submit="Pause",
            )
        reason, until = form.cleaned_data["reason"], form.cleaned_data["until"]
        paused: list[str] = []
        changed: list[str] = []
        refused: list[str] = []
        for task in queryset:
            try:
                scheduler.pause(task.id, reason=reason, until=until)
            except SchedulerError as exc:
                refused.append(f"{task.id} ({exc.explained()})")
                continue
            self.log_change(request, task, f"Paused: {reason or 'no reason given'}.")
            (paused if task.enabled else changed).append(task.id)
        tell(
            self,
            request,
            ngettext("Paused %(count)d task: %(items)s.", "Paused %(count)d tasks: %(items)s.", len(paused)),
            paused,
            messages.SUCCESS,
        )
        tell(
            self,
            request,
            ngettext(
                "Changed the pause of %(count)d task: %(items)s.",
                "Changed the pause of %(count)d tasks: %(items)s.",
                len(changed),
            ),
            changed,
            messages.SUCCESS,
        )
        self._could_not(request, "pause", refused)
        return None

    @admin.action(description="Resume selected tasks", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        resumed, unchanged, refused = [], [], []
        for task in queryset:
            if task.enabled:
                unchanged.append(task.id)
                continue
            try:
                scheduler.resume(task.id)
            except SchedulerError as exc:
                refused.append(f"{task.id} ({exc.explained()})")
                continue
            self.log_change(request, task, "Resumed.")
            resumed.append(task.id)
        tell(
            self,
            request,
            ngettext(
                "Resumed %(count)d task: %(items)s.", "Resumed %(count)d tasks: %(items)s.", len(resumed)
            ),
            resumed,
            messages.SUCCESS,
        )
        tell(
            self,
            request,
            ngettext(
                "%(count)d task was not paused: %(items)s.",
                "%(count)d tasks were not paused: %(items)s.",
                len(unchanged),
            ),
            unchanged,
            messages.INFO,
        )
        self._could_not(request, "resume", refused)

    def _could_not(self, request: HttpRequest, verb: str, refused: list[str]) -> None:
        tell(
            self,
            request,
            ngettext(
                "Could not %(verb)s %(count)d task: %(items)s.",
                "Could not %(verb)s %(count)d tasks: %(items)s.",
                len(refused),
            ),
            refused,
            messages.ERROR,
            verb=verb,
        )


def _confirmed(request: HttpRequest) -> Any:
    """The posted values once an action's own page sent them (``post=yes``), else None: a form
    bound to None asks for them."""
    return request.POST if request.POST.get("post") == "yes" else None


def pause_summary(task: Task) -> str:
    """A paused task's reason, who and since when, and when it resumes, in one line."""
    parts = [task.disabled_reason or "paused"]
    if task.disabled_by:
        parts.append(f"by {task.disabled_by}")
    if task.disabled_at is not None:
        parts.append(f"since {task.disabled_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")
    if task.disabled_until is not None:
        parts.append(f"until {task.disabled_until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")
    return ", ".join(parts)
