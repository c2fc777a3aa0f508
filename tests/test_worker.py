"""The threaded runner: cancellation on shutdown, stop requests and lost leases."""

from __future__ import annotations

import pytest

from scheduler_app import scheduler
from scheduler_app.models import Execution, ExecutionEvent, Status
from tests.factories import definition
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def status_of(execution: Execution) -> str:
    execution.refresh_from_db()
    return execution.status


def test_shutdown_cancels_in_flight_attempts_which_end_interrupted_without_retry(running):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 3}))
    execution = scheduler.trigger("report", params={"block": 60})
    runner = running()
    wait_for(lambda: status_of(execution) == Status.RUNNING)
    runner.shutdown()
    wait_for(lambda: status_of(execution) == Status.INTERRUPTED)
    assert (execution.attempt, execution.error["message"]) == (1, "shutdown")


def test_a_stop_request_is_observed_within_one_renewal_period(running):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"block": 60})
    running(lease_seconds=1.5)
    wait_for(lambda: status_of(execution) == Status.RUNNING)
    scheduler.executions.request_stop(execution.occurrence_id, by="ops")
    wait_for(lambda: status_of(execution) == Status.INTERRUPTED, timeout=3)
    assert execution.error["message"] == "stop requested"


def test_a_runner_that_loses_its_lease_cancels_and_writes_nothing_more(running):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"block": 60})
    runner = running(lease_seconds=1.5)
    wait_for(lambda: status_of(execution) == Status.RUNNING)
    # Another node recovered the row: new token, state unknown.
    Execution.objects.filter(sequence=execution.sequence).update(status=Status.UNKNOWN, execution_token="")
    events_before = ExecutionEvent.objects.filter(execution_id=execution.sequence).count()
    wait_for(lambda: not runner.in_flight, timeout=5)
    assert status_of(execution) == Status.UNKNOWN
    assert ExecutionEvent.objects.filter(execution_id=execution.sequence).count() == events_before


def test_a_trigger_runs_without_waiting_for_the_minute(running):
    scheduler.register(definition(cron="0 0 1 1 *"))
    running()
    execution = scheduler.trigger("report", params={"result": "now"}, wait=10)
    assert (execution.status, execution.result) == ("success", "now")


def test_an_attempt_whose_lease_cannot_be_renewed_is_cancelled_and_writes_nothing(running, monkeypatch):
    from django.db import OperationalError

    from scheduler_app import db

    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"block": 60})
    runner = running(lease_seconds=1.5)
    wait_for(lambda: status_of(execution) == Status.RUNNING)
    events_before = ExecutionEvent.objects.filter(execution_id=execution.sequence).count()

    def database_down(*args, **kwargs):
        raise OperationalError("could not connect")

    monkeypatch.setattr(db, "probe", database_down)
    wait_for(lambda: not runner.in_flight, timeout=10)
    assert status_of(execution) == Status.RUNNING  # left for another runner to recover
    assert ExecutionEvent.objects.filter(execution_id=execution.sequence).count() == events_before
