"""What an operator is told about: runners alive or gone silent, late runs, unknown executions, log
rows waiting for repair and tasks whose schedule cannot be evaluated; read with a few indexed
queries, from any node."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q

from scheduler_app import lateness, listing, schedule
from scheduler_app.models import Execution, Runner, Task

# A silent runner alerts for this long after it was last seen; older ones are only listed.
SILENT_HORIZON = timedelta(days=1)
# The most tasks without a next run whose schedule one check evaluates (tasks whose window ended
# are not read at all).
UNSCHEDULED_READ = 1000


@dataclass(frozen=True)
class Condition:
    """One thing wrong, with the exit code scheduler_status gives it (the lowest code wins)."""

    name: str
    exit_code: int
    message: str


@dataclass(frozen=True)
class Health:
    now: datetime
    runners: list[Runner]
    unknown: int
    oldest_unknown: datetime | None
    late: int
    oldest_late: datetime | None
    tasks_behind: int
    log_failures: int
    unschedulable: list[str] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return min((c.exit_code for c in self.conditions), default=0)

    def as_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat().replace("+00:00", "Z") if value else None

        return {
            "ok": not self.conditions,
            "exit_code": self.exit_code,
            "now": iso(self.now),
            "conditions": [c.__dict__ for c in self.conditions],
            "runners": [
                {
                    "node_id": r.node_id,
                    "state": getattr(r, "state", ""),
                    "host": r.host,
                    "pid": r.pid,
                    "version": r.version,
                    "started_at": iso(r.started_at),
                    "last_seen_at": iso(r.last_seen_at),
                    "silent_after": iso(r.silent_after),
                    "stopped_at": iso(r.stopped_at),
                }
                for r in self.runners
            ],
            "unknown": {"count": self.unknown, "oldest_updated_at": iso(self.oldest_unknown)},
            "late": {
                "pending": self.late,
                "oldest_due_at": iso(self.oldest_late),
                "tasks_behind": self.tasks_behind,
            },
            "log_failures": {"count": self.log_failures},
            "unschedulable": {"count": len(self.unschedulable), "task_ids": self.unschedulable},
        }


def runners(now: datetime, node_id: str | None = None) -> list[Runner]:
    found = Runner.objects.with_state(now).order_by("node_id")
    return list(found.filter(node_id=node_id) if node_id else found)


def live(runners: list[Runner]) -> int:
    return sum(1 for r in runners if getattr(r, "state", "") == "alive")


def silent_lately(runners: list[Runner], now: datetime) -> list[str]:
    """Runners gone silent without stopping within SILENT_HORIZON of ``now``."""
    return [
        r.node_id
        for r in runners
        if getattr(r, "state", "") == "silent" and r.last_seen_at >= now - SILENT_HORIZON
    ]


def check(now: datetime) -> Health:
    """Every condition, at ``now`` read from the database clock."""
    every = runners(now)
    unknown = listing.unknown().order_by().aggregate(n=Count("sequence"), oldest=Min("updated_at"))
    cutoffs = lateness.cutoffs(now)
    late = (
        Execution.objects.filter(lateness.pending(cutoffs))
        .order_by()
        .aggregate(n=Count("sequence"), oldest=Min("due_at"))
    )
    behind = Task.objects.filter(lateness.tasks(cutoffs), enabled=True).count()
    failures = listing.log_failures().order_by().count()
    health = Health(
        now=now,
        runners=every,
        unknown=unknown["n"],
        oldest_unknown=unknown["oldest"],
        late=late["n"],
        oldest_late=late["oldest"],
        tasks_behind=behind,
        log_failures=failures,
        unschedulable=unschedulable(now),
    )
    health.conditions.extend(_conditions(health))
    return health


def unschedulable(now: datetime) -> list[str]:
    """Enabled cron tasks that will not fire again although their window is open: a runner found
    their stored cron expression or timezone cannot be evaluated (written around validation: raw
    SQL, a fixture) and left them without a next run. One indexed read of the enabled tasks without
    a next run; only those are evaluated, and only their first UNSCHEDULED_READ."""
    candidates = (
        Task.objects.filter(enabled=True, next_run_at=None)
        .exclude(cron="")
        .filter(Q(ends_at=None) | Q(ends_at__gt=now))
        .order_by("id")[:UNSCHEDULED_READ]
    )
    found = []
    for task in candidates:
        try:
            schedule.next_fire(task, now)
        except ValueError:
            found.append(task.id)
    return found


def _ago(now: datetime, then: datetime | None) -> str:
    return f"{then:%Y-%m-%dT%H:%M:%SZ}, {int((now - then).total_seconds())} s ago" if then else "-"


def _conditions(h: Health) -> list[Condition]:
    found = []
    if not live(h.runners):
        found.append(Condition("no_live_runner", 2, "no live runner"))
    if h.late or h.tasks_behind:
        found.append(
            Condition(
                "late",
                3,
                f"{h.late} pending executions due longer ago than their task's misfire grace (the oldest"
                f" due {_ago(h.now, h.oldest_late)}); {h.tasks_behind} enabled tasks whose next fire time"
                " passed longer ago than their misfire grace without being scheduled",
            )
        )
    if h.unknown:
        found.append(
            Condition(
                "unknown",
                4,
                f"{h.unknown} executions in state unknown wait for an operator (the oldest since"
                f" {_ago(h.now, h.oldest_unknown)}); each holds a slot of its task",
            )
        )
    silent = silent_lately(h.runners, h.now)
    if silent:
        found.append(
            Condition("silent_runners", 5, f"runners gone silent without stopping: {', '.join(silent)}")
        )
    if h.log_failures:
        found.append(
            Condition("log_failures", 6, f"{h.log_failures} executions have log rows waiting for repair")
        )
    if h.unschedulable:
        found.append(
            Condition(
                "unschedulable",
                7,
                f"{len(h.unschedulable)} enabled tasks will not fire: their stored cron expression or"
                f" timezone cannot be evaluated: {', '.join(h.unschedulable[:10])}",
            )
        )
    return found
