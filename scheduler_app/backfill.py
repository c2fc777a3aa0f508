"""Backfill: the fire times of a past range that have no execution, and their occurrences.

A backfilled occurrence is the scheduled occurrence its fire time would have had (the same
occurrence id, due at the fire time plus the task's jitter), so neither a second backfill nor a
runner catching up can create it twice. A fire time has an execution when its own occurrence
exists, whatever its state (one skipped by the overlap policy included), or when coalescing
merged it into a later fire time's occurrence (``missed_fire_times``); the fire times a misfire
skipped have none. Only fire times the runners have passed are backfilled: those before the
task's next run (and before now; a paused task's, before its pause's end, the runners creating
none of its paused fire times); later ones are the runners' to create. With journal retention
on, only fire times within it: an older one may have run and its execution been pruned.

A pause holds backfilled occurrences in pending (``models.held_by_pause``) where it ends the
task's other scheduled ones: pausing a task in the middle of a backfill pauses the backfill, and
resuming it goes on with the fire times left; a backfill of a paused task waits for its resume.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from scheduler_app import audit, occurrences, schedule, wakeup
from scheduler_app.conf import scheduler_settings
from scheduler_app.exceptions import Conflict, InvalidDefinition, InvalidState, TaskNotFound
from scheduler_app.models import BACKFILL_SOURCE, Execution, Status, Task, scheduled_occurrence_id

# The most occurrences one backfill creates: beyond it the call is refused, naming where to split.
MAX_CREATED = 1000
# The most fire times one backfill reads in its range (a minute task's 69 days).
MAX_SCANNED = 100_000
# Occurrence ids looked up per query.
LOOKUP_CHUNK = 1000
ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Plan:
    """What a backfill of one task finds: the task as read, and its fire times without an execution."""

    task: Task
    fire_times: list[datetime]


def plan(task_id: str, start: Any, end: Any, now: datetime) -> Plan:
    """The fire times in [start, end) that have no execution and that the runners have passed."""
    errors = range_errors(start, end) or _retention_errors(start, now)
    if errors:
        raise InvalidDefinition("The backfill is invalid.", errors=errors)
    task = Task.objects.filter(id=task_id).first()
    if task is None:
        raise TaskNotFound()
    frontier = min(moment for moment in (end, now, _runners_from(task)) if moment is not None)
    try:
        fires = schedule.fire_times(
            task, start - ONE_MICROSECOND, frontier - ONE_MICROSECOND, MAX_SCANNED + 1
        )
        # Occurrences after the range that may have merged some of its fire times (coalescing
        # merges fire times within the grace, shifted by at most the jitter).
        reach = timedelta(seconds=_grace(task) + task.jitter_seconds)
        later = schedule.fire_times(
            task, frontier - ONE_MICROSECOND, min(frontier + reach, now) - ONE_MICROSECOND, MAX_SCANNED
        )
    except ValueError:
        raise InvalidState(f"Task {task.id!r} has a schedule that cannot be evaluated.") from None
    if len(fires) > MAX_SCANNED:
        raise InvalidDefinition(
            "The backfill is invalid.",
            errors={
                "end": [
                    f"The range holds more than {MAX_SCANNED:,} fire times; end it at or before "
                    f"{_minute(fires[MAX_SCANNED - 1] + timedelta(minutes=1))}."
                ]
            },
        )
    covered = _covered(task.id, [*fires, *later])
    missing = [fire for fire in fires if not covered(fire)]
    if len(missing) > MAX_CREATED:
        raise InvalidDefinition(
            "The backfill is invalid.",
            errors={
                "end": [
                    f"{len(missing):,} fire times in the range have no execution, more than "
                    f"{MAX_CREATED:,} per backfill; end the range at or before "
                    f"{_minute(missing[MAX_CREATED - 1] + timedelta(minutes=1))} and backfill the rest after."
                ]
            },
        )
    return Plan(task=task, fire_times=missing)


def _runners_from(task: Task) -> datetime | None:
    """The first fire time the runners will create: the task's next run; for a paused task, none
    before its pause's end (a runner resumes it from its first fire time at or after the end;
    resumed by hand, from then), so every passed fire time of the pause is the backfill's."""
    if not task.enabled:
        return task.disabled_until
    return task.next_run_at


def create(found: Plan, now: datetime) -> list[Execution]:
    """Create the planned occurrences, pending; those another writer created meanwhile are left out.

    Conflict when the task changed since it was planned (its schedule may have moved)."""
    if not found.fire_times:
        return []
    by = audit.actor()
    reason = f"backfilled by {by}" if by else "backfilled"
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(id=found.task.id).first()
        if task is None:
            raise TaskNotFound()
        if task.revision != found.task.revision:
            raise Conflict(f"Task {task.id!r} changed during the backfill: run it again.")
        planned = [
            occurrences.scheduled(task, fire, now, Status.PENDING, source=BACKFILL_SOURCE)
            for fire in found.fire_times
        ]
        created = occurrences.insert([(execution, reason) for execution in planned], "", now)
    if created:
        wakeup.notify()
    return created


def range_errors(start: Any, end: Any) -> dict[str, list[str]]:
    """What is wrong with a backfill's range: two aware instants, start before end."""
    errors: dict[str, list[str]] = {}
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, datetime) or value.utcoffset() is None:
            errors[name] = ["Must be a timezone-aware datetime."]
        elif not 2000 <= value.year <= 2200:
            errors[name] = ["Must lie in the years 2000 to 2200."]
    if not errors and start >= end:
        errors["end"] = ["Must be after start."]
    return errors


def _retention_errors(start: datetime, now: datetime) -> dict[str, list[str]]:
    """A fire time older than the journal's retention may have run and its execution been pruned
    since: it cannot be told from one that never ran."""
    days = scheduler_settings.JOURNAL_RETENTION_DAYS
    if days and start < now - timedelta(days=days):
        return {
            "start": [
                f"Must be at most {days} days ago (JOURNAL_RETENTION_DAYS): an older fire time may have "
                "run and its execution been pruned since."
            ]
        }
    return {}


def _covered(task_id: str, fires: list[datetime]) -> Any:
    """Whether a fire time has an execution: its own occurrence, or one that merged it."""
    ids = {scheduled_occurrence_id(task_id, fire): fire for fire in fires}
    own: set[datetime] = set()
    merged: list[tuple[datetime, datetime]] = []
    for chunk in _chunks(list(ids), LOOKUP_CHUNK):
        rows = Execution.objects.filter(occurrence_id__in=chunk).values_list(
            "occurrence_id", "missed_fire_times"
        )
        for occurrence_id, missed in rows:
            own.add(ids[occurrence_id])
            if missed:
                merged.append((_instant(missed["first"]), _instant(missed["last"])))

    def covered(fire: datetime) -> bool:
        return fire in own or any(first <= fire <= last for first, last in merged)

    return covered


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for index in range(0, len(items), size):
        yield items[index : index + size]


def _grace(task: Task) -> int:
    if task.misfire_grace_seconds is not None:
        return int(task.misfire_grace_seconds)
    return int(scheduler_settings.MISFIRE_GRACE_SECONDS)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _minute(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%MZ}"
