"""Helpers the tests share: task definitions, an inline runner on a fake clock, crashed attempts,
and how the tests read what ran and what the journal recorded."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from scheduler_app import journal, scheduler
from scheduler_app.models import Execution, ExecutionEvent, Status, Task
from scheduler_app.runner import claims
from scheduler_app.runner.claims import Claim
from scheduler_app.runner.clock import FakeClock
from scheduler_app.runner.loop import SchedulerLoop
from tests.hooks import start_line

T0 = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)


def definition(task_id: str = "report", **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"id": task_id, "name": task_id.title(), "cron": "* * * * *"}
    data.update(overrides)
    return data


def inline_runner(clock: FakeClock, **options: Any) -> SchedulerLoop:
    options.setdefault("workers", 4)
    options.setdefault("lease_seconds", 30)
    runner = SchedulerLoop(node_id=options.pop("node_id", "node-a"), clock=clock, inline=True, **options)
    runner.start()
    return runner


def run_one_by_one(
    clock: FakeClock, count: int, task_id: str = "report", *, seconds_apart: float = 1
) -> None:
    """Trigger ``task_id`` (registered, never due by its cron) ``count`` times, each run to its end
    by an inline runner before the next, ``seconds_apart`` on the clock: ``count`` log rows."""
    runner = inline_runner(clock)
    for _ in range(count):
        scheduler.trigger(task_id)
        runner.tick()
        clock.advance(seconds_apart)


def expire_lease(
    clock: FakeClock, *, node: str = "dead-node", lease: float = 30, start: bool = True
) -> Claim:
    """Claim (and maybe start) one attempt as a node that then dies; return it once its lease ran out."""
    (claim,), _, _ = claims.claim(clock.now(), node, 1, lease)
    if start:
        _start(claim, clock.now())
    clock.advance(lease + 1)
    return claim


def _start(claim: Claim, now: datetime) -> None:
    """claimed -> running, as the claiming node's worker records it."""
    assert journal.transition(
        claim.execution.sequence,
        Status.CLAIMED,
        Status.RUNNING,
        at=now,
        reason="started",
        token=claim.token,
        attempt=claim.execution.attempt,
        fields={"started_at": now},
    )


def unknown_as_a_crash_leaves_it(clock: FakeClock, count: int = 1, *, lease: float = 30) -> list[Execution]:
    """``count`` due executions left ``unknown`` by a crash, oldest first.

    A node claims and starts them, then dies while their handlers run; once the lease ran out,
    another runner's tick recovers them: ``unknown``, attempt 1, error reason ``lease expired``,
    their log rows written. Their task must not be idempotent with attempts left (those run again).
    """
    claimed, _, _ = claims.claim(clock.now(), "dead-node", count, lease)
    for claim in claimed:
        _start(claim, clock.now())
    clock.advance(lease + 1)
    inline_runner(clock, node_id="rescuer").tick()
    sequences = [claim.execution.sequence for claim in claimed]
    unknown = list(
        Execution.objects.filter(sequence__in=sequences, status=Status.UNKNOWN).order_by("sequence")
    )
    assert len(unknown) == count, f"{len(unknown)} of {count} executions were left unknown"
    return unknown


def ran_once(task_id: str, occurrence_id: Any, *attempts: int) -> Counter[str]:
    """The starts of one occurrence whose ``attempts`` (attempt 1 if none given) each ran exactly once.

    Compare with what ran: ``starts()`` of the side-effect files (tests/system/processes.py)
    or ``hooks.started()`` in this process; add two of them for two occurrences.
    """
    return Counter(start_line(task_id, occurrence_id, attempt) for attempt in attempts or (1,))


def transitions(occurrence_id: Any) -> list[tuple[str, str]]:
    """The (from_status, to_status) of an execution's events, in the order they were written."""
    events = ExecutionEvent.objects.filter(execution__occurrence_id=occurrence_id).order_by("id")
    return list(events.values_list("from_status", "to_status"))


def nested(levels: int) -> Any:
    """1 inside ``levels`` lists: JSON nested that deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def task_form(task: Task | None = None, **overrides: Any) -> dict[str, Any]:
    """The task form as a browser posts it, from a task or defaults."""
    source = task.to_definition() if task else definition("report")
    data: dict[str, Any] = {
        "name": source.get("name", ""),
        "description": source.get("description", ""),
        "cron": source["cron"] or "",
        "timezone": source.get("timezone", ""),
        "misfire_grace_seconds": "",
        "misfire_policy": source.get("misfire_policy", "coalesce"),
        "jitter_seconds": source.get("jitter_seconds", 0),
        "retry_max_attempts": (source.get("retry") or {}).get("max_attempts", 1),
        "retry_backoff": json.dumps((source.get("retry") or {}).get("backoff", [])),
        "max_concurrency": source.get("max_concurrency", 1),
        "overlap": source.get("overlap", "skip"),
        "params": json.dumps(source.get("params") or {}),
        "_save": "Save",
    }
    if source.get("enabled", True):
        data["enabled"] = "on"
    if task is None:
        data["id"] = source["id"]
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}
