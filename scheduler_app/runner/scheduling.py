"""Turning due cron minutes into occurrences: misfire grace, coalescing and overlap."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from scheduler_app import occurrences, schedule
from scheduler_app.conf import scheduler_settings
from scheduler_app.models import (
    Execution,
    MisfirePolicy,
    Overlap,
    Status,
    Task,
    TriggerType,
    missed_occurrence_id,
)
from scheduler_app.statements import journal_statements

BATCH = 200
logger = logging.getLogger("scheduler_app")
ONE_MICROSECOND = timedelta(microseconds=1)


# The most fire times one plan of a run_all task runs; older ones within the grace are skipped.
MAX_CATCH_UP = 100
# The most skipped or merged fire times an occurrence lists (it counts them all).
MAX_LISTED = 100


@dataclass(frozen=True)
class Missed:
    """Fire times an occurrence stands for besides its own: how many, the first and last, and
    the first MAX_LISTED of them."""

    count: int
    first: datetime
    last: datetime
    listed: tuple[datetime, ...]

    def record(self) -> dict[str, Any]:
        """As stored in Execution.missed_fire_times."""
        return {
            "count": self.count,
            "first": _iso(self.first),
            "last": _iso(self.last),
            "listed": [_iso(moment) for moment in self.listed],
        }

    def joined(self, later: Missed | None) -> Missed:
        if later is None:
            return self
        listed = (self.listed + later.listed)[:MAX_LISTED]
        return Missed(self.count + later.count, self.first, later.last, listed)


@dataclass(frozen=True)
class Plan:
    """What one due task gets at ``now``: the fire times to run (each with the fire times merged
    into it), the fire times skipped past the grace, and the next fire time."""

    runs: tuple[tuple[datetime, Missed | None], ...]
    skipped: Missed | None
    next_run_at: datetime | None


def plan(task: Task, now: datetime, default_grace: int) -> Plan:
    """Fire times since ``task.next_run_at``: those whose due time (the fire time plus its jitter)
    is within the grace run (the latest, merging the others, or all of them under run_all);
    older ones are skipped."""
    assert task.next_run_at is not None
    grace = task.misfire_grace_seconds if task.misfire_grace_seconds is not None else default_grace
    cutoff = now - timedelta(seconds=grace)
    start = task.next_run_at - ONE_MICROSECOND
    # Fire times before this are past the grace whatever their jitter.
    surely_missed = cutoff - timedelta(seconds=task.jitter_seconds) - ONE_MICROSECOND
    recent = schedule.fire_times(task, max(start, surely_missed), now)
    within = [fire for fire in recent if task.due_time(fire) >= cutoff]
    skipped = _counted(task, start, surely_missed)
    late = [fire for fire in recent if task.due_time(fire) < cutoff]
    runs: tuple[tuple[datetime, Missed | None], ...]
    if task.misfire_policy == MisfirePolicy.RUN_ALL:
        late += within[:-MAX_CATCH_UP]
        runs = tuple((fire, None) for fire in within[-MAX_CATCH_UP:])
    else:
        runs = ((within[-1], _listed(within[:-1])),) if within else ()
    skipped = skipped.joined(_listed(late)) if skipped else _listed(late)
    return Plan(runs=runs, skipped=skipped, next_run_at=schedule.next_fire(task, now))


def _listed(fires: list[datetime]) -> Missed | None:
    if not fires:
        return None
    return Missed(len(fires), fires[0], fires[-1], tuple(fires[:MAX_LISTED]))


def _counted(task: Task, floor: datetime, until: datetime) -> Missed | None:
    """The fire times in (floor, until], counted without listing more than MAX_LISTED."""
    if until <= floor:
        return None
    count = schedule.count_fire_times(task, floor, until)
    if not count:
        return None
    listed = tuple(schedule.fire_times(task, floor, until, MAX_LISTED))
    last = listed[-1] if count == len(listed) else _last_fire_before(task, until, floor)
    assert last is not None
    return Missed(count, listed[0], last, listed)


def _last_fire_before(task: Task, until: datetime, floor: datetime) -> datetime | None:
    """The latest fire time in (floor, until], found in windows that double backwards."""
    window = timedelta(hours=1)
    while True:
        low = max(floor, until - window)
        found = schedule.fire_times(task, low, until)
        if found or low == floor:
            return found[-1] if found else None
        window *= 2


def _record(missed: Missed | None) -> dict[str, Any] | None:
    return missed.record() if missed else None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def schedule_due(now: datetime, node: str) -> tuple[list[tuple[Execution, str, str]], bool]:
    """Create the occurrences of up to one batch of tasks due at ``now``.

    Returns (execution, task name, reason) for each occurrence created, and
    whether more tasks may be due. Task rows are locked with SKIP LOCKED, so
    each due task is planned by one runner, and next_run_at moves forward in
    the same transaction.
    """
    default_grace = int(scheduler_settings.MISFIRE_GRACE_SECONDS)
    with transaction.atomic():
        tasks = list(
            Task.objects.select_for_update(skip_locked=True)
            .filter(enabled=True, next_run_at__lte=now)
            .order_by("next_run_at")[:BATCH]
        )
        if not tasks:
            return [], False
        ids = [task.id for task in tasks]
        occupied = Execution.objects.filter(task_id__in=ids).occupying().count_by_task()
        waiting = Execution.objects.filter(
            task_id__in=ids, status=Status.PENDING, trigger_type=TriggerType.SCHEDULED
        ).count_by_task()
        rows: list[tuple[Execution, str, str]] = []
        for task in tasks:
            try:
                step = plan(task, now, default_grace)
            except ValueError:
                # A definition stored around validation (raw SQL, a bad fixture) must not stall the others.
                logger.error("task %s has an invalid schedule; it will not fire until fixed", task.id)
                task.next_run_at = None
                continue
            if step.skipped is not None:
                missed = step.skipped
                reason = (
                    f"misfire: missed {_plural(missed.count, 'fire time')} between "
                    f"{missed.first:%Y-%m-%dT%H:%MZ} and {missed.last:%Y-%m-%dT%H:%MZ}"
                )
                record = occurrences.scheduled(
                    task,
                    missed.first,
                    now,
                    Status.INTERRUPTED,
                    missed.record(),
                    occurrence_id=missed_occurrence_id(task.id, missed.first),
                )
                record.due_at = missed.first
                rows.append((record, task.name, reason))
            if step.runs:
                busy = occupied.get(task.id, 0) + waiting.get(task.id, 0)
                room = task.max_concurrency + (1 if task.overlap == Overlap.BUFFER_ONE else 0)
                # Fire times caught up together arrive as one: all queue, or all are skipped.
                fits = busy < room
                for fire, merged in step.runs:
                    if fits:
                        reason = "scheduled"
                        if merged is not None:
                            reason += f", merging {_plural(merged.count, 'missed fire time')}"
                        rows.append(
                            (
                                occurrences.scheduled(task, fire, now, Status.PENDING, _record(merged)),
                                task.name,
                                reason,
                            )
                        )
                        waiting[task.id] = waiting.get(task.id, 0) + 1
                    else:
                        overlap = f"overlap: {task.max_concurrency} running or waiting, policy {task.overlap}"
                        rows.append(
                            (
                                occurrences.scheduled(task, fire, now, Status.INTERRUPTED, _record(merged)),
                                task.name,
                                overlap,
                            )
                        )
            task.next_run_at = step.next_run_at
        for execution, _, reason in rows:
            if execution.status == Status.INTERRUPTED:
                execution.error = {"reason": reason.split(":", 1)[0], "message": reason}
        journal_statements().move_next_runs(tasks)
        inserted = {
            row.occurrence_id
            for row in occurrences.insert([(execution, reason) for execution, _, reason in rows], node, now)
        }
        created = [row for row in rows if row[0].occurrence_id in inserted]
    return created, len(tasks) >= BATCH
