"""On PostgreSQL a claim reads and writes through fixed statements (scheduler_app.postgres.claims); they must claim
exactly what the ORM path claims: the same rows, limits, interruptions, tokens and events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from scheduler_app import scheduler, statements
from scheduler_app.models import Execution, ExecutionEvent, Status, Task
from scheduler_app.runner import claims, scheduling
from tests.factories import definition

pytestmark = pytest.mark.django_db(transaction=True)


def workload(clock) -> None:
    """Rows of every kind a claim meets: free slots, a limit reached, a task at capacity, a
    disabled task's scheduled occurrence, a retry not yet due."""
    scheduler.register(definition("two", cron="0 0 1 1 *", max_concurrency=2))
    scheduler.register(definition("five", cron="0 0 1 1 *", max_concurrency=5))
    scheduler.register(definition("full", cron="0 0 1 1 *", max_concurrency=1))
    scheduler.register(definition("off", cron="* * * * *"))
    for key in "abc":
        scheduler.trigger("two", idempotency_key=key)
    for key in "ab":
        scheduler.trigger("five", idempotency_key=key, params={"k": key})
    for key in "ab":
        scheduler.trigger("full", idempotency_key=key)
    Execution.objects.filter(task_id="full", idempotency_key="a").update(status=Status.RUNNING)
    clock.advance(60)
    scheduler.trigger("five", idempotency_key="later")
    Execution.objects.filter(idempotency_key="later").update(due_at=clock.now() + timedelta(hours=1))
    scheduling.schedule_due(clock.now(), "node-z")
    scheduler.update_task("off", enabled=False)
    clock.advance(1)


def snapshot() -> list[dict[str, Any]]:
    rows = []
    for row in Execution.objects.order_by("task_id", "idempotency_key", "scheduled_for"):
        values = {
            f: getattr(row, f)
            for f in ("task_id", "idempotency_key", "status", "owner", "attempt", "task_revision", "error")
        }
        values["lease"] = row.lease_expires_at and row.lease_expires_at - row.updated_at
        token, sequence = row.execution_token, str(row.sequence)
        # A claim's nonce, then the sequence.
        values["token"] = token and (len(token) - len(sequence), token.endswith(sequence))
        values["events"] = [
            (e.from_status, e.to_status, e.reason, e.node, e.attempt, e.result, e.error)
            for e in ExecutionEvent.objects.filter(execution_id=row.sequence).order_by("id")
        ]
        rows.append(values)
    return rows


def claim_all(clock) -> tuple[list[tuple[str, str | None]], list[str], list[dict[str, Any]]]:
    taken, ended = claims.claim(clock.now(), "node-a", 10, 60)
    stored = {e.sequence: e.execution_token for e in Execution.objects.filter(status=Status.CLAIMED)}
    assert {c.execution.sequence: c.token for c in taken} == stored
    for c in taken:
        assert c.task == Task.objects.get(id=c.execution.task_id)
        fresh = Execution.objects.get(sequence=c.execution.sequence)
        assert [getattr(c.execution, f.attname) for f in Execution._meta.concrete_fields] == [
            getattr(fresh, f.attname) for f in Execution._meta.concrete_fields
        ]
    claimed = sorted((c.execution.task_id, c.execution.idempotency_key) for c in taken)
    return claimed, sorted(e.execution.task_id for e in ended), snapshot()


def test_the_fixed_statements_claim_what_the_orm_claims(clock, monkeypatch):
    if statements.journal_statements() is statements.ORM:
        pytest.skip("the fixed claim statements are PostgreSQL's")
    workload(clock)
    fast = claim_all(clock)
    for model in (ExecutionEvent, Execution, Task):
        model.objects.all().delete()
    workload(clock)
    monkeypatch.setattr(connection, statements.ATTRIBUTE, statements.ORM)
    assert claim_all(clock) == fast
    claimed, ended, _ = fast
    assert claimed == [("five", "a"), ("five", "b"), ("two", "a"), ("two", "b")]
    assert ended == ["off"]
