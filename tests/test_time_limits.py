"""Time limits of Python work: cancelled at the limit, failed within the grace, else unknown and abandoned."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.test import override_settings

from scheduler_app import scheduler
from scheduler_app.events import TaskEvent
from scheduler_app.handlers import registry
from scheduler_app.handlers.base import Handler
from scheduler_app.handlers.hooks import HookHandler
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Status, Task
from scheduler_app.runner import claims, limits
from scheduler_app.runner.attempt import Attempt
from scheduler_app.runner.claims import Claim
from scheduler_app.runner.limits import Limit
from scheduler_app.runner.recording import DirectJournal
from tests import hooks
from tests.conftest import RUNNER_THREAD
from tests.factories import definition, inline_runner, transitions
from tests.settings import SCHEDULER_APP
from tests.waiting import wait_for

HOOK_TIMEOUT = 0.2  # seconds; the grace is then 0.1 s


def limited(**settings: Any) -> override_settings:
    """The suite's settings with a tiny HOOK_TIMEOUT (and ``settings``)."""
    return override_settings(SCHEDULER_APP={**SCHEDULER_APP, "HOOK_TIMEOUT": HOOK_TIMEOUT, **settings})


@pytest.fixture
def hook_timeout():
    with limited():
        yield


class StuckHook:
    """on_task_execute that, for tasks whose params hold ``stuck``, ignores ``cancelled`` and waits for
    the test to release it; other tasks run the suite's hook. Records the thread of every call."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: dict[str, threading.Thread] = {}

    def __call__(self, event: TaskEvent) -> Any:
        self.threads[event.context.task_id] = threading.current_thread()
        if event.context.params.get("stuck"):
            self.release.wait(30)
            return {"late": True}
        return hooks.on_task_execute(event)


@pytest.fixture
def stuck_hook():
    hook = StuckHook()
    with limited(HOOKS={"on_task_execute": hook}):
        yield hook
    hook.release.set()


class LimitedHandler(Handler):
    """A handler kind with its own limit (as the python kind has): waits on ``cancelled``."""

    kind = "limited"

    def time_limit(self, config: dict[str, Any]) -> float | None:
        return float(config["timeout"])

    def run(self, event: TaskEvent) -> Any:
        event.cancelled.wait(30)
        return "stopped"


def status_of(execution: Execution) -> str:
    execution.refresh_from_db()
    return execution.status


def journal_of(execution: Execution) -> tuple[dict[str, Any], int, list[tuple[int, str]]]:
    """Everything the journal holds about an execution: its row, its event count, its log rows."""
    return (
        Execution.objects.values().get(sequence=execution.sequence),
        ExecutionEvent.objects.filter(execution_id=execution.sequence).count(),
        list(
            ExecutionLog.objects.filter(occurrence_id=execution.occurrence_id).values_list(
                "attempt", "status"
            )
        ),
    )


# -- the limit of each handler kind ---------------------------------------------


def test_handlers_have_no_limit_by_default_and_the_hook_has_hook_timeout():
    assert Handler().time_limit({}) is None
    assert registry.get("api").time_limit({"kind": "api", "url": "https://example.com/"}) is None
    assert registry.get("js").time_limit({"kind": "js", "code": "() => 1"}) is None
    assert HookHandler().time_limit({}) == 3600
    with limited():
        assert HookHandler().time_limit({}) == HOOK_TIMEOUT
        assert limits.time_limit(None) == HOOK_TIMEOUT


def test_the_grace_is_half_the_limit_and_at_most_thirty_seconds():
    assert limits.grace(0.2) == pytest.approx(0.1)
    assert limits.grace(10) == 5
    assert limits.grace(3600) == 30


# -- the runner's steps, on explicit monotonic instants ---------------------------


def unsaved_attempt(limit: Limit) -> Attempt:
    attempt = Attempt(Claim(Execution(sequence=1, attempt=1), Task(id="report"), "token"))
    attempt.limit = limit
    return attempt


def test_an_attempt_is_cancelled_at_its_limit_and_abandoned_once_the_grace_after_it_has_passed():
    attempt = unsaved_attempt(Limit(1.0, deadline=100.0))
    assert limits.step(attempt, 99.99) is None
    assert limits.step(attempt, 100.0) == limits.CANCEL
    limits.time_out(attempt, 100.2)
    assert attempt.cancelled.is_set() and attempt.cancel_reason == limits.TIME_LIMIT
    assert attempt.limit is not None and attempt.limit.next_deadline() == pytest.approx(100.7)
    assert limits.step(attempt, 100.69) is None
    assert limits.step(attempt, 100.7) == limits.ABANDON
    assert attempt.abandon()
    assert not attempt.handler_returned()  # the worker, when it returns at last, writes nothing
    assert limits.step(attempt, 1000) is None


def test_a_handler_that_returned_is_never_abandoned():
    attempt = unsaved_attempt(Limit(1.0, deadline=100.0))
    limits.time_out(attempt, 100.0)
    assert attempt.handler_returned()
    assert limits.step(attempt, 1000) is None
    assert not attempt.abandon()


# -- a threaded runner -------------------------------------------------------------

threaded = pytest.mark.django_db(transaction=True)


@threaded
def test_a_hook_that_observes_cancelled_fails_with_scheduler_034_at_its_limit_and_is_retried(
    hook_timeout, running
):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 2, "backoff": [0]}))
    execution = scheduler.trigger("report", params={"block": 30})
    started = time.monotonic()
    running()
    wait_for(lambda: status_of(execution) == Status.FAILED)
    assert time.monotonic() - started < 10  # stopped at the limit, not after the 30 s block
    assert execution.attempt == 2
    assert execution.error == {
        "code": "scheduler:034",
        "message": "The attempt ran past its time limit of 0.2s and was cancelled.",
    }
    assert [event.cancelled.is_set() for event in hooks.CALLS] == [True, True]
    assert [move for move in transitions(execution.occurrence_id) if move[0] == Status.RUNNING] == [
        (Status.RUNNING, Status.PENDING),
        (Status.RUNNING, Status.FAILED),
    ]
    retry = ExecutionEvent.objects.get(execution_id=execution.sequence, to_status=Status.PENDING, attempt=1)
    assert (retry.reason, retry.error["code"]) == ("retry in 0s (attempt 2 of 2)", "scheduler:034")
    # The log row of a later attempt follows its outcome's commit.
    wait_for(
        lambda: (
            list(ExecutionLog.objects.order_by("attempt").values_list("attempt", "status"))
            == [(1, "failed"), (2, "failed")]
        )
    )


@threaded
def test_any_handler_kind_that_names_a_limit_is_cancelled_at_it(running):
    with limited(HANDLERS={"limited": "tests.test_time_limits.LimitedHandler"}):
        scheduler.register(definition(cron="0 0 1 1 *", handler={"kind": "limited", "timeout": 0.3}))
        execution = scheduler.trigger("report")
        running()
        wait_for(lambda: status_of(execution) == Status.FAILED)
    assert execution.error["code"] == "scheduler:034"


@threaded
def test_a_hook_that_ignores_cancelled_ends_unknown_its_worker_is_replaced_and_its_late_return_writes_nothing(
    stuck_hook, running
):
    scheduler.register(definition("stuck", cron="0 0 1 1 *", retry={"max_attempts": 3}))
    scheduler.register(definition("other", cron="0 0 1 1 *"))
    stuck = scheduler.trigger("stuck", params={"stuck": True})
    runner = running(workers=1)
    wait_for(lambda: status_of(stuck) == Status.UNKNOWN)
    assert stuck.attempt == 1  # unknown is never retried
    assert (stuck.owner, stuck.execution_token, stuck.lease_expires_at) == ("", "", None)
    assert stuck.error["reason"] == "time limit exceeded"
    assert stuck.error["message"].startswith("time limit exceeded; the handler did not return within 0.1s")
    last = ExecutionEvent.objects.filter(execution_id=stuck.sequence).latest("id")
    assert (last.from_status, last.to_status, last.reason) == (
        Status.RUNNING,
        Status.UNKNOWN,
        "time limit exceeded; the handler did not return",
    )
    assert list(ExecutionLog.objects.values_list("task_id", "status")) == [("stuck", "unknown")]
    wait_for(lambda: not runner.in_flight)
    stuck_thread = stuck_hook.threads["stuck"]
    assert stuck_thread.is_alive()

    # One worker, still stuck in the first hook: the second task runs on the thread that replaced it.
    other = scheduler.trigger("other", wait=30)
    assert other.status == Status.SUCCESS
    assert stuck_hook.threads["other"] is not stuck_thread
    assert stuck_thread.is_alive()
    assert runner._pool is not None and [t.is_alive() for t in runner._pool._threads] == [True]

    frozen = journal_of(stuck)
    stuck_hook.release.set()
    wait_for(lambda: not stuck_thread.is_alive())
    assert journal_of(stuck) == frozen
    assert status_of(stuck) == Status.UNKNOWN


@threaded
def test_the_journal_fences_out_an_abandoned_worker_that_tries_to_write_its_late_outcome(
    stuck_hook, running, monkeypatch
):
    # Without the runner's own guard, the late outcome reaches the writer: the cleared token refuses it.
    monkeypatch.setattr(Attempt, "handler_returned", lambda self: True)
    scheduler.register(definition("stuck", cron="0 0 1 1 *", retry={"max_attempts": 3}))
    stuck = scheduler.trigger("stuck", params={"stuck": True})
    running(workers=1)
    wait_for(lambda: status_of(stuck) == Status.UNKNOWN)
    frozen = journal_of(stuck)
    stuck_thread = stuck_hook.threads["stuck"]
    stuck_hook.release.set()
    wait_for(lambda: not stuck_thread.is_alive())
    assert journal_of(stuck) == frozen


@threaded
def test_shutdown_does_not_wait_for_an_abandoned_thread(stuck_hook, running):
    scheduler.register(definition("stuck", cron="0 0 1 1 *"))
    stuck = scheduler.trigger("stuck", params={"stuck": True})
    runner = running(workers=2, drain_seconds=60)
    wait_for(lambda: status_of(stuck) == Status.UNKNOWN)
    wait_for(lambda: not runner.in_flight)
    [loop_thread] = [thread for thread in threading.enumerate() if thread.name == RUNNER_THREAD]
    runner.shutdown()
    loop_thread.join(30)  # not the 60 s drain
    assert not loop_thread.is_alive()
    assert stuck_hook.threads["stuck"].is_alive()


@threaded
def test_run_scheduler_once_enforces_time_limits_while_it_drains(hook_timeout):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"block": 30})
    began = time.monotonic()
    call_command("run_scheduler", "--once", "--verbosity", "0")
    assert time.monotonic() - began < 20  # not the 30 s of DRAIN_SECONDS
    assert status_of(execution) == Status.FAILED
    assert execution.error["code"] == "scheduler:034"


# -- recording unknown, fenced -------------------------------------------------------


def abandoned_attempt(clock) -> Attempt:
    """A started attempt, past its limit and its grace, abandoned by the runner."""
    (claim,), _, _ = claims.claim(clock.now(), "node-a", 1, 30, start=1)
    attempt = Attempt(claim)
    attempt.started = (True, clock.now())
    now = time.monotonic()
    attempt.limit = Limit(HOOK_TIMEOUT, deadline=now - 1, timed_out_at=now - 1)
    attempt.lease_deadline = now + 30
    return attempt


@pytest.mark.django_db
def test_an_unknown_the_database_refused_is_recorded_at_a_later_pass(clock, monkeypatch):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    attempt = abandoned_attempt(clock)
    runner.in_flight[execution.sequence] = attempt

    def database_down(*args, **kwargs):
        raise OperationalError("could not connect")

    with monkeypatch.context() as patched:
        patched.setattr(DirectJournal, "finish", database_down)
        runner.enforce_time_limits()
    assert attempt.abandoned
    assert runner.in_flight == {execution.sequence: attempt}  # it keeps its lease meanwhile
    assert status_of(execution) == Status.RUNNING
    runner.enforce_time_limits()
    assert runner.in_flight == {}
    assert status_of(execution) == Status.UNKNOWN
    assert ExecutionLog.objects.get().status == Status.UNKNOWN


@pytest.mark.django_db
def test_an_abandoned_attempt_whose_row_moved_on_writes_nothing(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    attempt = abandoned_attempt(clock)
    runner.in_flight[execution.sequence] = attempt
    # Another node recovered the row meanwhile: new token, state unknown.
    Execution.objects.filter(sequence=execution.sequence).update(status=Status.UNKNOWN, execution_token="x")
    frozen = journal_of(execution)
    runner.enforce_time_limits()
    assert runner.in_flight == {}
    assert journal_of(execution) == frozen
