"""The figures on top of the scheduler's admin page: states over 24 hours and runs per hour."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Case, Count, F, Q, Value, When
from django.db.models.functions import TruncHour
from django.utils import timezone

from scheduler_app import health, listing
from scheduler_app.db import probe
from scheduler_app.models import Execution, ExecutionEvent, Status

HOURS = 24
# The start of the reason of a retry's event (runner/recording.py's plan_finish).
RETRY_REASON = "retry in "
OUTCOMES = (Status.SUCCESS, Status.FAILED, Status.INTERRUPTED)
COLOURS = {Status.SUCCESS: "#2e7d32", Status.FAILED: "#c62828", Status.INTERRUPTED: "#ef8f00"}
BAR_WIDTH = 18
BAR_GAP = 4
CHART_HEIGHT = 120
STATE_ORDER = (
    Status.UNKNOWN,
    Status.PENDING,
    Status.CLAIMED,
    Status.RUNNING,
    Status.SUCCESS,
    Status.FAILED,
    Status.INTERRUPTED,
    Status.DISCARDED,
)


@dataclass
class Bar:
    """One hour of the chart: its runs per outcome and the rectangles that draw them."""

    start: datetime
    counts: dict[str, int]
    x: int = 0
    rects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def label(self) -> str:
        parts = ", ".join(f"{self.counts[s]} {s}" for s in OUTCOMES)
        return f"{self.start:%Y-%m-%d %H}:00 UTC: {parts}"


def state_counts(since: datetime) -> list[tuple[str, int]]:
    """How many executions that changed since ``since`` are in each state now."""
    rows = dict(
        Execution.objects.filter(updated_at__gte=since)
        .order_by()
        .values("status")
        .annotate(n=Count("sequence"))
        .values_list("status", "n")
    )
    return [(status.value, rows.get(status, 0)) for status in STATE_ORDER]


def hourly_runs(now: datetime) -> list[Bar]:
    """Attempts that ended in each of the last 24 hours (UTC), by outcome, laid out as stacked bars."""
    first = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)
    # A failed attempt that will be retried moves its execution back to pending: it is a failure too.
    retried = Q(from_status=Status.RUNNING, to_status=Status.PENDING, reason__startswith=RETRY_REASON)
    rows = (
        ExecutionEvent.objects.filter(Q(to_status__in=OUTCOMES) | retried, at__gte=first)
        .annotate(
            hour=TruncHour("at", tzinfo=UTC),
            outcome=Case(
                When(to_status=Status.PENDING, then=Value(Status.FAILED.value)), default=F("to_status")
            ),
        )
        .order_by()
        .values("hour", "outcome")
        .annotate(n=Count("id"))
        .values_list("hour", "outcome", "n")
    )
    found: dict[tuple[datetime, str], int] = {}
    for hour, status, n in rows:
        found[(hour.astimezone(UTC), status)] = n
    bars = []
    for index in range(HOURS):
        start = first + timedelta(hours=index)
        bars.append(Bar(start, {s.value: found.get((start, s), 0) for s in OUTCOMES}))
    tallest = max((bar.total for bar in bars), default=0) or 1
    for index, bar in enumerate(bars):
        bar.x = index * (BAR_WIDTH + BAR_GAP)
        top = CHART_HEIGHT
        for status in OUTCOMES:
            height = round(bar.counts[status] * CHART_HEIGHT / tallest)
            if height:
                top -= height
                bar.rects.append({"y": top, "height": height, "colour": COLOURS[status]})
    return bars


def dashboard(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    bars = hourly_runs(now)
    # Runners write their heartbeat on the database clock: compare on it, as scheduler_status does.
    database_now = probe().now
    runners = health.runners(database_now)
    return {
        "live_runners": health.live(runners),
        "silent_runners": health.silent_lately(runners, database_now),
        "states": state_counts(now - timedelta(hours=HOURS)),
        "unknown": listing.unknown().count(),
        "log_failures": listing.log_failures().count(),
        "bars": bars,
        "runs": {s.value: sum(bar.counts[s] for bar in bars) for s in OUTCOMES},
        "colours": {s.value: COLOURS[s] for s in OUTCOMES},
        "chart_width": HOURS * (BAR_WIDTH + BAR_GAP),
        "chart_height": CHART_HEIGHT,
        "bar_width": BAR_WIDTH,
        "labels": [(bar.x, f"{bar.start:%H}") for bar in bars[::6]],
    }
