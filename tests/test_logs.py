"""The log projection: separate from the journal, repairable, pruned without touching the journal, and
read through get_logs."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.db.utils import load_backend
from django.test import override_settings

from scheduler_app import retention, scheduler
from scheduler_app.exceptions import Conflict, InvalidDefinition, InvalidState
from scheduler_app.models import (
    Execution,
    ExecutionLog,
    LogPersistence,
    MaintenanceMark,
    Status,
    TriggerType,
    log_id,
)
from scheduler_app.runner import claims
from tests.factories import (
    T0,
    definition,
    expire_lease,
    inline_runner,
    run_one_by_one,
    unknown_as_a_crash_leaves_it,
)

pytestmark = pytest.mark.django_db

BROKEN_LOGS = {"HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"}, "LOG_DATABASE": "broken"}


@pytest.fixture
def broken_log_database():
    """A LOG_DATABASE alias that cannot be reached (a connection made for this test only)."""
    settings = connections.configure_settings(
        {
            "default": {"ENGINE": "django.db.backends.dummy"},
            "broken": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "nowhere",
                "HOST": "127.0.0.1",
                "PORT": "1",
                "USER": "nobody",
                "PASSWORD": "s3cret-password",
                "OPTIONS": {"connect_timeout": 1},
            },
        }
    )["broken"]
    connections["broken"] = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "broken")
    yield
    connections["broken"].close()
    del connections["broken"]


def test_the_log_rows_of_a_minute_s_runs_begin_with_the_minute_and_are_the_same_when_rebuilt(clock):
    """Log rows of executions of one minute take neighbouring ids (a few pages at one end of the log
    table's primary key, not one random page each); each id is still a function of the occurrence
    and the attempt, so a repair overwrites the rows it rebuilds."""
    for n in range(6):
        scheduler.register(
            definition(f"task-{n}", retry={"max_attempts": 2, "backoff": [0]}, params={"fail": n == 0})
        )
    runner = inline_runner(clock)
    clock.advance(60)
    for _ in range(5):
        runner.tick()
    minute = T0 + timedelta(minutes=1)
    rows = list(ExecutionLog.objects.all())
    assert sorted((row.task_id, row.attempt) for row in rows) == [
        ("task-0", 1),
        ("task-0", 2),
        *((f"task-{n}", 1) for n in range(1, 6)),
    ]
    assert {row.id.int >> 80 for row in rows} == {int(minute.timestamp() * 1000)}
    assert all(row.id == log_id(row.occurrence_id, row.attempt) and row.id.version == 7 for row in rows)
    before = sorted(ExecutionLog.objects.values_list("id", "attempt", "status", "error"))
    for execution in Execution.objects.all():
        scheduler.executions.repair_log(execution.occurrence_id)
    assert sorted(ExecutionLog.objects.values_list("id", "attempt", "status", "error")) == before


def test_a_failed_log_write_leaves_the_status_and_marks_pending_then_repair_fixes_it(
    clock, broken_log_database, caplog
):
    scheduler.register(definition(params={"result": 7}))
    runner = inline_runner(clock)
    with override_settings(SCHEDULER_APP=BROKEN_LOGS):
        clock.advance(60)
        runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.result, execution.log_persistence) == ("success", 7, "pending")
    assert list(scheduler.executions.list_log_failures()) == [execution]
    assert "s3cret" not in caplog.text and "nowhere" not in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        f"scheduler:032 log write failed for {execution.occurrence_id}; left pending for repair" in warnings
    )
    rows = scheduler.executions.repair_log(execution.occurrence_id)
    assert [(row.attempt, row.status, row.result) for row in rows] == [(1, "success", 7)]
    assert ExecutionLog.objects.get().id == log_id(execution.occurrence_id, 1)
    execution.refresh_from_db()
    assert execution.log_persistence == "persisted"
    assert scheduler.executions.list_log_failures() == []


def test_a_failed_repair_marks_the_execution_unconfirmed(clock, broken_log_database):
    scheduler.register(definition())
    runner = inline_runner(clock)
    with override_settings(SCHEDULER_APP=BROKEN_LOGS):
        clock.advance(60)
        runner.tick()
        execution = Execution.objects.get()
        from scheduler_app.exceptions import StorageError

        with pytest.raises(StorageError) as caught:
            scheduler.executions.repair_log(execution.occurrence_id)
    assert "s3cret" not in str(caught.value) and "nowhere" not in str(caught.value)
    execution.refresh_from_db()
    assert execution.log_persistence == "unconfirmed"


def test_repair_rebuilds_every_attempt_from_the_journal(clock):
    scheduler.register(definition(retry={"max_attempts": 2, "backoff": [0]}, params={"fail": True}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    runner.tick()
    execution = Execution.objects.get()
    expected = list(ExecutionLog.objects.order_by("attempt").values_list("attempt", "status", "error"))
    ExecutionLog.objects.all().delete()
    # A row the journal does not imply (an attempt 0: the execution ran) goes.
    ExecutionLog.objects.create(
        id=log_id(execution.occurrence_id, 0),
        occurrence_id=execution.occurrence_id,
        task_id="report",
        trigger_type="scheduled",
        status="success",
        attempt=0,
        finished_at=clock.now(),
    )
    scheduler.executions.repair_log(execution.occurrence_id)
    assert (
        list(ExecutionLog.objects.order_by("attempt").values_list("attempt", "status", "error")) == expected
    )
    assert [row[:2] for row in expected] == [(1, "failed"), (2, "failed")]


def test_resolve_unknown_needs_the_current_updated_at(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report")
    (execution,) = unknown_as_a_crash_leaves_it(clock)
    with pytest.raises(Conflict):
        scheduler.executions.resolve_unknown(
            execution.occurrence_id,
            "success",
            expected_updated_at=execution.updated_at - timedelta(microseconds=1),
        )
    resolved = scheduler.executions.resolve_unknown(
        execution.occurrence_id, "success", expected_updated_at=execution.updated_at, by="alice"
    )
    assert resolved.status == "success"
    assert ExecutionLog.objects.get().status == "success"
    with pytest.raises(InvalidState):
        scheduler.executions.resolve_unknown(
            execution.occurrence_id, "success", expected_updated_at=resolved.updated_at
        )
    assert resolved.events.last().reason == "resolved as success by alice"


@override_settings(
    SCHEDULER_APP={
        "HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"},
        "MAX_LOGS": 2,
        "RETENTION_DAYS": 30,
    }
)
def test_retention_prunes_logs_only_and_at_most_once_a_minute(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = inline_runner(clock)
    for _ in range(4):
        scheduler.trigger("report")
        runner.tick()
        clock.advance(1)
    assert ExecutionLog.objects.count() == 4
    later = clock.now() + timedelta(minutes=2)  # the runner's own first prune took the current minute
    assert retention.prune_logs(later) == 2
    assert ExecutionLog.objects.count() == 2
    assert Execution.objects.count() == 4
    scheduler.trigger("report")
    runner.tick()
    assert retention.prune_logs(later + timedelta(seconds=30)) == 0
    assert retention.prune_logs(later + timedelta(seconds=61)) == 1
    assert retention.prune_logs(later + timedelta(days=31)) == 2
    assert MaintenanceMark.objects.get().last_run_at == later + timedelta(days=31)
    assert Execution.objects.count() == 5


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_repairs_leave_one_row_per_attempt(clock):
    scheduler.register(definition(retry={"max_attempts": 3, "backoff": [0]}, params={"fail": True}))
    runner = inline_runner(clock)
    clock.advance(60)
    for _ in range(3):
        runner.tick()
    execution = Execution.objects.get()
    ExecutionLog.objects.all().delete()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def repair() -> None:
        try:
            barrier.wait(timeout=10)
            scheduler.executions.repair_log(execution.occurrence_id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=repair) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert sorted(ExecutionLog.objects.values_list("attempt", flat=True)) == [1, 2, 3]


@pytest.mark.django_db(databases=["default", "logs"])
def test_logs_can_live_in_another_database(clock):
    scheduler.register(definition(params={"result": "elsewhere"}))
    runner = inline_runner(clock)
    with override_settings(SCHEDULER_APP={**BROKEN_LOGS, "LOG_DATABASE": "logs"}):
        clock.advance(60)
        runner.tick()
        assert [log.result for log in scheduler.get_logs().results] == ["elsewhere"]
        execution = Execution.objects.get()
        ExecutionLog.objects.using("logs").all().delete()
        scheduler.executions.repair_log(execution.occurrence_id)
        assert ExecutionLog.objects.using("logs").count() == 1
    assert not ExecutionLog.objects.using("default").exists()
    assert execution.log_persistence == "persisted"


def test_repair_keeps_the_error_of_an_overlap_skip(clock):
    """Found by the journal invariants test: an overlap skip lost its reason when its log was rebuilt."""
    scheduler.register(definition("alpha"))
    scheduler.trigger("alpha")
    claims.claim(clock.now(), "ghost", 1, 30)  # occupies the serial slot
    clock.advance(60)
    inline_runner(clock).tick()  # the minute is skipped: interrupted, reason overlap
    skipped = Execution.objects.get(trigger_type=TriggerType.SCHEDULED)
    written = ExecutionLog.objects.get(occurrence_id=skipped.occurrence_id)
    assert written.error == skipped.error and skipped.error["reason"] == "overlap"
    (rebuilt,) = scheduler.executions.repair_log(skipped.occurrence_id)
    assert rebuilt.error == skipped.error


def test_a_log_row_lost_at_an_earlier_attempt_is_rebuilt_before_the_execution_is_confirmed(clock):
    """Found by the journal invariants test (its ghost_recovers rule): the log write of attempt 2
    must not confirm the row of attempt 1 that nobody wrote; it rebuilds both from the journal."""
    scheduler.register(definition("alpha", cron="0 0 1 1 *", idempotent=True, retry={"max_attempts": 2}))
    execution = scheduler.trigger("alpha")
    runner = inline_runner(clock)
    expire_lease(clock, node="ghost-1")  # attempt 1 starts, its node dies
    claims.recover_expired(clock.now(), "ghost-2")  # -> pending; this node dies before writing the log
    assert not ExecutionLog.objects.exists()
    expire_lease(clock, node="ghost-3")  # attempt 2 starts, its node dies too
    runner.tick()  # recovers attempt 2 as unknown and writes its log rows
    execution.refresh_from_db()
    assert (execution.status, execution.log_persistence) == (Status.UNKNOWN, LogPersistence.PERSISTED)
    assert sorted(ExecutionLog.objects.values_list("attempt", "status")) == [
        (1, Status.UNKNOWN),
        (2, Status.UNKNOWN),
    ]


def test_get_logs_filters_and_paginates(clock):
    scheduler.register(definition("a", cron="0 0 1 1 *"))
    scheduler.register(definition("b", cron="0 0 1 1 *", params={"fail": True}))
    for _ in range(3):
        scheduler.trigger("a", source="ops")
    scheduler.trigger("b")
    runner = inline_runner(clock)
    for _ in range(3):
        runner.tick()
    page = scheduler.get_logs(task_id="a", page=1, page_size=2)
    assert (page.count, page.count_exact, len(page.results), page.has_next) == (3, True, 2, True)
    assert scheduler.get_logs(task_id="a", page=2, page_size=2).results[0].task_id == "a"
    assert [log.task_id for log in scheduler.get_logs(status="failed").results] == ["b"]
    assert scheduler.get_logs(trigger_source="ops").count == 3
    assert scheduler.get_logs(started_after=T0 + timedelta(seconds=1)).count == 0
    assert scheduler.get_logs(started_before=T0 + timedelta(seconds=1), trigger_type="manual").count == 4


def test_get_logs_counts_no_further_than_its_bound_past_the_page_and_says_so(clock, monkeypatch):
    from scheduler_app import services

    scheduler.register(definition(cron="0 0 1 1 *"))
    run_one_by_one(clock, 6)
    monkeypatch.setattr(services, "LOG_COUNT_AHEAD", 3)
    first = scheduler.get_logs(page_size=2)
    assert (first.count, first.count_exact, len(first.results), first.has_next) == (3, False, 2, True)
    # Counted from the third page's first row (the fifth), the bound reaches past the last.
    third = scheduler.get_logs(page=3, page_size=2)
    assert (third.count, third.count_exact, len(third.results), third.has_next) == (6, True, 2, False)
    monkeypatch.setattr(services, "LOG_COUNT_AHEAD", 10)
    assert (scheduler.get_logs(page_size=2).count, scheduler.get_logs(page_size=2).count_exact) == (6, True)


@pytest.mark.parametrize(
    "kwargs",
    [{"status": "nope"}, {"page": 0}, {"page_size": 501}, {"trigger_type": "x"}, {"started_after": "x"}],
)
def test_get_logs_refuses_bad_filters(kwargs):
    with pytest.raises(InvalidDefinition):
        scheduler.get_logs(**kwargs)
