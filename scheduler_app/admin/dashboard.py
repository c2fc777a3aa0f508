"""The figures on top of the scheduler's admin page: what needs an operator (unknown executions,
runners), states over 24 hours, attempts per hour by outcome and the due-to-start lag per hour."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.db.models.functions import TruncHour
from django.utils import timezone

from scheduler_app import health, lateness, listing
from scheduler_app.admin.display import seconds_text
from scheduler_app.db import probe
from scheduler_app.logs import log_alias
from scheduler_app.models import LEASED, TERMINAL, Execution, ExecutionLog, Status

HOURS = 24
OUTCOMES = (Status.SUCCESS, Status.FAILED, Status.INTERRUPTED, Status.UNKNOWN)
COLOURS = {
    Status.SUCCESS: "#2e7d32",
    Status.FAILED: "#c62828",
    Status.INTERRUPTED: "#ef8f00",
    Status.UNKNOWN: "#6a1b9a",
}
LAG_COLOURS = {"p50": "#1565c0", "p95": "#c62828"}
# The lag of each hour is read from at most this many of its executions (the hour's last).
LAG_SAMPLE = 1000
UNKNOWN_LISTED = 10
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
    """How many executions are in each state of the queue now (pending, claimed, running,
    unknown), and how many ended in each final state since ``since``. Each count reads one of the
    journal's small indexes (the queue's, the ended rows' by finish), never the whole history."""
    in_queue = Q(status=Status.PENDING) | Q(status__in=LEASED) | Q(status=Status.UNKNOWN)
    ended = Q(status__in=TERMINAL, finished_at__gte=since)
    rows: dict[str, int] = {}
    for condition in (in_queue, ended):
        rows.update(
            Execution.objects.filter(condition)
            .order_by()
            .values("status")
            .annotate(n=Count("sequence"))
            .values_list("status", "n")
        )
    return [(status.value, rows.get(status, 0)) for status in STATE_ORDER]


def first_hour(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)


def hourly_runs(now: datetime) -> list[Bar]:
    """Attempts that ended in each of the last 24 hours (UTC), by outcome, laid out as stacked bars.

    Read from the log rows, one per ended attempt: a failed attempt counts as failed whether or
    not it is retried, and an attempt whose outcome is unknown counts as unknown."""
    first = first_hour(now)
    rows = (
        ExecutionLog.objects.using(log_alias())
        .filter(finished_at__gte=first, status__in=OUTCOMES)
        .annotate(hour=TruncHour("finished_at", tzinfo=UTC))
        .order_by()
        .values("hour", "status")
        .annotate(n=Count("id"))
        .values_list("hour", "status", "n")
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


@dataclass
class LagHour:
    """One hour of the lag chart."""

    start: datetime
    n: int
    p50: float | None
    p95: float | None
    x: int = 0

    @property
    def label(self) -> str:
        when = f"{self.start:%Y-%m-%d %H}:00 UTC"
        if self.p50 is None or self.p95 is None:
            return f"{when}: no first attempt ended"
        return f"{when}: p50 {seconds_text(self.p50)}, p95 {seconds_text(self.p95)} ({self.n} executions)"


def hourly_lag(now: datetime) -> dict[str, Any]:
    """The due-to-start lag of first attempts that ended in each of the last 24 hours: p50 and
    p95 per hour as two lines. Each hour reads at most LAG_SAMPLE rows through the index of ended
    executions, so the cost stays bounded however busy the hour was."""
    first = first_hour(now)
    step = BAR_WIDTH + BAR_GAP
    hours = []
    for index in range(HOURS):
        start = first + timedelta(hours=index)
        rows = (
            Execution.objects.filter(
                status__in=TERMINAL,
                finished_at__gte=start,
                finished_at__lt=start + timedelta(hours=1),
                attempt=1,
                started_at__isnull=False,
            )
            .order_by("-finished_at")
            .annotate(lag=lateness.start_lag_in_sql())
            .values_list("lag", flat=True)[:LAG_SAMPLE]
        )
        lags = sorted(max(0.0, lag.total_seconds()) for lag in rows if lag is not None)
        hours.append(LagHour(start, len(lags), _quantile(lags, 0.5), _quantile(lags, 0.95), x=index * step))
    tallest = max((hour.p95 or 0.0 for hour in hours), default=0.0) or 1.0

    def points(values: list[float | None]) -> list[tuple[int, int]]:
        return [
            (index * step + BAR_WIDTH // 2, CHART_HEIGHT - round(value * CHART_HEIGHT / tallest))
            for index, value in enumerate(values)
            if value is not None
        ]

    series = {"p50": points([h.p50 for h in hours]), "p95": points([h.p95 for h in hours])}
    return {
        "hours": hours,
        # A line through the hours that have a figure, and a dot on each (one hour alone is a dot).
        "lines": {name: " ".join(f"{x},{y}" for x, y in found) for name, found in series.items()},
        "dots": [(x, y, LAG_COLOURS[name]) for name, found in series.items() for x, y in found],
        "top": seconds_text(tallest) if any(h.n for h in hours) else "",
    }


def _quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted values."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def dashboard(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    bars = hourly_runs(now)
    # Runners write their heartbeat on the database clock: compare on it, as scheduler_status does.
    database_now = probe().now
    runners = health.runners(database_now)
    unknown = listing.unknown().count()
    return {
        "live_runners": health.live(runners),
        "silent_runners": health.silent_lately(runners, database_now),
        "runners": [
            {"runner": runner, "seen": seconds_text((database_now - runner.last_seen_at).total_seconds())}
            for runner in runners
            if getattr(runner, "state", "") != "stopped"
        ],
        "states": state_counts(now - timedelta(hours=HOURS)),
        "unknown": unknown,
        "unknown_rows": [
            {
                "execution": execution,
                "age": seconds_text((database_now - execution.updated_at).total_seconds()),
            }
            for execution in listing.unknown()[:UNKNOWN_LISTED]
        ],
        "unknown_more": max(0, unknown - UNKNOWN_LISTED),
        "lag": hourly_lag(now),
        "lag_colours": LAG_COLOURS,
        "lag_sample": LAG_SAMPLE,
        "log_failures": listing.log_failures().count(),
        "bars": bars,
        "runs": {s.value: sum(bar.counts[s] for bar in bars) for s in OUTCOMES},
        "colours": {s.value: COLOURS[s] for s in OUTCOMES},
        "chart_width": HOURS * (BAR_WIDTH + BAR_GAP),
        "chart_height": CHART_HEIGHT,
        "bar_width": BAR_WIDTH,
        "labels": [(bar.x, f"{bar.start:%H}") for bar in bars[::6]],
    }
