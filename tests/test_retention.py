"""Journal retention (JOURNAL_RETENTION_DAYS): ended executions older than the retention go with their
events and log rows, in bounded batches, once a minute across the cluster; nothing else goes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

from scheduler_app import retention, scheduler
from scheduler_app.models import (
    TERMINAL,
    Execution,
    ExecutionEvent,
    ExecutionLog,
    MaintenanceMark,
    Status,
    log_id,
)
from tests.factories import definition
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KEEP_30_DAYS = override_settings(SCHEDULER_APP={"JOURNAL_RETENTION_DAYS": 30})


def journal_row(status: str, ended_days_ago: float | None, now, task_id: str = "report") -> Execution:
    """An execution in ``status`` that ended that many days before ``now`` (None: not ended), with one
    event and, when it ended, its log row."""
    ended = None if ended_days_ago is None else now - timedelta(days=ended_days_ago)
    created = (ended or now) - timedelta(minutes=1)
    execution = Execution.objects.create(
        occurrence_id=uuid.uuid4(),
        task_id=task_id,
        task_revision=1,
        trigger_type="manual",
        status=status,
        due_at=created,
        params={},
        max_attempts=1,
        attempt=1,
        created_at=created,
        finished_at=ended,
        updated_at=ended or created,
    )
    ExecutionEvent.objects.create(
        execution=execution, at=created, from_status="", to_status=status, reason="test"
    )
    if ended is not None:
        ExecutionLog.objects.create(
            id=log_id(execution.occurrence_id, 1),
            occurrence_id=execution.occurrence_id,
            task_id=task_id,
            task_name=task_id,
            trigger_type="manual",
            status=status,
            attempt=1,
            started_at=created,
            finished_at=ended,
        )
    return execution


def test_nothing_is_pruned_unless_a_retention_is_set(clock):
    now = clock.now()
    journal_row(Status.SUCCESS, 400, now)
    assert retention.prune_journal(now) == retention.Pruned()
    assert Execution.objects.count() == 1
    assert not MaintenanceMark.objects.exists()


@KEEP_30_DAYS
def test_ended_executions_older_than_the_retention_go_with_their_events_and_logs(clock):
    now = clock.now()
    gone = [journal_row(status, 31, now) for status in TERMINAL]
    kept = [
        journal_row(Status.SUCCESS, 29, now),
        journal_row(Status.UNKNOWN, 400, now),  # waits for an operator, however old
        journal_row(Status.PENDING, None, now),
        journal_row(Status.CLAIMED, None, now),
        journal_row(Status.RUNNING, None, now),
    ]
    pruned = retention.prune_journal(now)
    assert (pruned.executions, pruned.events, pruned.logs) == (4, 4, 4)
    assert set(Execution.objects.values_list("sequence", flat=True)) == {e.sequence for e in kept}
    assert set(ExecutionEvent.objects.values_list("execution_id", flat=True)) == {e.sequence for e in kept}
    assert set(ExecutionLog.objects.values_list("occurrence_id", flat=True)) == {
        e.occurrence_id for e in kept if e.finished_at is not None
    }
    assert not ExecutionLog.objects.filter(occurrence_id__in=[e.occurrence_id for e in gone]).exists()


@KEEP_30_DAYS
def test_the_log_rows_of_every_attempt_go(clock):
    now = clock.now()
    retried = journal_row(Status.FAILED, 31, now)
    kept = journal_row(Status.SUCCESS, 29, now)
    Execution.objects.filter(sequence=retried.sequence).update(attempt=3, max_attempts=3)
    for attempt in (2, 3):
        ExecutionLog.objects.create(
            id=log_id(retried.occurrence_id, attempt),
            occurrence_id=retried.occurrence_id,
            task_id="report",
            trigger_type="manual",
            status=Status.FAILED,
            attempt=attempt,
            finished_at=retried.finished_at,
        )
    assert retention.prune_journal(now).logs == 3
    assert list(ExecutionLog.objects.values_list("occurrence_id", flat=True)) == [kept.occurrence_id]


@KEEP_30_DAYS
def test_one_turn_a_minute_across_the_cluster_in_batches_within_its_budget(clock):
    now = clock.now()
    for _ in range(7):
        journal_row(Status.SUCCESS, 40, now)
    # A budget of 0 s: one batch per turn.
    assert retention.prune_journal(now, batch=3, budget_seconds=0).executions == 3
    assert retention.prune_journal(now + timedelta(seconds=59), batch=3, budget_seconds=0).executions == 0
    assert retention.prune_journal(now + timedelta(seconds=60), batch=3).executions == 4
    assert Execution.objects.count() == 0
    assert MaintenanceMark.objects.get(name=retention.JOURNAL_MARK).last_run_at == now + timedelta(seconds=60)


@KEEP_30_DAYS
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no row locks to skip")
def test_rows_another_transaction_holds_are_left_for_a_later_turn_without_waiting(clock):
    """A row locked elsewhere (a claim, an operator's resolve) is skipped, not waited for: the turn
    deletes the others while the lock is held, and the next turn takes it."""
    import threading

    from django.db import connections, transaction

    now = clock.now()
    held, *_ = [journal_row(Status.SUCCESS, 40, now) for _ in range(3)]
    locked, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Execution.objects.select_for_update().filter(sequence=held.sequence))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()
            done.set()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert locked.wait(30)
        pruned = retention.prune_journal(now)
        assert pruned.executions == 2
        assert list(Execution.objects.values_list("sequence", flat=True)) == [held.sequence]
        assert ExecutionLog.objects.filter(occurrence_id=held.occurrence_id).exists()
    finally:
        release.set()
        assert done.wait(30)
    assert retention.prune_journal(now + timedelta(minutes=1)).executions == 1
    assert not Execution.objects.exists()


@KEEP_30_DAYS
def test_the_oldest_go_first(clock):
    now = clock.now()
    old, *_ = [journal_row(Status.FAILED, days, now) for days in (50, 60, 70)]
    retention.prune_journal(now, batch=2, budget_seconds=0)
    assert list(Execution.objects.values_list("sequence", flat=True)) == [old.sequence]


@KEEP_30_DAYS
def test_an_idempotency_key_is_remembered_as_long_as_its_execution_is_kept(clock):
    """After retention deleted it, the same key starts a new execution (docs/concepts.md says so)."""
    scheduler.register(definition(cron="0 0 1 1 *"))
    first = scheduler.trigger("report", idempotency_key="2026-10")
    Execution.objects.filter(sequence=first.sequence).update(
        status=Status.SUCCESS, finished_at=clock.now() - timedelta(days=31)
    )
    assert scheduler.trigger("report", idempotency_key="2026-10").sequence == first.sequence
    retention.prune_journal(clock.now())
    assert scheduler.trigger("report", idempotency_key="2026-10").sequence != first.sequence


@override_settings(
    SCHEDULER_APP={"JOURNAL_RETENTION_DAYS": 30, "HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"}}
)
def test_a_runner_with_workers_prunes_on_a_thread_of_its_own(clock):
    from scheduler_app.runner.loop import SchedulerLoop

    old = journal_row(Status.SUCCESS, 45, clock.now())
    runner = SchedulerLoop(node_id="pruner", workers=2, clock=clock)
    runner.start()
    try:
        runner.tick()
        assert wait_for(lambda: not Execution.objects.filter(sequence=old.sequence).exists(), 10)
    finally:
        runner.stop()
    assert not ExecutionLog.objects.filter(occurrence_id=old.occurrence_id).exists()


def test_a_task_grace_must_be_shorter_than_the_journal_retention(settings):
    from scheduler_app import scheduler
    from scheduler_app.exceptions import InvalidDefinition
    from tests.factories import definition

    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "JOURNAL_RETENTION_DAYS": 2}
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.register(definition(misfire_grace_seconds=2 * 86400))
    assert refused.value.errors == {
        "misfire_grace_seconds": ["Must be shorter than the journal's retention (JOURNAL_RETENTION_DAYS)."]
    }
    assert scheduler.register(definition(misfire_grace_seconds=2 * 86400 - 1)).misfire_grace_seconds == 172799


def test_the_rows_of_runners_not_seen_for_a_week_go_once_an_hour():
    from datetime import UTC, datetime

    from scheduler_app.models import Runner

    now = datetime(2026, 3, 20, 9, 0, tzinfo=UTC)
    for node, age in (("gone", timedelta(days=8)), ("recent", timedelta(days=6)), ("alive", timedelta(0))):
        Runner.objects.create(
            node_id=node,
            host="h",
            pid=1,
            started_at=now - age,
            last_seen_at=now - age,
            silent_after=now - age,
        )
    assert retention.prune_runners(now) == 1
    assert sorted(Runner.objects.values_list("node_id", flat=True)) == ["alive", "recent"]
    Runner.objects.filter(node_id="recent").update(last_seen_at=now - timedelta(days=9))
    assert retention.prune_runners(now + timedelta(minutes=59)) == 0
    assert retention.prune_runners(now + timedelta(hours=1)) == 1
