"""On PostgreSQL a claim reads and writes through fixed statements (scheduler_app.postgres.claims); they must claim
exactly what the ORM path claims: the same rows, limits, interruptions, tokens and events."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from scheduler_app import occurrences, scheduler, statements
from scheduler_app.models import Execution, ExecutionEvent, Status, Task
from scheduler_app.runner import claims, scheduling
from tests.factories import T0, definition

pytestmark = pytest.mark.django_db(transaction=True)


def workload(clock) -> None:
    """Rows of every kind a claim meets: free slots, a limit reached, a task at capacity, a
    disabled task's scheduled occurrence, a paused task's backfilled one, a retry not yet due."""
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
    # A backfilled occurrence of a paused task: held, neither claimed nor ended.
    scheduler.register(definition("held", cron="* * * * *"))
    backfilled = occurrences.scheduled(
        Task.objects.get(id="held"), T0 - timedelta(minutes=5), clock.now(), Status.PENDING, source="backfill"
    )
    occurrences.insert([(backfilled, "backfilled")], "", clock.now())
    scheduler.pause("held")
    clock.advance(1)


def snapshot() -> list[dict[str, Any]]:
    rows = []
    for row in Execution.objects.order_by("task_id", "idempotency_key", "scheduled_for"):
        values = {
            f: getattr(row, f)
            for f in ("task_id", "idempotency_key", "status", "owner", "attempt", "task_revision", "error")
        }
        values["lease"] = row.lease_expires_at and row.lease_expires_at - row.updated_at
        values["started"] = row.started_at and row.started_at - row.updated_at
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
    # The first three taken also started, as for waiting workers: but the one asked to stop.
    Execution.objects.filter(task_id="two", idempotency_key="b").update(stop_requested=True)
    taken, ended, _ = claims.claim(clock.now(), "node-a", 10, 60, start=3)
    assert [c.started for c in taken] == [True, False, True, None]
    # (the workload's running row of "full" was never claimed: it has no token)
    leased = Execution.objects.filter(status__in=[Status.CLAIMED, Status.RUNNING]).exclude(execution_token="")
    stored = {e.sequence: e.execution_token for e in leased}
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


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the fixed claim statements are PostgreSQL's")
def test_a_claim_reads_due_rows_in_index_order_and_no_more_than_it_locks(clock, monkeypatch):
    """However many rows are due, the candidates are read in (due_at, sequence) order from the
    index and the read stops at the limit: no sort of every due row (a burst of 10,000 due rows
    made each claim read them all)."""
    import json

    from scheduler_app.postgres import claims as fixed

    scheduler.register(definition("many", cron="0 0 1 1 *", max_concurrency=5))
    now = clock.now()
    Execution.objects.bulk_create(
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id="many",
            task_revision=1,
            trigger_type="manual",
            status=Status.PENDING,
            due_at=now - timedelta(seconds=n % 7),
            params={},
            max_attempts=1,
            created_at=now,
            updated_at=now,
        )
        for n in range(3000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    sent: list[tuple[str, list[Any]]] = []
    monkeypatch.setattr(
        fixed, "_fetch", lambda model, sql, params, names=None, **_: sent.append((sql, params)) or []
    )
    fixed.candidates(now, 40)
    ((sql, params),) = sent
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        """The plan's nodes, without the subquery's (the slot counts of tasks at capacity)."""
        children = [c for c in node.get("Plans", []) if c.get("Parent Relationship") != "SubPlan"]
        return [node, *(n for child in children for n in nodes(child))]

    every = nodes(plan[0]["Plan"])
    assert "Sort" not in [n["Node Type"] for n in every]
    (scan,) = [
        n for n in every if n.get("Relation Name") == "scheduler_app_execution" and n.get("Alias") == "e"
    ]
    assert scan["Actual Rows"] <= 40


def schedule_workload(clock) -> list[dict[str, Any]]:
    """Occurrences of every kind the scheduling step writes, and a second pass that finds them written:
    a run merging missed fire times, a misfire record, overlap skips, jitter, params; then every
    column of every row and its events."""
    scheduler.register(definition("merged", misfire_grace_seconds=300, params={"k": [1, {"a": None}]}))
    scheduler.register(definition("jittered", cron="*/5 * * * *", jitter_seconds=90))
    scheduler.register(definition("busy", overlap="skip"))
    scheduler.trigger("busy")
    claims.claim(clock.now(), "node-a", 1, 600)
    clock.advance(10 * 60 + 30)
    scheduling.schedule_due(clock.now(), "node-z")
    Task.objects.update(next_run_at=clock.now() - timedelta(minutes=2))
    scheduling.schedule_due(clock.now(), "node-z")
    rows = []
    for row in Execution.objects.exclude(trigger_type="manual").order_by(
        "task_id", "scheduled_for", "status"
    ):
        values = {f.attname: getattr(row, f.attname) for f in Execution._meta.concrete_fields}
        values.pop("sequence")
        values["events"] = [
            (e.at, e.from_status, e.to_status, e.reason, e.node, e.attempt, e.result, e.error)
            for e in ExecutionEvent.objects.filter(execution_id=row.sequence).order_by("id")
        ]
        rows.append(values)
    rows.append({"next_run_at": dict(Task.objects.values_list("id", "next_run_at"))})
    return rows


def test_the_fixed_statement_schedules_what_the_orm_schedules(clock, monkeypatch):
    if statements.journal_statements() is statements.ORM:
        pytest.skip("the fixed scheduling statement is PostgreSQL's")
    start = clock.now()
    fast = schedule_workload(clock)
    for model in (ExecutionEvent, Execution, Task):
        model.objects.all().delete()
    clock.set(start)
    monkeypatch.setattr(connection, statements.ATTRIBUTE, statements.ORM)
    assert schedule_workload(clock) == fast
    reasons = [event[3] for row in fast for event in row.get("events", [])]
    assert "scheduled, merging 4 missed fire times" in reasons
    assert any(reason.startswith("misfire: missed") for reason in reasons)
    assert any(reason.startswith("overlap") for reason in reasons)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the fixed claim statements are PostgreSQL's")
def test_the_candidates_pass_over_tasks_whose_leased_and_unknown_rows_fill_their_slots(clock):
    from django.db import transaction

    from scheduler_app.postgres import claims as fixed

    slots = {"free": (1, []), "leased-full": (1, ["running"]), "unknown-full": (1, ["unknown"])}
    slots |= {"unknown-half": (2, ["unknown"]), "mixed-full": (2, ["unknown", "claimed"])}
    slots |= {"deleted": (1, ["unknown"])}
    for task_id, (limit, occupying) in slots.items():
        scheduler.register(definition(task_id, cron="0 0 1 1 *", max_concurrency=limit))
        for n, status in enumerate(occupying):
            scheduler.trigger(task_id, idempotency_key=f"busy-{n}")
            Execution.objects.filter(task_id=task_id, idempotency_key=f"busy-{n}").update(status=status)
        scheduler.trigger(task_id, idempotency_key="waiting")
    scheduler.unregister("deleted")  # its waiting row passes, for the claim to end it
    clock.advance(1)
    with transaction.atomic():
        found = sorted(row.task_id for row in fixed.candidates(clock.now(), 10))
        by_orm = sorted(row.task_id for row in statements.ORM.candidates(clock.now(), 10))
    assert found == by_orm == ["deleted", "free", "unknown-half"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the fixed claim statements are PostgreSQL's")
def test_the_rows_the_fixed_statements_read_are_the_models_the_orm_loads(clock):
    """Built without Model.__init__ (models.built): the same field values, loaded from the
    database, the fields left out read on use, and saved as the ORM's are."""
    from scheduler_app.postgres import claims as fixed

    scheduler.register(definition("read", cron="0 0 1 1 *", params={"k": [1, {"a": None}]}))
    scheduler.trigger("read", params={"extra": "x"})
    (row,) = fixed.candidates(clock.now(), 10)
    loaded = Execution.objects.get(sequence=row.sequence)
    assert (row._state.adding, row._state.db) == (False, loaded._state.db)
    assert row.get_deferred_fields() >= {"params", "owner", "lease_expires_at"}
    for name in fixed.CANDIDATE_FIELDS:
        assert getattr(row, name) == getattr(loaded, name)
    assert row.params == {"k": [1, {"a": None}], "extra": "x"}  # read on use
    tasks = fixed.lock_tasks({"read"})
    task = Task.objects.get(id="read")
    assert {f.attname: getattr(tasks["read"], f.attname) for f in Task._meta.concrete_fields} == {
        f.attname: getattr(task, f.attname) for f in Task._meta.concrete_fields
    }
    row.owner = "someone"
    row.save(update_fields=["owner"])
    assert Execution.objects.get(sequence=row.sequence).owner == "someone"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the fixed claim statements are PostgreSQL's")
