"""When a run is late: the instant it could first run (its due time, or its creation if later),
or its task's next fire time not yet scheduled, passed more than the task's misfire grace ago
(MISFIRE_GRACE_SECONDS for a task without one of its own).

Tasks are grouped by grace: each distinct grace is one term of one condition, so the health
check, the metrics and the admin's task list cost the same statements with a hundred thousand
tasks as with one.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import reduce
from operator import or_

from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Greatest

from scheduler_app.conf import scheduler_settings
from scheduler_app.models import Status, Task, held_by_pause


def default_grace() -> timedelta:
    return timedelta(seconds=float(scheduler_settings.MISFIRE_GRACE_SECONDS))


Cutoffs = list[tuple[int | None, datetime]]


def cutoffs(now: datetime) -> Cutoffs:
    """Each grace in use (None: the setting's) with the instant before which a due time is late:
    one statement, read once for the conditions below."""
    own = Task.objects.filter(misfire_grace_seconds__isnull=False).order_by("misfire_grace_seconds")
    graces: list[int] = list(own.values_list("misfire_grace_seconds", flat=True).distinct())  # type: ignore[arg-type]
    found: Cutoffs = [(None, now - default_grace())]
    return found + [(grace, now - timedelta(seconds=grace)) for grace in graces]


def tasks(cutoffs: Cutoffs, field: str = "next_run_at") -> Q:
    """On Task: the tasks whose ``field`` (an instant of the task, or annotated on it) is late."""
    terms = []
    for grace, cutoff in cutoffs:
        same = Q(misfire_grace_seconds=grace) if grace is not None else Q(misfire_grace_seconds__isnull=True)
        terms.append(same & Q(**{f"{field}__lt": cutoff}))
    return reduce(or_, terms)


def pending(cutoffs: Cutoffs) -> Q:
    """On Execution: the pending executions that could run more than their task's grace ago: due,
    and created, before the cutoff (a backfill creates occurrences due long ago). Backfilled
    occurrences a pause holds are not late."""
    own = Task.objects.filter(misfire_grace_seconds__isnull=False).values("id")
    terms = []
    for grace, cutoff in cutoffs:
        since = Q(due_at__lt=cutoff, created_at__lt=cutoff)
        if grace is None:
            terms.append(since & ~Q(task_id__in=own))
        else:
            terms.append(since & Q(task_id__in=own.filter(misfire_grace_seconds=grace)))
    return Q(status=Status.PENDING) & reduce(or_, terms) & ~held_by_pause()


def start_lag(due_at: datetime, created_at: datetime, started_at: datetime) -> float:
    """Seconds from when an execution could first run (its due time, or its creation if later: a
    backfill creates occurrences due long ago) until it started; never negative."""
    return max(0.0, (started_at - max(due_at, created_at)).total_seconds())


def start_lag_in_sql() -> ExpressionWrapper:
    """On Execution: what start_lag works out, as a duration the database computes (a negative one
    stands for 0): one value a row to read, where three instants cost three conversions."""
    return ExpressionWrapper(F("started_at") - Greatest("due_at", "created_at"), output_field=DurationField())
