"""The log projection: separate from the journal, repairable, pruned without touching the journal."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.db.utils import load_backend
from django.test import override_settings

from scheduler_app import logs, scheduler
from scheduler_app.exceptions import Conflict, InvalidState
from scheduler_app.models import Execution, ExecutionLog, MaintenanceMark, log_id
from tests.factories import definition, expire_lease, inline_runner

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
    rows = scheduler.executions.repair_log(execution.occurrence_id)
    assert [(row.attempt, row.status, row.result) for row in rows] == [(1, "success", 7)]
    assert ExecutionLog.objects.get().id == log_id(execution.occurrence_id, 1)
    execution.refresh_from_db()
    assert execution.log_persistence == "persisted"
    assert not scheduler.executions.list_log_failures().exists()


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
    ExecutionLog.objects.create(
        id=log_id(execution.occurrence_id, 9),
        occurrence_id=execution.occurrence_id,
        task_id="report",
        trigger_type="scheduled",
        status="success",
        attempt=9,
        finished_at=clock.now(),
    )
    scheduler.executions.repair_log(execution.occurrence_id)
    assert (
        list(ExecutionLog.objects.order_by("attempt").values_list("attempt", "status", "error")) == expected
    )
    assert [row[:2] for row in expected] == [(1, "failed"), (2, "failed")]


def test_resolve_unknown_needs_the_current_updated_at(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    expire_lease(clock)
    runner.tick()
    execution.refresh_from_db()
    assert execution.status == "unknown"
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
    assert logs.prune(later) == 2
    assert ExecutionLog.objects.count() == 2
    assert Execution.objects.count() == 4
    scheduler.trigger("report")
    runner.tick()
    assert logs.prune(later + timedelta(seconds=30)) == 0
    assert logs.prune(later + timedelta(seconds=61)) == 1
    assert logs.prune(later + timedelta(days=31)) == 2
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
