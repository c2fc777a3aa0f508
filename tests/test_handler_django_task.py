"""The django_task handler kind: enqueue a Django task per attempt, follow its result, never enqueue twice."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Status
from scheduler_app.runner import claims
from tests.factories import T0, definition, expire_lease, inline_runner
from tests.jobapp import tasks
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

# Django 6's own backends there, the backport's on Django 5.2.
IMMEDIATE = {"default": {"BACKEND": f"{tasks.FRAMEWORK}.backends.immediate.ImmediateBackend"}}
WITHOUT_RESULTS = {"default": {"BACKEND": f"{tasks.FRAMEWORK}.backends.dummy.DummyBackend"}}
STORED = {
    "default": {"BACKEND": f"{tasks.FRAMEWORK}.backends.immediate.ImmediateBackend"},
    "stored": {"BACKEND": "tests.jobapp.tasks.StoredBackend"},
}


@pytest.fixture(autouse=True)
def _fresh_calls():
    tasks.CALLS.clear()
    tasks.StoredBackend.shared.clear()
    tasks.StoredBackend.reads.clear()


def django_task(path: str, **options: object) -> dict[str, object]:
    return {"kind": "django_task", "task": path, **options}


def run_once(clock, task_id: str = "report", **trigger: object) -> Execution:
    execution = scheduler.trigger(task_id, **trigger)
    inline_runner(clock).tick()
    return Execution.objects.get(sequence=execution.sequence)


@override_settings(TASKS=IMMEDIATE)
def test_the_task_runs_with_the_params_as_keyword_arguments_and_its_return_value_is_the_result(clock):
    scheduler.register(
        definition(cron="0 0 1 1 *", handler=django_task("tests.jobapp.tasks.add"), params={"a": 2})
    )
    execution = run_once(clock, params={"b": 3})
    assert (execution.status, execution.result) == (Status.SUCCESS, {"sum": 5})
    assert tasks.CALLS == [{"a": 2, "b": 3}]
    assert execution.handler_ref


@override_settings(TASKS=IMMEDIATE)
def test_a_task_that_accepts_scheduler_occurrence_receives_the_occurrence_identity(clock):
    scheduler.register(definition(cron="0 0 1 1 *", handler=django_task("tests.jobapp.tasks.report")))
    execution = run_once(clock, params={"month": "may"})
    assert execution.status == Status.SUCCESS
    assert execution.result == {
        "occurrence": {
            "occurrence_id": str(execution.occurrence_id),
            "sequence": execution.sequence,
            "attempt": 1,
        },
        "params": {"month": "may"},
    }


@override_settings(TASKS=IMMEDIATE)
def test_a_failing_task_fails_the_attempt_with_036_and_the_retry_policy_enqueues_it_again(clock):
    scheduler.register(
        definition(
            cron="0 0 1 1 *",
            handler=django_task("tests.jobapp.tasks.broken"),
            retry={"max_attempts": 2, "backoff": [5]},
        )
    )
    execution = run_once(clock)
    assert (execution.status, execution.attempt) == (Status.PENDING, 1)
    assert execution.error["code"] == "scheduler:036"
    assert "ValueError: the report is broken" in execution.error["message"]
    clock.advance(5)
    inline_runner(clock, node_id="node-b").tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.FAILED, 2)
    assert len(tasks.CALLS) == 2


@override_settings(TASKS=WITHOUT_RESULTS)
def test_a_backend_without_get_result_ends_the_attempt_success_at_the_enqueue(clock):
    scheduler.register(definition(cron="0 0 1 1 *", handler=django_task("tests.jobapp.tasks.add", timeout=2)))
    execution = run_once(clock, params={"a": 1, "b": 1})
    assert execution.status == Status.SUCCESS
    assert execution.result == {"enqueued": execution.handler_ref, "followed": False}
    assert tasks.CALLS == []


@override_settings(TASKS=STORED)
def test_a_stored_result_id_is_followed_instead_of_enqueueing_again(clock):
    """A previous attempt enqueued the task and stored its id, then its runner died."""
    handler = django_task("tests.jobapp.tasks.add", backend="stored", timeout=2)
    scheduler.register(definition(cron="0 0 1 1 *", handler=handler))
    previous = tasks.add.using(backend="stored").enqueue(a=1, b=2)
    finish_stored(previous.id, {"sum": 3})
    execution = scheduler.trigger("report")
    Execution.objects.filter(sequence=execution.sequence).update(handler_ref=previous.id)
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert (execution.status, execution.result) == (Status.SUCCESS, {"sum": 3})
    assert len(tasks.StoredBackend.shared) == 1


@override_settings(TASKS=STORED)
def test_a_task_that_does_not_finish_in_time_fails_with_037_and_keeps_its_result_id(clock):
    handler = django_task("tests.jobapp.tasks.add", backend="stored", timeout=0.2)
    scheduler.register(definition(cron="0 0 1 1 *", handler=handler))
    execution = run_once(clock, params={"a": 1, "b": 2})
    assert execution.status == Status.FAILED
    assert execution.error["code"] == "scheduler:037"
    (queued,) = tasks.StoredBackend.shared
    assert execution.handler_ref == queued.id


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("os.system", "not in a module of an installed app or of TASK_MODULES"),
        ("subprocess.run", "not in a module of an installed app or of TASK_MODULES"),
        ("tests.outside_tasks.double", "not in a module of an installed app or of TASK_MODULES"),
        ("tests.jobapp.tasks.not_a_task", "is not a task"),
        ("tests.jobapp.tasks.missing", "is not a task"),
        ("tests.jobapp.nowhere.add", "cannot be imported"),
        ("tests.jobapp.tasks.add()", "dotted path"),
        ("", "dotted path"),
    ],
)
def test_a_path_that_is_not_a_task_of_an_installed_app_is_refused_with_a_field_error(path: str, says: str):
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition(handler=django_task(path)))
    assert caught.value.code == "scheduler:012"
    assert says in " ".join(caught.value.errors["handler.task"])


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"priority": 1000}, "priority"),
        ({"timeout": 0}, "timeout"),
        ({"queue_name": ""}, "queue_name"),
        ({"x": 1}, ""),
    ],
)
def test_invalid_options_are_field_errors(options: dict[str, Any], field: str):
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition(handler=django_task("tests.jobapp.tasks.add", **options)))
    assert f"handler.{field}".rstrip(".") in caught.value.errors


def finish_stored(result_id: str, value: Any) -> None:
    """The StoredBackend's result ``result_id`` ends SUCCESSFUL with ``value``, as a worker would leave it."""
    (stored,) = [result for result in tasks.StoredBackend.shared if result.id == result_id]
    object.__setattr__(stored, "status", "SUCCESSFUL")
    object.__setattr__(stored, "_return_value", value)


