"""What the task list says first to the operator on call: each task's health, its last outcome and
when, and its recent runs as a small bar drawn on the server."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC
from html import escape as escape_text
from itertools import chain
from typing import Any

from django.contrib import admin
from django.db import connections
from django.db.models import Case, Exists, F, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce, Greatest
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from scheduler_app import lateness
from scheduler_app.admin.display import seconds_text
from scheduler_app.logs import log_alias
from scheduler_app.models import ENDED, LEASED, Execution, ExecutionLog, Status, Task, held_by_pause

# A task that is not enabled: paused, with or without a reason (there is no other disabled state).
PAUSED = "paused"
# Worst first: the first that holds is the task's health.
HEALTHS = ("unknown", "failing", "late", PAUSED, "running", "ok")
HEALTH_COLOURS = {
    "unknown": "#6a1b9a",
    "failing": "#c62828",
    "late": "#ef8f00",
    PAUSED: "#757575",
    "running": "#1565c0",
    "ok": "#2e7d32",
}
# The mark of a run whose status has no colour of its own.
OTHER_COLOUR = "#9e9e9e"
RUN_COLOURS = {
    Status.SUCCESS: "#2e7d32",
    Status.FAILED: "#c62828",
    Status.INTERRUPTED: "#ef8f00",
    Status.UNKNOWN: "#6a1b9a",
    Status.DISCARDED: OTHER_COLOUR,
}
RECENT_RUNS = 30
RUN_WIDTH = 6
RUN_GAP = 1
RUN_HEIGHT = 14


def annotate(tasks: QuerySet[Task], now: Any) -> QuerySet[Task]:
    """Each task with ``last_status``, ``last_at`` and ``health``, in SQL: the list sorts and filters on them."""
    of_task = Execution.objects.filter(task_id=OuterRef("pk"))
    # A failed attempt waiting for its retry leaves its execution pending, and its retry claimed or
    # running, with the failure's error: until the retry ends, the failed attempt is the last
    # outcome. An idempotent execution whose lease expired went back to pending without an error:
    # its attempt did not fail.
    retried = Q(error__isnull=False) & (
        Q(status=Status.PENDING, attempt__gt=0) | Q(status__in=LEASED, attempt__gt=1)
    )
    last = (
        of_task.filter(Q(status__in=ENDED) | retried)
        .order_by("-sequence")
        .annotate(
            outcome=Case(When(retried, then=Value(Status.FAILED.value)), default=F("status")),
            ended_at=Coalesce("finished_at", "updated_at"),
        )
    )
    cutoffs = lateness.cutoffs(now)
    late = Q(enabled=True) & lateness.tasks(cutoffs) | lateness.tasks(cutoffs, "oldest_pending")
    return tasks.annotate(
        last_status=Subquery(last.values("outcome")[:1]),
        last_at=Subquery(last.values("ended_at")[:1]),
        has_unknown=Exists(of_task.filter(status=Status.UNKNOWN)),
        has_running=Exists(of_task.filter(status__in=LEASED)),
        # When the task's oldest waiting execution could first run (lateness.pending): a backfill
        # creates occurrences due long ago, and a pause holds them.
        oldest_pending=Subquery(
            of_task.filter(status=Status.PENDING)
            .exclude(held_by_pause())
            .annotate(runnable_at=Greatest("due_at", "created_at"))
            .order_by("runnable_at")
            .values("runnable_at")[:1]
        ),
    ).annotate(
        health=Case(
            When(has_unknown=True, then=Value("unknown")),
            When(last_status=Status.FAILED.value, then=Value("failing")),
            When(late, then=Value("late")),
            When(enabled=False, then=Value(PAUSED)),
            When(has_running=True, then=Value("running")),
            default=Value("ok"),
        ),
        # Sorting by health puts the worst first, not the names in alphabetical order.
        health_rank=Case(*(When(health=name, then=Value(rank)) for rank, name in enumerate(HEALTHS))),
    )


class HealthFilter(admin.SimpleListFilter):
    title = "health"
    parameter_name = "health"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(health, health) for health in HEALTHS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in HEALTHS:
            return queryset
        health = str(self.value())
        if health == "failing":
            # What the health's first two cases say, without working out the rest of it (when
            # the task is late) for each task: there is no small index of failing tasks to
            # narrow to, and counting the matches reads every task.
            return queryset.filter(has_unknown=False, last_status=Status.FAILED.value)
        # First the tasks that can have that health, found through small indexes: the health
        # itself is worked out per task, and there may be a hundred thousand of them.
        return queryset.filter(_narrowing(health), health=health)


def _narrowing(health: str) -> Q:
    if health == "unknown":
        return Q(id__in=_task_ids(Q(status=Status.UNKNOWN)))
    if health == "running":
        return Q(id__in=_task_ids(Q(status__in=LEASED)))
    if health == "late":
        cutoffs = lateness.cutoffs(timezone.now())
        return Q(enabled=True) & lateness.tasks(cutoffs) | Q(id__in=_task_ids(lateness.pending(cutoffs)))
    if health == PAUSED:
        return Q(enabled=False)
    return Q()  # ok: most tasks are


def _task_ids(rows: Q) -> QuerySet[Any]:
    return Execution.objects.filter(rows).values("task_id")


def badge(health: str, title: str = "") -> SafeString:
    """The health as a coloured word; ``title`` is shown on hover (a pause's reason)."""
    colour = HEALTH_COLOURS.get(health, "#757575")
    return format_html(
        '<span class="scheduler-health" title="{}" style="color: #fff; background: {}; padding: 1px 6px; '
        'border-radius: 3px; white-space: nowrap">{}</span>',
        title or health,
        colour,
        health,
    )


def recent_runs(task_ids: list[str]) -> dict[str, list[tuple[str, int, Any, int | None]]]:
    """The newest RECENT_RUNS attempts of each task, from the logs: (status, attempt, finished_at,
    duration_ms), newest first. One statement where the database can limit each part of a union."""
    alias = log_alias()
    rows: Any = None
    if len(task_ids) > 1 and connections[alias].features.supports_slicing_ordering_in_compound:
        rows = _one_union(task_ids, alias)
        if rows is None:
            parts = [_newest(task_id, alias) for task_id in task_ids]
            rows = parts[0].union(*parts[1:], all=True).order_by()
    if rows is None:
        rows = chain.from_iterable(_newest(task_id, alias) for task_id in task_ids)
    runs: dict[str, list[tuple[str, int, Any, int | None]]] = defaultdict(list)
    for task_id, status, attempt, finished_at, duration_ms in rows:
        runs[task_id].append((status, attempt, finished_at, duration_ms))
    for found in runs.values():
        found.sort(key=lambda run: (run[2], run[1]), reverse=True)
    return runs


def _newest(task_id: str, alias: str) -> QuerySet[Any]:
    return (
        ExecutionLog.objects.using(alias)
        .filter(task_id=task_id)
        .order_by("-finished_at", "-attempt")
        .values_list("task_id", "status", "attempt", "finished_at", "duration_ms")[:RECENT_RUNS]
    )


def _one_union(task_ids: list[str], alias: str) -> Any:
    """The union of each task's newest runs, from one part's SQL as Django writes it, repeated with
    each task id: compiling a query per listed task took more of the task list's time than the
    statement itself. The rows converted as Django converts the part's; None when Django's union
    of two parts does not have the expected shape (two equal parts, one parameter each)."""
    first = _newest(task_ids[0], alias)
    sql, params = first.union(first, all=True).order_by().query.get_compiler(alias).as_sql()
    separator = " UNION ALL "
    part, _, again = sql.partition(separator)
    if part != again or params != (task_ids[0], task_ids[0]):
        return None
    compiler = first.query.get_compiler(alias)
    compiler.as_sql()  # sets up the part's columns, whose converters apply to every row
    with connections[alias].cursor() as cursor:
        cursor.execute(separator.join([part] * len(task_ids)), task_ids)
        fetched = cursor.fetchall()
    return compiler.results_iter(results=[fetched])


def runs_bar(runs: list[tuple[str, int, Any, int | None]]) -> SafeString | str:
    """The runs as a row of coloured marks, oldest left, each titled with its outcome and time."""
    if not runs:
        return "-"
    # One plain string for the marks, each value from the row escaped: Django's format_html and
    # escape per mark cost more than the rest of the task list (100 tasks x 30 runs).
    step = RUN_WIDTH + RUN_GAP
    marks = "".join(
        f'<rect x="{index * step}" y="0" width="{RUN_WIDTH}" height="{RUN_HEIGHT}"'
        f' fill="{RUN_COLOURS.get(status, OTHER_COLOUR)}">'
        f"<title>{_run_title(status, attempt, finished_at, duration_ms)}</title></rect>"
        for index, (status, attempt, finished_at, duration_ms) in enumerate(reversed(runs))
    )
    width = RECENT_RUNS * (RUN_WIDTH + RUN_GAP)
    return format_html(
        '<svg class="scheduler-runs" role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}">{}</svg>',
        f"last {len(runs)} runs: "
        + ", ".join(run[0] for run in runs[:5])
        + (" ..." if len(runs) > 5 else ""),
        width,
        RUN_HEIGHT,
        width,
        RUN_HEIGHT,
        mark_safe(marks),  # every value in it is escaped above
    )


def _run_title(status: str, attempt: int, finished_at: Any, duration_ms: int | None) -> str:
    # isoformat: half the time of strftime, 3,000 times a page.
    text = (
        f"{status}, attempt {attempt}, ended {finished_at.astimezone(UTC).isoformat(' ', 'seconds')[:19]} UTC"
    )
    if duration_ms is not None:
        text += f" after {seconds_text(duration_ms / 1000)}"
    return escape_text(text)
