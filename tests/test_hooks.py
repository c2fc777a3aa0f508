"""Hooks and signals around each attempt."""

from __future__ import annotations

import pytest
from django.test import override_settings

from scheduler_app import scheduler, signals
from scheduler_app.models import Execution, ExecutionLog
from tests.factories import definition, inline_runner, transitions

pytestmark = pytest.mark.django_db

SEEN: list[tuple[str, object]] = []


def record(name):
    def hook(event):
        SEEN.append((name, event))

    return hook


on_start = record("start")
on_finish = record("finish")
on_interrupted = record("interrupted")


def failing_start(event):
    raise ValueError("start refused")


ALL_HOOKS = {
    "on_task_start": "tests.test_hooks.on_start",
    "on_task_execute": "tests.hooks.on_task_execute",
    "on_task_finish": "tests.test_hooks.on_finish",
    "on_task_interrupted": "tests.test_hooks.on_interrupted",
}


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


@override_settings(SCHEDULER_APP={"HOOKS": ALL_HOOKS})
def test_start_and_finish_hooks_and_signals_see_the_attempt_and_its_log(clock):
    received = []

    def receiver(sender, event, **kwargs):
        received.append(event)

    signals.task_started.connect(receiver)
    signals.task_finished.connect(receiver)
    try:
        scheduler.register(definition(params={"result": "r"}))
        runner = inline_runner(clock)
        clock.advance(60)
        runner.tick()
    finally:
        signals.task_started.disconnect(receiver)
        signals.task_finished.disconnect(receiver)
    assert [name for name, _ in SEEN] == ["start", "finish"]
    finish = SEEN[1][1]
    assert finish.log.status == "success" and finish.log.result == "r"
    assert finish.task.id == "report" and finish.context.attempt == 1
    assert received == [SEEN[0][1], SEEN[1][1]]


@override_settings(SCHEDULER_APP={"HOOKS": ALL_HOOKS})
def test_the_interrupted_hook_and_signal_fire_for_skipped_attempts(clock):
    received = []

    def receiver(sender, event, **kwargs):
        received.append(event.log.status)

    signals.task_interrupted.connect(receiver)
    try:
        scheduler.register(definition(params={"skip": True}))
        runner = inline_runner(clock)
        clock.advance(60)
        runner.tick()
    finally:
        signals.task_interrupted.disconnect(receiver)
    assert [name for name, _ in SEEN] == ["start", "interrupted"]
    assert received == ["interrupted"]


@override_settings(SCHEDULER_APP={"HOOKS": {**ALL_HOOKS, "on_task_start": "tests.test_hooks.failing_start"}})
def test_a_start_hook_that_raises_fails_the_attempt(clock):
    scheduler.register(definition())
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    execution = Execution.objects.get()
    assert execution.status == "failed"
    assert execution.error == {"code": "scheduler:031", "message": "ValueError: start refused"}


def broken_finish(event):
    SEEN.append(("broken finish", event))
    raise RuntimeError("finish hook broke")


@override_settings(SCHEDULER_APP={"HOOKS": {**ALL_HOOKS, "on_task_finish": "tests.test_hooks.broken_finish"}})
def test_a_broken_finish_hook_changes_nothing(clock, caplog):
    scheduler.register(definition(params={"result": "r"}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    # The hook ran, after the outcome was recorded, and raised.
    assert [name for name, _ in SEEN] == ["start", "broken finish"]
    assert "hook on_task_finish failed" in caplog.text
    # The outcome, its journal and its log row are what the hook was shown.
    execution = Execution.objects.get()
    assert (execution.status, execution.attempt, execution.result, execution.error) == (
        "success",
        1,
        "r",
        None,
    )
    assert execution.log_persistence == "persisted"
    assert transitions(execution.occurrence_id) == [
        ("", "pending"),
        ("pending", "claimed"),
        ("claimed", "running"),
        ("running", "success"),
    ]
    shown = SEEN[1][1].log
    log = ExecutionLog.objects.get()
    assert (log.id, log.status, log.result, log.error) == (shown.id, "success", "r", None)
    assert (shown.status, shown.result) == ("success", "r")


def test_a_handler_that_says_resumable_without_being_cancelled_fails_the_attempt(clock):
    """Only a cancelled attempt can be released for a later claim; otherwise it is a handler's bug."""
    scheduler.register(definition("resumable", cron="0 0 1 1 *"))
    execution = scheduler.trigger("resumable", params={"resumable": True})
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert (execution.status, execution.error["code"]) == ("failed", "scheduler:031")
    assert execution.error["message"] == "The handler stopped as if cancelled, but was not."