@override_settings(TASKS=STORED)
def test_a_lease_lost_while_following_is_followed_again_as_the_same_attempt_even_when_not_idempotent(clock):
    """The runner died after the enqueue: the task runs on in its backend, and its outcome is the occurrence's."""
    execution, stored = crashed_while_following(clock, idempotent=False)
    finish_stored(stored, {"sum": 3})

    runner = inline_runner(clock, node_id="node-b")
    runner.tick()
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.result) == (Status.SUCCESS, 1, {"sum": 3})
    assert len(tasks.StoredBackend.shared) == 1
    reasons = list(
        ExecutionEvent.objects.filter(execution_id=execution.sequence).values_list("reason", flat=True)
    )
    assert "lease expired while following an enqueued task; will follow it" in reasons
    logs = ExecutionLog.objects.filter(occurrence_id=execution.occurrence_id)
    assert [(log.attempt, log.status) for log in logs] == [(1, Status.SUCCESS)]


@override_settings(TASKS=STORED)
def test_a_lease_lost_before_the_result_id_was_stored_leaves_a_non_idempotent_occurrence_unknown(clock):
    handler = django_task("tests.jobapp.tasks.add", backend="stored", timeout=600)
    scheduler.register(definition(cron="0 0 1 1 *", handler=handler, idempotent=False))
    execution = scheduler.trigger("report", params={"a": 1, "b": 2})
    expire_lease(clock)
    inline_runner(clock, node_id="node-b").tick()
    execution.refresh_from_db()
    assert execution.status == Status.UNKNOWN
    assert tasks.StoredBackend.shared == []


@pytest.mark.django_db(transaction=True)
@override_settings(TASKS=STORED)
def test_a_runner_shut_down_while_following_releases_the_attempt_and_the_next_claim_follows_it(running):
    handler = django_task("tests.jobapp.tasks.add", backend="stored", timeout=600)
    scheduler.register(definition(cron="0 0 1 1 *", handler=handler))
    execution = scheduler.trigger("report", params={"a": 2, "b": 2})
    first = running()
    stored = wait_for(lambda: Execution.objects.get(sequence=execution.sequence).handler_ref)
    first.shutdown()
    wait_for(lambda: Execution.objects.get(sequence=execution.sequence).status == Status.PENDING)
    execution.refresh_from_db()
    assert (execution.attempt, execution.handler_ref, execution.owner) == (0, stored, "")

    finish_stored(stored, {"sum": 4})
    running()
    wait_for(lambda: Execution.objects.get(sequence=execution.sequence).status == Status.SUCCESS)
    execution.refresh_from_db()
    assert (execution.attempt, execution.result) == (1, {"sum": 4})
    assert len(tasks.StoredBackend.shared) == 1