def test_the_rows_a_claim_starts_are_claimed_and_started_by_one_update(clock):
    """A start after the claim's UPDATE wrote each row a second time (a row version and index
    entries more), in a statement more."""
    from django.test.utils import CaptureQueriesContext

    scheduler.register(definition("three", cron="0 0 1 1 *", max_concurrency=3))
    for _ in range(3):
        scheduler.trigger("three")
    with CaptureQueriesContext(connection) as queries:
        taken, _, _ = claims.claim(clock.now(), "node-a", 3, 60, start=2)
    assert [c.started for c in taken] == [True, True, None]
    sent = [q["sql"] for q in queries]
    assert len([sql for sql in sent if 'UPDATE "scheduler_app_execution"' in sql]) == 1, sent
    assert len(sent) == 6, sent  # BEGIN, the candidates, the tasks, their slots, the update, COMMIT


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the database, not rows")
def test_a_claim_locks_a_bounded_number_of_rows_past_its_limit_however_few_it_may_take(clock, monkeypatch):
    """Each row a claim reads is locked until it commits. A busy task's backlog (two free slots, a
    claim of limit 100) costs the claim its limit and PASS_OVER rows, not a multiple of its limit."""
    import threading

    from django.db import connections, transaction

    from scheduler_app.statements import journal_statements

    scheduler.register(definition("backlog", cron="0 0 1 1 *", max_concurrency=2))
    scheduler.trigger_many("backlog", [{} for _ in range(300)])
    kind = type(journal_statements())
    original = kind.take
    free_during_claim: list[int] = []

    def count_unlocked() -> None:
        try:
            with transaction.atomic():
                rows = Execution.objects.select_for_update(skip_locked=True).filter(status=Status.PENDING)
                free_during_claim.append(len(list(rows.values_list("sequence", flat=True))))
        finally:
            connections.close_all()

    def take(self, chosen, *args, **kwargs):
        other = threading.Thread(target=count_unlocked)
        other.start()
        other.join(30)
        return original(self, chosen, *args, **kwargs)

    monkeypatch.setattr(kind, "take", take)
    taken, _, _ = claims.claim(clock.now(), "node-a", 100, 60)
    assert len(taken) == 2
    assert free_during_claim == [300 - (100 + claims.PASS_OVER)]
