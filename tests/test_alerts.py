"""Alerts: the execution_unknown and execution_failed signals, sent once an execution is recorded so,
and the optional mail to ADMINS, at most one per status and interval across the cluster."""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.core import mail
from django.test import override_settings

from scheduler_app import alerts, scheduler, signals
from scheduler_app.models import Execution
from tests.factories import definition, expire_lease, inline_runner

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = {"on_task_execute": "tests.hooks.on_task_execute"}
# Django 6.0 takes addresses; 5.2 only (name, address) pairs, which 6.x deprecates.
ADMINS: list[Any] = ["ops@example.com"] if django.VERSION >= (6, 0) else [("Ops", "ops@example.com")]
MAIL_BOTH = {
    "HOOKS": HOOK,
    "ALERTS": {
        "MAIL_ADMINS": ["unknown", "failed"],
        "EVERY_SECONDS": 300,
        "BASE_URL": "https://ops.example.com",
    },
}


@pytest.fixture
def received():
    """(signal name, occurrence id, status) of each alert signal sent."""
    got: list[tuple[str, Any, str]] = []

    def unknown(sender, execution, now, **kwargs):
        got.append(("unknown", execution.occurrence_id, execution.status))

    def failed(sender, execution, now, **kwargs):
        got.append(("failed", execution.occurrence_id, execution.status))

    signals.execution_unknown.connect(unknown)
    signals.execution_failed.connect(failed)
    yield got
    signals.execution_unknown.disconnect(unknown)
    signals.execution_failed.disconnect(failed)


@override_settings(SCHEDULER_APP={"HOOKS": HOOK})
def test_a_failure_with_no_attempt_left_is_signalled_once_and_a_retried_one_not(clock, received):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 2, "backoff": [0]}))
    execution = scheduler.trigger("report", params={"fail": True})
    runner = inline_runner(clock)
    runner.tick()
    assert Execution.objects.get().status == "pending" and received == []
    clock.advance(1)
    runner.tick()
    assert received == [("failed", execution.occurrence_id, "failed")]


def test_an_execution_recovered_unknown_is_signalled(clock, received):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    expire_lease(clock)
    runner.tick()
    assert received == [("unknown", execution.occurrence_id, "unknown")]


def test_an_idempotent_execution_whose_lease_expired_runs_again_and_is_not_signalled(clock, received):
    scheduler.register(definition(cron="0 0 1 1 *", idempotent=True, retry={"max_attempts": 3}))
    scheduler.trigger("report")
    runner = inline_runner(clock)
    expire_lease(clock)
    runner.tick()
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.attempt) == ("success", 2)
    assert received == []


@override_settings(SCHEDULER_APP=MAIL_BOTH, ADMINS=ADMINS)
def test_a_mail_server_that_hangs_does_not_hold_up_the_runner(clock, monkeypatch):
    import threading

    release = threading.Event()
    sent: list[str] = []

    def hanging_mail(subject, body):
        release.wait(30)
        sent.append(subject)

    monkeypatch.setattr(alerts, "mail_admins", hanging_mail)
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report", params={"fail": True})
    inline_runner(clock).tick()
    assert Execution.objects.get().status == "failed" and sent == []
    release.set()
    alerts.join_mail(10)
    assert sent == ["scheduler: report failed with no attempt left"]


def test_a_receiver_that_raises_does_not_stop_the_runner(clock, caplog):
    def broken(**kwargs):
        raise RuntimeError("the pager is down")

    signals.execution_unknown.connect(broken)
    try:
        scheduler.register(definition(cron="0 0 1 1 *"))
        scheduler.trigger("report")
        runner = inline_runner(clock)
        expire_lease(clock)
        runner.tick()
    finally:
        signals.execution_unknown.disconnect(broken)
    assert Execution.objects.get().status == "unknown"
    assert "a receiver of execution_unknown failed" in caplog.text and "RuntimeError" in caplog.text


@override_settings(SCHEDULER_APP=MAIL_BOTH, ADMINS=ADMINS)
def test_admins_get_one_mail_per_status_and_interval_with_a_link(clock):
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=5))
    runner = inline_runner(clock)
    first = scheduler.trigger("report", params={"fail": True})
    second = scheduler.trigger("report", params={"fail": True})
    runner.tick()
    assert Execution.objects.filter(status="failed").count() == 2
    alerts.join_mail(10)
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["ops@example.com"] and "report failed with no attempt left" in message.subject
    sequence = Execution.objects.get(occurrence_id=message.body.split()[2]).sequence
    assert sequence in (first.sequence, second.sequence)
    assert f"https://ops.example.com/admin/scheduler_app/execution/{sequence}/change/" in message.body
    clock.advance(301)
    scheduler.trigger("report", params={"fail": True})
    runner.tick()
    alerts.join_mail(10)
    assert len(mail.outbox) == 2
    scheduler.trigger("report", idempotency_key="u")
    expire_lease(clock)
    runner.tick()
    alerts.join_mail(10)
    assert len(mail.outbox) == 3 and mail.outbox[-1].subject.endswith("scheduler: report is unknown")


@override_settings(SCHEDULER_APP={"HOOKS": HOOK}, ADMINS=ADMINS)
def test_no_mail_unless_alerts_ask_for_it(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report", params={"fail": True})
    inline_runner(clock).tick()
    alerts.join_mail(10)
    assert Execution.objects.get().status == "failed" and mail.outbox == []
