"""django_task handlers against django-tasks-db's db_worker: real runner and worker processes on PostgreSQL."""

from __future__ import annotations

import importlib.util
import signal

import pytest
from django.db import connection

from scheduler_app import scheduler
from scheduler_app.models import TERMINAL, Execution, ExecutionEvent, ExecutionLog, Status
from tests.factories import definition
from tests.system.processes import CommandProcess, RunnerProcess, side_effect_lines
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="db_worker processes on PostgreSQL"),
    pytest.mark.skipif(
        not importlib.util.find_spec("django_tasks_db"), reason="django-tasks-db is not installed"
    ),
]

DATABASE_BACKEND = {"SCHEDULER_TASKS_BACKEND": "database"}


def task_results():
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.order_by("enqueued_at")


def db_worker(side_effects) -> CommandProcess:
    return CommandProcess(
        side_effects,
        "db_worker",
        "--interval",
        "0.1",
        "--no-startup-delay",
        "--no-reload",
        **DATABASE_BACKEND,
    )


def runner(side_effects, node_id: str, lease: float = 300) -> RunnerProcess:
    return RunnerProcess(side_effects, node_id, "--tick-interval", "0.2", lease=lease, **DATABASE_BACKEND)


def status_of(execution: Execution) -> str:
    return Execution.objects.get(sequence=execution.sequence).status


def handler(path: str) -> dict[str, object]:
    return {"kind": "django_task", "task": path, "timeout": 60}


def test_a_db_worker_process_runs_the_task_and_the_occurrence_ends_success_with_its_return_value(tmp_path):
    scheduler.register(definition("report", cron="0 0 1 1 *", handler=handler("tests.jobapp.tasks.record")))
    worker, node = db_worker(tmp_path), runner(tmp_path, "node-a")
    try:
        execution = scheduler.trigger("report", params={"month": "may"})
        wait_for(lambda: status_of(execution) in (*TERMINAL, Status.UNKNOWN), timeout=60)
    finally:
        node.stop()
        worker.stop()
    execution.refresh_from_db()
    assert (execution.status, execution.result) == (
        Status.SUCCESS,
        {"params": {"month": "may"}, "pid": worker.pid},
    )
    (result,) = task_results()
    assert (str(result.id), result.status) == (execution.handler_ref, "SUCCESSFUL")
    assert side_effect_lines(tmp_path) == [f"task,{execution.occurrence_id},1"]


def test_a_failing_task_is_retried_by_the_scheduler_only_each_attempt_enqueueing_it_once(tmp_path):
    scheduler.register(
        definition(
            "report",
            cron="0 0 1 1 *",
            handler=handler("tests.jobapp.tasks.broken"),
            retry={"max_attempts": 2, "backoff": [1]},
        )
    )
    worker, node = db_worker(tmp_path), runner(tmp_path, "node-a")
    try:
        execution = scheduler.trigger("report")
        wait_for(lambda: status_of(execution) in (*TERMINAL, Status.UNKNOWN), timeout=60)
    finally:
        node.stop()
        worker.stop()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.FAILED, 2)
    assert execution.error["code"] == "scheduler:036"
    assert "the report is broken" in execution.error["message"]
    assert [result.status for result in task_results()] == ["FAILED", "FAILED"]


def test_a_runner_killed_between_enqueue_and_result_leaves_one_enqueue_and_the_tasks_outcome(tmp_path):
    scheduler.register(
        definition("report", cron="0 0 1 1 *", handler=handler("tests.jobapp.tasks.record"), idempotent=False)
    )
    first = runner(tmp_path, "node-a", lease=3)
    try:
        execution = scheduler.trigger("report", params={"month": "june"})
        # No worker yet: the task waits in its queue while the runner follows it.
        wait_for(lambda: Execution.objects.get(sequence=execution.sequence).handler_ref, timeout=60)
        first.signal(signal.SIGKILL)
        first.process.wait(10)
    finally:
        first.kill()
    assert [result.status for result in task_results()] == ["READY"]

    worker, second = db_worker(tmp_path), runner(tmp_path, "node-b", lease=3)
    try:
        wait_for(lambda: status_of(execution) in (*TERMINAL, Status.UNKNOWN), timeout=60)
    finally:
        second.stop()
        worker.stop()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.SUCCESS, 1)
    assert execution.result == {"params": {"month": "june"}, "pid": worker.pid}
    (result,) = task_results()
    assert (str(result.id), result.status) == (execution.handler_ref, "SUCCESSFUL")
    assert side_effect_lines(tmp_path) == [f"task,{execution.occurrence_id},1"]
    reasons = ExecutionEvent.objects.filter(execution_id=execution.sequence).values_list("reason", flat=True)
    assert "lease expired while following an enqueued task; will follow it" in reasons
    logs = ExecutionLog.objects.filter(occurrence_id=execution.occurrence_id)
    assert [(log.attempt, log.status) for log in logs] == [(1, Status.SUCCESS)]
