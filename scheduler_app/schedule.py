"""When a task fires: its cron expression or its one instant (run_at), inside its active window
[starts_at, ends_at), and when each occurrence comes due (its fire time plus the task's jitter).

Every caller that asks when a task fires (the runner's scheduling, the claim's check that an
occurrence still belongs to the schedule, next_runs, backfill, the admin) asks here.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from typing import Protocol
from zoneinfo import ZoneInfo

from scheduler_app import cron

ONE_MICROSECOND = timedelta(microseconds=1)
# Weekdays and leap years repeat every 28 years (within a century): an expression's wall-clock
# intervals are all seen in that many years (the 29th of February falls on each weekday).
_CALENDAR_CYCLE_YEARS = 28
_YEAR = timedelta(days=366)
_OFFSET_SCAN = timedelta(hours=6)
# Around a change of offset (found to within _OFFSET_SCAN), intervals are read over the shortest
# wall-clock one plus this margin (more than any shift of offset), and never over more than the
# longest jitter needs.
_SHIFT_MARGIN = _OFFSET_SCAN + timedelta(hours=3)
_LONGEST_SPAN = timedelta(days=8)


class Timed(Protocol):
    """What this module reads of a task."""

    id: str
    cron: str
    run_at: datetime | None
    timezone: str
    starts_at: datetime | None
    ends_at: datetime | None
    jitter_seconds: int


def fire_times(task: Timed, after: datetime, until: datetime, limit: int | None = None) -> list[datetime]:
    """The task's fire times in (after, until], at most ``limit``, in UTC."""
    low, high = _window(task, after, until)
    if high <= low:
        return []
    if task.run_at is not None:
        return [task.run_at.astimezone(UTC)] if low < task.run_at <= high and limit != 0 else []
    return cron.fire_times(task.cron, task.timezone, low, high, limit)


def count_fire_times(task: Timed, after: datetime, until: datetime) -> int:
    """How many fire times the task has in (after, until]."""
    low, high = _window(task, after, until)
    if high <= low:
        return 0
    if task.run_at is not None:
        return 1 if low < task.run_at <= high else 0
    return cron.count_fire_times(task.cron, task.timezone, low, high)


def next_fire(task: Timed, after: datetime) -> datetime | None:
    """The task's first fire time strictly after ``after``; None when it has no more.

    ValueError (InvalidCron is one) when a stored schedule cannot be evaluated.
    """
    low = after if task.starts_at is None else max(after, task.starts_at - ONE_MICROSECOND)
    if task.run_at is not None:
        found: datetime | None = task.run_at.astimezone(UTC) if task.run_at > low else None
    elif task.ends_at is not None and low >= task.ends_at:
        return None
    else:
        found = cron.next_fire_time(task.cron, task.timezone, low)
    if found is None or (task.ends_at is not None and found >= task.ends_at):
        return None
    return found


def is_fire_time(task: Timed, instant: datetime) -> bool:
    """Whether ``instant`` is one of the task's fire times (under its current definition)."""
    if task.starts_at is not None and instant < task.starts_at:
        return False
    if task.ends_at is not None and instant >= task.ends_at:
        return False
    if task.run_at is not None:
        return instant == task.run_at
    return cron.matches(task.cron, task.timezone, instant)


def jitter(jitter_seconds: int, occurrence_id: uuid.UUID) -> timedelta:
    """The shift of one occurrence's due time: in [0, jitter_seconds), to the millisecond, taken
    from its occurrence id so that every node computes the same."""
    if jitter_seconds <= 0:
        return timedelta(0)
    return timedelta(milliseconds=occurrence_id.int % (jitter_seconds * 1000))


def shortest_interval(expression: str, timezone: str, now: datetime) -> timedelta | None:
    """The shortest time between two consecutive fire times of ``expression`` from ``now`` on: in
    wall-clock time over the calendar's 28-year cycle, and exactly around each change of the
    zone's UTC offset in the year ahead (where daylight saving time brings fire times closer).
    None when it fires at most once in that time."""
    local = now.astimezone(ZoneInfo(timezone or "UTC")).date()
    wall = cron.shortest_wall_gap(expression, local, date(local.year + _CALENDAR_CYCLE_YEARS, 1, 1))
    span = min(wall + _SHIFT_MARGIN, _LONGEST_SPAN) if wall is not None else _LONGEST_SPAN
    gaps = [wall] if wall is not None else []
    for change in _offset_changes(timezone, now, now + _YEAR):
        times = cron.fire_times(expression, timezone, change - span, change + span)
        gaps += [later - earlier for earlier, later in pairwise(times)]
    return min(gaps, default=None)


def _offset_changes(timezone: str, start: datetime, end: datetime) -> list[datetime]:
    """Instants (to within _OFFSET_SCAN) where the zone's UTC offset changes in [start, end)."""
    zone = ZoneInfo(timezone or "UTC")
    changes: list[datetime] = []
    moment = start
    offset = moment.astimezone(zone).utcoffset()
    while moment < end:
        moment += _OFFSET_SCAN
        current = moment.astimezone(zone).utcoffset()
        if current != offset:
            changes.append(moment)
            offset = current
    return changes


def _window(task: Timed, after: datetime, until: datetime) -> tuple[datetime, datetime]:
    """(after, until] narrowed to the task's active window."""
    if task.starts_at is not None:
        after = max(after, task.starts_at - ONE_MICROSECOND)
    if task.ends_at is not None:
        until = min(until, task.ends_at - ONE_MICROSECOND)
    return after, until
