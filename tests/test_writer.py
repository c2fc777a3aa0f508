"""Group commit: a batch writes exactly what the one-attempt paths write, and stays fenced."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connections
from django.db.models import BooleanField, ExpressionWrapper, Q

from scheduler_app import scheduler, statements
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Status
from scheduler_app.runner import claims, writer
from scheduler_app.runner.attempt import Attempt
from scheduler_app.runner.recording import Outcome, plan_finish, record_finish, record_start
from tests.factories import definition

pytestmark = pytest.mark.django_db(transaction=True)

COMPARED = (
    "status",
    "attempt",
    "owner",
    "execution_token",
    "lease_expires_at",
    "started_at",
    "finished_at",
    "due_at",
    "result",
    "error",
    "log_persistence",
)
OUTCOMES = [
    Outcome(Status.SUCCESS, "succeeded", result={"rows": 3}),
    Outcome(Status.SUCCESS, "succeeded", result=None),
    Outcome(Status.FAILED, "failed", error={"code": "scheduler:023", "message": "boom"}),
    Outcome(Status.INTERRUPTED, "skipped by the task", error={"reason": "skipped", "message": "no"}),
]


@pytest.fixture(params=["transaction", "statement"])
def write(request):
    """Each way to write a batch: the ORM transaction (every backend), one statement (PostgreSQL)."""
    chosen = statements.ORM
    if request.param == "statement":
        chosen = statements.journal_statements()
        if chosen is statements.ORM:
            pytest.skip("one statement per batch is PostgreSQL's")
    return lambda group, node, now: writer.write_group(chosen, group, node, now)


def claimed(clock, task_id: str, n: int, **task: Any) -> list[Attempt]:
    scheduler.register(definition(task_id, cron="0 0 1 1 *", max_concurrency=10, **task))
    for i in range(n):
        scheduler.trigger(task_id, idempotency_key=f"k{i}")
    taken, _, _ = claims.claim(clock.now(), "node-a", n, 60)
    return [Attempt(claim) for claim in sorted(taken, key=lambda c: c.execution.sequence)]


def state(attempt: Attempt) -> dict[str, Any]:
    row = Execution.objects.get(sequence=attempt.claim.execution.sequence)
    values = {name: getattr(row, name) for name in COMPARED}
    for name in ("lease_expires_at", "started_at", "finished_at", "due_at"):
        if values[name] is not None:
            values[name] = values[name] - row.created_at
    values["owner"] = bool(values["owner"])
    values["execution_token"] = bool(values["execution_token"])
    events = ExecutionEvent.objects.filter(execution_id=row.sequence).order_by("id")
    values["events"] = [(e.from_status, e.to_status, e.reason, e.attempt, e.result, e.error) for e in events]
    log = ExecutionLog.objects.filter(occurrence_id=row.occurrence_id).values_list(
        "status", "result", "error"
    )
    values["logs"] = list(log)
    # JSON null and SQL NULL both read back as None: tell them apart.
    values["sql_nulls"] = [
        list(model.objects.filter(**match).values_list(sql_null("result"), sql_null("error")))
        for model, match in (
            (Execution, {"sequence": row.sequence}),
            (ExecutionEvent, {"execution_id": row.sequence}),
            (ExecutionLog, {"occurrence_id": row.occurrence_id}),
        )
    ]
    return values


def sql_null(column: str) -> Any:
    return ExpressionWrapper(Q(**{f"{column}__isnull": True}), output_field=BooleanField())


def run_singly(attempts: list[Attempt], clock) -> None:
    for attempt in attempts:
        assert record_start(attempt, "node-a", clock.now())
        attempt.claim.execution.started_at = clock.now()
    for attempt, outcome in zip(attempts, OUTCOMES, strict=True):
        assert record_finish(plan_finish(attempt, clock.now(), outcome, Status.RUNNING), "node-a")[1]


def run_batched(attempts: list[Attempt], clock, write) -> None:
    answers = write([writer._Request(a) for a in attempts], "node-a", clock.now())
    assert [started for started, _ in answers] == [True] * len(attempts)
    for attempt in attempts:
        attempt.claim.execution.started_at = clock.now()
    requests = [
        writer._Request(a, outcome, Status.RUNNING) for a, outcome in zip(attempts, OUTCOMES, strict=True)
    ]
    assert [done for _, done, _ in write(requests, "node-a", clock.now())] == [True] * len(attempts)


def test_a_batch_writes_the_same_rows_events_and_logs_as_one_by_one(clock, write):
    retry = {"retry": {"max_attempts": 2, "backoff": [30]}}
    single = claimed(clock, "single", 4, **retry)
    batched = claimed(clock, "batched", 4, **retry)
    clock.advance(1)
    run_singly(single, clock)
    run_batched(batched, clock, write)
    assert [state(a) for a in batched] == [state(a) for a in single]
    assert state(batched[0])["events"][-1][4:] == ({"rows": 3}, None)
    assert state(batched[2])["events"][-1][4:] == (None, {"code": "scheduler:023", "message": "boom"})
    assert [state(a)["status"] for a in batched] == [
        Status.SUCCESS,
        Status.SUCCESS,
        Status.PENDING,  # failed attempt 1 of 2: a retry waits 30 s
        Status.INTERRUPTED,
    ]


def test_a_batch_refuses_what_it_no_longer_owns_and_does_not_start_stopped_rows(clock, write):
    mine, stolen, stopped = claimed(clock, "report", 3)
    Execution.objects.filter(sequence=stolen.claim.execution.sequence).update(execution_token="someone-else")
    scheduler.executions.request_stop(stopped.claim.execution.occurrence_id, by="ops")
    answers = write([writer._Request(a) for a in (mine, stolen, stopped)], "node-a", clock.now())
    assert [started for started, _ in answers] == [True, False, False]
    statuses = [
        Execution.objects.get(sequence=a.claim.execution.sequence).status for a in (mine, stolen, stopped)
    ]
    assert statuses == [Status.RUNNING, Status.CLAIMED, Status.CLAIMED]
    late = writer._Request(stolen, OUTCOMES[0], Status.CLAIMED)
    answers = write([late, writer._Request(mine, OUTCOMES[0], Status.RUNNING)], "node-a", clock.now())
    assert [(done, log_written) for _, done, log_written in answers] == [(False, False), (True, True)]
    assert Execution.objects.get(sequence=stolen.claim.execution.sequence).status == Status.CLAIMED
    assert not ExecutionEvent.objects.filter(
        execution_id=stolen.claim.execution.sequence, to_status=Status.SUCCESS
    )


def test_the_writer_thread_answers_concurrent_workers(clock):
    attempts = claimed(clock, "report", 8)
    journal_writer = writer.JournalWriter("node-a", clock)
    gate = threading.Barrier(len(attempts))
    answers: dict[int, bool] = {}

    def work(attempt: Attempt) -> None:
        gate.wait()
        started, _ = journal_writer.start(attempt)
        answers[attempt.claim.execution.sequence] = started
        connections.close_all()

    threads = [threading.Thread(target=work, args=(a,)) for a in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    journal_writer.stop(10)
    assert sorted(answers.values()) == [True] * len(attempts)
    assert Execution.objects.filter(status=Status.RUNNING).count() == len(attempts)
    assert ExecutionEvent.objects.filter(to_status=Status.RUNNING).count() == len(attempts)


def test_a_batch_that_fails_is_written_one_request_at_a_time(clock, monkeypatch):
    attempts = claimed(clock, "report", 8)
    failures = []

    def fail(statements, batch, node, now):
        failures.append(len(batch))
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(writer, "write_group", fail)
    journal_writer = writer.JournalWriter("node-a", clock)
    batch = [writer._Request(a) for a in attempts]
    journal_writer._write(batch)  # as the writer thread does with what it dequeued together
    journal_writer.stop(10)
    assert failures == [len(attempts)]
    assert [request.answer.result()[0] for request in batch] == [True] * len(attempts)
    assert Execution.objects.filter(status=Status.RUNNING).count() == len(attempts)
    assert ExecutionEvent.objects.filter(to_status=Status.RUNNING).count() == len(attempts)


def test_a_retry_planned_in_a_batch_is_due_after_its_backoff(clock, write):
    (attempt,) = claimed(clock, "report", 1, retry={"max_attempts": 3, "backoff": [45]})
    other = claimed(clock, "other", 1)[0]
    write([writer._Request(attempt), writer._Request(other)], "node-a", clock.now())
    write(
        [
            writer._Request(attempt, OUTCOMES[2], Status.RUNNING),
            writer._Request(other, OUTCOMES[0], Status.RUNNING),
        ],
        "node-a",
        clock.now(),
    )
    row = Execution.objects.get(sequence=attempt.claim.execution.sequence)
    assert (row.status, row.owner, row.execution_token) == (Status.PENDING, "", "")
    assert row.due_at == clock.now() + timedelta(seconds=45)


def test_every_claimed_row_gets_a_token_of_its_own_and_a_new_one_at_each_claim(clock):
    first = claimed(clock, "report", 3)
    tokens = [a.claim.token for a in first]
    stored = [Execution.objects.get(sequence=a.claim.execution.sequence).execution_token for a in first]
    assert stored == tokens and len(set(tokens)) == 3
    Execution.objects.update(status=Status.PENDING, execution_token="", owner="")
    again, _, _ = claims.claim(clock.now(), "node-b", 3, 60)
    assert not {c.token for c in again} & set(tokens)


def test_event_rows_carry_no_database_foreign_key_and_go_with_their_execution(clock):
    """The database checks no key per event row (four per execution on the hot path); deleting an
    execution through Django still deletes its events."""
    from django.db import connection

    with connection.cursor() as cursor:
        keys = connection.introspection.get_constraints(cursor, ExecutionEvent._meta.db_table)
    assert [name for name, c in keys.items() if c["foreign_key"]] == []
    assert any(c["columns"] == ["execution_id"] and c["index"] for c in keys.values())
    (attempt,) = claimed(clock, "gone", 1)
    execution = Execution.objects.get(sequence=attempt.claim.execution.sequence)
    assert ExecutionEvent.objects.filter(execution=execution).count() == 2
    execution.delete()
    assert not ExecutionEvent.objects.filter(execution_id=attempt.claim.execution.sequence).exists()


@pytest.mark.parametrize("path", ["one by one", "batch"])
def test_no_result_is_registered_once_a_stop_was_requested(clock, write, path):
    """The seed's rule: a stop request committed before an outcome arrives turns it into interrupted,
    result dropped, even when the runner had not yet read the request; an interruption, an unknown
    outcome (a handler that may still run), and rows with no stop requested are recorded as they are."""
    attempts = claimed(clock, "report", 5, retry={"max_attempts": 3})
    succeeded, retried, interrupted, abandoned, _untouched = attempts
    for attempt in attempts:
        assert record_start(attempt, "node-a", clock.now())
        attempt.claim.execution.started_at = clock.now()
    for attempt in (succeeded, retried, interrupted, abandoned):
        scheduler.executions.request_stop(attempt.claim.execution.occurrence_id, by="ops")
    lost = Outcome(Status.UNKNOWN, "time limit exceeded", error={"reason": "time limit", "message": "gone"})
    outcomes = [OUTCOMES[0], OUTCOMES[2], OUTCOMES[3], lost, OUTCOMES[0]]
    clock.advance(1)
    if path == "one by one":
        answers = [
            record_finish(plan_finish(a, clock.now(), o, Status.RUNNING), "node-a")
            for a, o in zip(attempts, outcomes, strict=True)
        ]
    else:
        requests = [writer._Request(a, o, Status.RUNNING) for a, o in zip(attempts, outcomes, strict=True)]
        answers = write(requests, "node-a", clock.now())
    assert [recorded for _, recorded, _ in answers] == [True] * 5
    rows = [Execution.objects.get(sequence=a.claim.execution.sequence) for a in attempts]
    assert [(row.status, row.result) for row in rows] == [
        (Status.INTERRUPTED, None),
        (Status.INTERRUPTED, None),
        (Status.INTERRUPTED, None),
        (Status.UNKNOWN, None),
        (Status.SUCCESS, {"rows": 3}),
    ]
    assert rows[0].error == rows[1].error == {"reason": "stop requested", "message": "stop requested"}
    assert rows[2].error == {"reason": "skipped", "message": "no"}
    logged = dict(ExecutionLog.objects.values_list("occurrence_id", "status"))
    assert [logged[row.occurrence_id] for row in rows] == ["interrupted"] * 3 + ["unknown", "success"]


def test_an_answer_reaches_its_waiter_or_its_callback_and_a_failing_callback_is_only_logged(caplog):
    waited = writer._Answer()
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(waited.result()))
    waiter.start()
    waited.set_result(("started", 1))
    waiter.join(10)
    assert got == [("started", 1)] and waited.done

    failed = writer._Answer()
    failed.set_exception(OperationalError("gone"))
    with pytest.raises(OperationalError):
        failed.result()

    handed: list[Any] = []
    writer._Answer(lambda answer: handed.append(answer.result())).set_result("recorded")
    assert handed == ["recorded"]

    def broken(answer: Any) -> None:
        raise RuntimeError("a bug after the commit")

    writer._Answer(broken).set_result("recorded")  # the writer thread goes on
    assert "handing on a journal write's answer failed" in caplog.text
