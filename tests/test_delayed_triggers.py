"""Triggers that run later: trigger(run_at=...) and trigger(delay=...), in Python and REST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.models import Execution
from tests import hooks
from tests.factories import definition, inline_runner

pytestmark = pytest.mark.django_db


def test_a_trigger_with_run_at_is_persisted_at_once_and_runs_when_due_not_before(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = inline_runner(clock)
    due = clock.now() + timedelta(minutes=10)
    execution = scheduler.trigger("report", run_at=due, idempotency_key="k1")
    assert (execution.status, execution.due_at) == ("pending", due)
    assert "due " in execution.events.get().reason
    clock.advance(9 * 60)
    runner.tick()
    assert Execution.objects.get().status == "pending" and not hooks.CALLS
    clock.advance(61)
    runner.tick()
    assert Execution.objects.get().status == "success" and len(hooks.CALLS) == 1


def test_a_delay_counts_from_the_call_and_a_run_at_in_the_past_is_due_now(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    delayed = scheduler.trigger("report", delay=90.5)
    assert delayed.due_at == clock.now() + timedelta(seconds=90.5)
    late = scheduler.trigger("report", run_at=datetime(2020, 1, 1, tzinfo=UTC))
    assert late.due_at == clock.now()


def test_the_same_key_returns_the_first_execution_and_its_due_time():
    scheduler.register(definition(cron="0 0 1 1 *"))
    first = scheduler.trigger("report", idempotency_key="once", delay=600)
    again, created = scheduler.get_or_trigger("report", idempotency_key="once", delay=30)
    assert (again.pk, again.due_at, created) == (first.pk, first.due_at, False)


@pytest.mark.parametrize(
    ("when", "field"),
    [
        ({"run_at": datetime(2027, 1, 1)}, "run_at"),  # naive
        ({"run_at": "2027-01-01T00:00:00Z"}, "run_at"),
        ({"delay": -1}, "delay"),
        ({"delay": 400 * 86400}, "delay"),
        ({"run_at": datetime(2099, 1, 1, tzinfo=UTC)}, "run_at"),
        ({"delay": True}, "delay"),
        ({"delay": 5, "run_at": datetime(2027, 1, 1, tzinfo=UTC)}, "run_at"),
    ],
)
def test_a_bad_time_is_refused_and_writes_nothing(when, field):
    scheduler.register(definition(cron="0 0 1 1 *"))
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.trigger("report", **when)
    assert field in refused.value.errors
    assert not Execution.objects.exists()


def test_a_pending_delayed_trigger_stopped_before_it_is_due_never_runs(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = inline_runner(clock)
    execution = scheduler.trigger("report", delay=60)
    scheduler.executions.request_stop(execution.occurrence_id, by="ops")
    clock.advance(120)
    runner.tick()
    assert Execution.objects.get().status == "interrupted" and not hooks.CALLS


def test_rest_triggers_take_run_at_and_delay():
    scheduler.register(definition(cron="0 0 1 1 *"))
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="add_execution"))
    client = APIClient()
    client.force_login(User.objects.get(pk=user.pk))
    day = (datetime.now(UTC) + timedelta(days=40)).date()
    response = client.post(
        "/api/scheduler/tasks/report/trigger/", {"run_at": f"{day}T10:00:00+02:00"}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["due_at"] == f"{day}T08:00:00Z"
    response = client.post("/api/scheduler/tasks/report/trigger/", {"delay": 30}, format="json")
    assert response.status_code == 202
    refused = client.post(
        "/api/scheduler/tasks/report/trigger/", {"delay": 30, "run_at": f"{day}T10:00:00Z"}, format="json"
    )
    assert refused.status_code == 400 and "run_at" in refused.json()["fields"]
    assert (
        client.post("/api/scheduler/tasks/report/trigger/", {"run_at": "soon"}, format="json").status_code
        == 400
    )
    assert Execution.objects.count() == 2