@override_settings(
    TASKS=IMMEDIATE, SCHEDULER_APP={**settings.SCHEDULER_APP, "TASK_MODULES": ["tests.outside_tasks"]}
)
def test_task_modules_lets_a_handler_name_a_task_outside_the_installed_apps(clock):
    scheduler.register(definition(cron="0 0 1 1 *", handler=django_task("tests.outside_tasks.double")))
    execution = run_once(clock, params={"n": 21})
    assert (execution.status, execution.result) == (Status.SUCCESS, 42)


def crashed_while_following(clock, *, timeout: float = 600, **task: Any) -> tuple[Execution, str]:
    """A django_task attempt that enqueued its task and stored the id, and whose runner then died;
    its lease has run out. The execution and the result id."""
    handler = django_task("tests.jobapp.tasks.add", backend="stored", timeout=timeout)
    scheduler.register(definition(cron="0 0 1 1 *", handler=handler, **task))
    execution = scheduler.trigger("report", params={"a": 1, "b": 2})
    queued = tasks.add.using(backend="stored").enqueue(a=1, b=2)
    claim = expire_lease(clock)
    Execution.objects.filter(sequence=claim.execution.sequence).update(handler_ref=queued.id)
    return execution, queued.id


def released_after_a_crash(clock, *, timeout: float = 600, **task: Any) -> tuple[Execution, str]:
    """crashed_while_following, then recovered (pending, the same attempt to follow) but not claimed yet."""
    execution, stored = crashed_while_following(clock, timeout=timeout, **task)
    claims.recover_expired(clock.now(), "node-b")
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.PENDING, 0)
    return execution, stored


@override_settings(TASKS=STORED)
def test_a_released_attempt_stopped_by_an_operator_ends_interrupted_as_the_attempt_that_ran(clock):
    execution, _ = released_after_a_crash(clock, idempotent=False)
    # Released, the attempt has not ended: the journal gives it no log row yet.
    assert scheduler.executions.repair_log(execution.occurrence_id) == []
    scheduler.executions.request_stop(execution.occurrence_id)
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.INTERRUPTED, 1)
    logged = [
        (log.attempt, log.status)
        for log in ExecutionLog.objects.filter(occurrence_id=execution.occurrence_id)
    ]
    assert logged == [(1, Status.INTERRUPTED)]
    repaired = scheduler.executions.repair_log(execution.occurrence_id)
    assert [(log.attempt, log.status) for log in repaired] == [(1, Status.INTERRUPTED)]


@override_settings(TASKS=STORED)
def test_a_released_scheduled_attempt_is_followed_even_after_its_task_was_disabled(clock):
    execution, stored = released_after_a_crash(clock)
    Execution.objects.filter(sequence=execution.sequence).update(trigger_type="scheduled", scheduled_for=T0)
    scheduler.update_task("report", enabled=False, cron="30 4 * * *")
    finish_stored(stored, {"sum": 3})
    inline_runner(clock, node_id="node-b").tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.result) == (Status.SUCCESS, 1, {"sum": 3})


@override_settings(TASKS=STORED)
def test_a_resumed_attempt_keeps_the_deadline_of_its_first_start(clock):
    """The dead runner started the attempt 31 s ago; with a 2 s timeout the resumed attempt times out at
    once: it reads the result once and polls no more."""
    execution, stored = released_after_a_crash(clock, timeout=2)
    inline_runner(clock, node_id="node-b").tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.FAILED, 1)
    assert execution.error["code"] == "scheduler:037"
    assert len(tasks.StoredBackend.shared) == 1
    assert tasks.StoredBackend.reads == [stored]


@override_settings(TASKS=STORED)
def test_a_stored_result_id_is_not_followed_once_the_task_runs_another_kind_of_handler(clock):
    execution, _ = crashed_while_following(clock, idempotent=False)
    scheduler.update_task("report", handler=None)
    claims.recover_expired(clock.now(), "node-b")
    execution.refresh_from_db()
    assert execution.status == Status.UNKNOWN
