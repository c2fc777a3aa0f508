"""The tick loop on an injected clock: scheduling, claims, retries, overlap, misfire and recovery."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test import override_settings

from scheduler_app import journal, scheduler
from scheduler_app.models import (
    Execution,
    ExecutionLog,
    Status,
    Task,
    scheduled_occurrence_id,
)
from scheduler_app.runner import claims, scheduling
from scheduler_app.runner.attempt import Attempt, _finish
from scheduler_app.runner.recording import Outcome
from tests import hooks
from tests.factories import (
    T0,
    definition,
    expire_lease,
    inline_runner,
    ran_once,
    transitions,
    unknown_as_a_crash_leaves_it,
)

pytestmark = pytest.mark.django_db


def test_a_due_minute_runs_once_with_a_deterministic_occurrence_id(clock):
    scheduler.register(definition(params={"result": {"done": 1}}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    runner.tick()
    execution = Execution.objects.get()
    assert execution.occurrence_id == scheduled_occurrence_id("report", T0 + timedelta(minutes=1))
    assert (execution.status, execution.attempt, execution.result) == (Status.SUCCESS, 1, {"done": 1})
    assert transitions(execution.occurrence_id) == [
        ("", "pending"),
        ("pending", "claimed"),
        ("claimed", "running"),
        ("running", "success"),
    ]
    assert hooks.started() == ran_once("report", execution.occurrence_id)
    context = hooks.CALLS[0].context
    assert (context.occurrence_id, context.sequence, context.attempt) == (
        str(execution.occurrence_id),
        execution.sequence,
        1,
    )
    assert context.execution_token and context.trigger_type == "scheduled"
    log = ExecutionLog.objects.get()
    assert (log.status, log.attempt, log.result, log.duration_ms) == ("success", 1, {"done": 1}, 0)
    assert execution.log_persistence == "persisted"
    assert Task.objects.get().next_run_at == T0 + timedelta(minutes=2)


def test_nothing_runs_before_the_minute(clock):
    scheduler.register(definition())
    runner = inline_runner(clock)
    clock.advance(59)
    runner.tick()
    assert not Execution.objects.exists()


def test_failures_retry_with_backoff_under_the_same_occurrence(clock):
    scheduler.register(definition(retry={"max_attempts": 3, "backoff": [10, 60]}, params={"fail": True}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.attempt) == (Status.PENDING, 1)
    assert execution.due_at == clock.now() + timedelta(seconds=10)
    clock.advance(9)
    runner.tick()
    assert Execution.objects.get().attempt == 1
    clock.advance(1)
    runner.tick()
    execution = Execution.objects.get(sequence=execution.sequence)
    assert (execution.status, execution.attempt, execution.due_at) == (
        Status.PENDING,
        2,
        clock.now() + timedelta(seconds=60),
    )
    clock.advance(60)
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.FAILED, 3)
    assert execution.error == {"code": "scheduler:031", "message": "RuntimeError: boom"}
    logs = ExecutionLog.objects.filter(occurrence_id=execution.occurrence_id).order_by("attempt")
    assert list(logs.values_list("attempt", "status")) == [(1, "failed"), (2, "failed"), (3, "failed")]
    # Minutes that came due meanwhile found the serial slot taken: skipped, not queued.
    later = Execution.objects.exclude(sequence=execution.sequence)
    assert {(row.status, row.error["reason"]) for row in later} == {("interrupted", "overlap")}


def test_a_skipped_attempt_is_interrupted_and_never_retried(clock):
    scheduler.register(definition(retry={"max_attempts": 5}, params={"skip": True}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.attempt, execution.error["reason"]) == ("interrupted", 1, "skipped")


@override_settings(SCHEDULER_APP={})
def test_a_task_without_handler_or_hook_is_interrupted(clock):
    scheduler.register(definition(retry={"max_attempts": 3}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.error["reason"]) == ("interrupted", "missing handler")


def test_handler_registry_dispatches_by_kind(clock):
    scheduler.register(definition("ok", handler={"kind": "fake", "result": [1, 2]}))
    scheduler.register(definition("bad", handler={"kind": "fake", "outcome": "fail"}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    assert Execution.objects.get(task_id="ok").result == [1, 2]
    assert Execution.objects.get(task_id="bad").error["code"] == "scheduler:023"
    assert not hooks.CALLS


def test_a_result_that_is_not_json_fails_the_attempt(clock):
    scheduler.register(definition())
    runner = inline_runner(clock)
    with override_settings(SCHEDULER_APP={"HOOKS": {"on_task_execute": "tests.test_runner.returns_a_set"}}):
        clock.advance(60)
        runner.tick()
    assert Execution.objects.get().error == {"code": "scheduler:031", "message": "The result is not JSON."}


def returns_a_set(event):
    return {1, 2}


def occupy_slot(task_id: str, status: str = Status.UNKNOWN) -> Execution:
    return Execution.objects.create(
        occurrence_id=scheduled_occurrence_id(task_id, T0 - timedelta(days=1)),
        task_id=task_id,
        trigger_type="scheduled",
        due_at=T0,
        created_at=T0,
        updated_at=T0,
        status=status,
        attempt=1,
    )


def test_overlap_skip_records_the_occurrence_as_interrupted(clock):
    scheduler.register(definition())
    occupy_slot("report")
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    skipped = Execution.objects.exclude(status=Status.UNKNOWN).get()
    assert skipped.status == Status.INTERRUPTED and skipped.error["reason"] == "overlap"
    assert not hooks.CALLS
    assert ExecutionLog.objects.get().status == "interrupted"


def test_overlap_buffer_one_keeps_exactly_one_waiting(clock):
    scheduler.register(definition(overlap="buffer_one"))
    occupy_slot("report")
    runner = inline_runner(clock)
    for _ in range(3):
        clock.advance(60)
        runner.tick()
    new = Execution.objects.exclude(status=Status.UNKNOWN).order_by("scheduled_for")
    assert [row.status for row in new] == ["pending", "interrupted", "interrupted"]
    assert not hooks.CALLS


def test_max_concurrency_bounds_claims_and_manual_triggers_wait(clock):
    scheduler.register(definition(max_concurrency=2, cron="0 0 1 1 *"))
    occupy_slot("report")
    for _ in range(3):
        scheduler.trigger("report")
    runner = inline_runner(clock)
    for expected in (1, 2, 3):
        runner.tick()  # one free slot: one claim per tick
        assert Execution.objects.filter(status=Status.SUCCESS).count() == expected
    assert len(hooks.CALLS) == 3


def test_claim_respects_the_free_slots(clock):
    scheduler.register(definition(max_concurrency=2, cron="0 0 1 1 *"))
    occupy_slot("report")
    for _ in range(3):
        scheduler.trigger("report")
    claimed, _, _ = claims.claim(clock.now(), "node-x", 10, 30)
    assert len(claimed) == 1
    assert Execution.objects.filter(status=Status.PENDING).count() == 2


def locked_task_ids(monkeypatch) -> list[set[str]]:
    """The task ids of each lock_tasks call of the journal's statements, from now on."""
    from scheduler_app.statements import journal_statements

    statements = type(journal_statements())
    original = statements.lock_tasks
    calls: list[set[str]] = []

    def recorded(self, task_ids):
        calls.append(set(task_ids))
        return original(self, task_ids)

    monkeypatch.setattr(statements, "lock_tasks", recorded)
    return calls


def test_a_claim_locks_the_tasks_of_the_rows_it_takes_and_only_them_when_they_fill_it(clock, monkeypatch):
    for name in "abcdef":
        scheduler.register(definition(name, cron="0 0 1 1 *"))
        scheduler.trigger(name)
    calls = locked_task_ids(monkeypatch)
    claimed, _, _ = claims.claim(clock.now(), "node-x", 2, 30)
    assert [c.execution.task_id for c in claimed] == ["a", "b"]
    # The candidates read past the limit (PASS_OVER) stay unlocked tasks: another runner claims them.
    assert calls == [{"a", "b"}]


def test_a_claim_the_first_rows_do_not_fill_locks_the_tasks_of_the_rows_after_them(clock, monkeypatch):
    scheduler.register(definition("serial", cron="0 0 1 1 *"))
    scheduler.register(definition("other", cron="0 0 1 1 *"))
    scheduler.trigger("serial", idempotency_key="1")
    scheduler.trigger("serial", idempotency_key="2")
    clock.advance(1)
    scheduler.trigger("other")
    calls = locked_task_ids(monkeypatch)
    claimed, _, _ = claims.claim(clock.now(), "node-x", 2, 30)
    # The serial task's second row waits for its slot; the claim fills its place from further on.
    assert sorted(c.execution.task_id for c in claimed) == ["other", "serial"]
    assert calls == [{"serial"}, {"other"}]


def test_a_claim_starts_the_rows_it_is_asked_to_in_its_own_transaction(clock):
    """The first ``start`` rows taken move on to running, but one an operator asked to stop; the
    claims carry the rows as the database now holds them."""
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=4))
    executions = [scheduler.trigger("report") for _ in range(4)]
    Execution.objects.filter(sequence=executions[1].sequence).update(stop_requested=True)
    claimed, _, _ = claims.claim(clock.now(), "node-x", 4, 30, start=3)
    assert [c.started for c in claimed] == [True, False, True, None]
    rows = [Execution.objects.get(sequence=e.sequence) for e in executions]
    expected = [
        (Status.RUNNING, clock.now()),
        (Status.CLAIMED, None),
        (Status.RUNNING, clock.now()),
        (Status.CLAIMED, None),
    ]
    assert [(row.status, row.started_at) for row in rows] == expected
    assert [(c.execution.status, c.execution.started_at) for c in claimed] == expected
    assert [c.execution.execution_token for c in claimed] == [row.execution_token for row in rows]
    assert transitions(executions[0].occurrence_id)[1:] == [
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
    ]
    assert transitions(executions[1].occurrence_id)[1:] == [(Status.PENDING, Status.CLAIMED)]


def test_a_scheduled_occurrence_is_built_as_execution_would_build_it_and_stored_whole(clock):
    """occurrences.scheduled builds its rows without Model.__init__: every field the task does not
    give holds its default, params is a dict of its own, and the row stores as built."""
    from scheduler_app import occurrences

    scheduler.register(definition(params={"k": [1]}, retry={"max_attempts": 3}))
    task = Task.objects.get()
    built = occurrences.scheduled(task, T0, clock.now(), Status.PENDING)
    other = occurrences.scheduled(task, T0 + timedelta(minutes=1), clock.now(), Status.PENDING)
    default = Execution()
    given = {"occurrence_id", "task_id", "task_revision", "trigger_type", "trigger_source", "scheduled_for"}
    given |= {"due_at", "missed_fire_times", "params", "status", "max_attempts", "created_at", "updated_at"}
    for field in Execution._meta.concrete_fields:
        if field.attname not in given | {"finished_at"}:
            assert getattr(built, field.attname) == getattr(default, field.attname), field.attname
    assert (built.params, built.max_attempts, built._state.adding) == ({"k": [1]}, 3, True)
    assert built.params is not task.params and built.params is not other.params
    (stored,) = occurrences.insert([(built, "scheduled")], "node-a", clock.now())
    fresh = Execution.objects.get(sequence=stored.sequence)
    assert [getattr(fresh, f.attname) for f in Execution._meta.concrete_fields] == [
        getattr(built, f.attname) for f in Execution._meta.concrete_fields
    ]


def test_misfire_coalesces_within_grace_and_records_older_fire_times_once(clock):
    scheduler.register(definition(misfire_grace_seconds=120))
    runner = inline_runner(clock)
    clock.set(T0 + timedelta(minutes=10, seconds=30))
    runner.tick()
    rows = list(Execution.objects.order_by("scheduled_for"))
    assert [(row.status, row.scheduled_for) for row in rows] == [
        ("interrupted", T0 + timedelta(minutes=1)),
        ("success", T0 + timedelta(minutes=10)),
    ]
    assert rows[0].error["message"] == (
        "misfire: missed 8 fire times between 2026-03-02T09:01Z and 2026-03-02T09:08Z"
    )
    assert hooks.started() == ran_once("report", rows[1].occurrence_id)
    assert Task.objects.get().next_run_at == T0 + timedelta(minutes=11)


def test_a_late_tick_within_grace_still_fires_the_missed_minute(clock):
    scheduler.register(definition(cron="0 * * * *"))
    runner = inline_runner(clock)
    clock.set(T0 + timedelta(hours=1, seconds=59))
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.scheduled_for) == ("success", T0 + timedelta(hours=1))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"enabled": False}, "task disabled"),
        ({"cron": "30 * * * *"}, "rescheduled"),
        (None, "task deleted"),
    ],
)
def test_the_definition_is_reread_before_each_attempt(clock, change, reason):
    scheduler.register(definition())
    runner = inline_runner(clock)
    clock.advance(60)

    scheduling.schedule_due(clock.now(), "node-a")
    if change is None:
        scheduler.unregister("report")
    else:
        scheduler.update_task("report", **change)
    runner.tick()
    execution = Execution.objects.get()
    assert execution.status == Status.INTERRUPTED
    assert execution.error["reason"] == reason
    assert not hooks.CALLS


def test_manual_triggers_run_on_disabled_tasks(clock):
    scheduler.register(definition(enabled=False))
    execution = scheduler.trigger("report", source="ops", params={"result": "manual"})
    runner = inline_runner(clock)
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.result, execution.trigger_source) == ("success", "manual", "ops")


def test_delete_after_run_deletes_after_success_only(clock):
    scheduler.register(definition("once", delete_after_run=True))
    scheduler.register(definition("fails", delete_after_run=True, params={"fail": True}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    assert list(Task.objects.values_list("id", flat=True)) == ["fails"]


def test_delete_after_run_spares_a_task_updated_during_the_run(clock):
    scheduler.register(definition(delete_after_run=True, params={"update_task": {"name": "Changed"}}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    assert Execution.objects.get().status == Status.SUCCESS
    assert Task.objects.get().name == "Changed"


def test_a_claim_that_never_started_is_simply_claimed_again(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report")
    runner = inline_runner(clock)
    dead = expire_lease(clock, start=False)
    runner.tick()  # recovery: claimed -> pending
    runner.tick()  # claim and run
    execution = Execution.objects.get()
    assert (execution.status, execution.attempt) == ("success", 1)
    assert hooks.CALLS[0].context.attempt == 1
    assert not journal.transition(
        execution.sequence, Status.CLAIMED, Status.RUNNING, at=clock.now(), reason="late", token=dead.token
    )


def test_a_lost_running_attempt_of_a_non_idempotent_task_becomes_unknown(clock):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 3}))
    scheduler.trigger("report")
    runner = inline_runner(clock)
    dead = expire_lease(clock)
    runner.tick()
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.attempt) == ("unknown", 1)
    assert not hooks.CALLS
    assert ExecutionLog.objects.get().status == "unknown"
    # The dead node comes back and records its outcome the way every runner does: nothing changes.
    frozen = (Execution.objects.values().get(), transitions(execution.occurrence_id))
    late = Outcome(Status.SUCCESS, "succeeded", result="late")
    assert not _finish(Attempt(dead), "dead-node", clock, late, from_status=Status.RUNNING)
    assert (Execution.objects.values().get(), transitions(execution.occurrence_id)) == frozen
    assert list(ExecutionLog.objects.values_list("attempt", "status")) == [(1, "unknown")]


def test_a_lost_running_attempt_of_an_idempotent_task_runs_again_as_attempt_two(clock):
    scheduler.register(definition(cron="0 0 1 1 *", idempotent=True, retry={"max_attempts": 2}))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    expire_lease(clock)
    runner.tick()
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == ("success", 2)
    assert hooks.started() == ran_once("report", execution.occurrence_id, 2)
    assert list(ExecutionLog.objects.order_by("attempt").values_list("attempt", "status")) == [
        (1, "unknown"),
        (2, "success"),
    ]


def test_an_idempotent_task_without_attempts_left_becomes_unknown(clock):
    scheduler.register(definition(cron="0 0 1 1 *", idempotent=True))
    scheduler.trigger("report")
    runner = inline_runner(clock)
    expire_lease(clock)
    runner.tick()
    assert Execution.objects.get().status == "unknown"


def test_unknown_holds_the_serial_slot_until_resolved(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report")
    (first,) = unknown_as_a_crash_leaves_it(clock)
    runner = inline_runner(clock)
    second = scheduler.trigger("report")
    runner.tick()
    second.refresh_from_db()
    assert second.status == Status.PENDING
    first.refresh_from_db()
    scheduler.executions.resolve_unknown(
        first.occurrence_id, "discarded", expected_updated_at=first.updated_at
    )
    runner.tick()
    second.refresh_from_db()
    assert second.status == Status.SUCCESS


def test_a_failure_that_will_be_retried_is_one_warning_and_the_last_one_an_error_with_traceback(
    clock, caplog
):
    scheduler.register(
        definition(cron="0 0 1 1 *", retry={"max_attempts": 2, "backoff": [5]}, params={"fail": True})
    )
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    caplog.set_level(logging.WARNING, logger="scheduler_app")
    runner.tick()
    [retried] = [record for record in caplog.records if "failed" in record.getMessage()]
    assert (retried.levelname, retried.exc_info) == ("WARNING", None)
    assert retried.getMessage() == (
        f"attempt 1 of {execution.occurrence_id} failed (RuntimeError: boom); it will be retried"
    )
    caplog.clear()
    clock.advance(5)
    runner.tick()
    [last] = [record for record in caplog.records if "failed" in record.getMessage()]
    assert (last.levelname, last.getMessage()) == ("ERROR", f"attempt 2 of {execution.occurrence_id} failed")
    assert last.exc_info is not None and last.exc_info[0] is RuntimeError
    assert Execution.objects.get(sequence=execution.sequence).status == Status.FAILED


def test_request_stop_ends_a_pending_execution_at_once(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    stopped = scheduler.executions.request_stop(execution.occurrence_id, by="alice")
    assert (stopped.status, stopped.error["reason"]) == ("interrupted", "stop requested")
    assert stopped.stop_requested
    assert Execution.objects.get(sequence=execution.sequence).stop_requested
    inline_runner(clock).tick()
    assert not hooks.CALLS
    assert ExecutionLog.objects.get().status == "interrupted"


def test_a_stop_requested_between_claim_and_start_interrupts_without_running(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    claimed, _, _ = claims.claim(clock.now(), runner.node_id, 1, 30)
    scheduler.executions.request_stop(execution.occurrence_id)
    from scheduler_app.runner.attempt import Attempt, run_attempt

    run_attempt(Attempt(claimed[0]), runner.node_id, clock)
    execution.refresh_from_db()
    assert execution.status == "interrupted" and not hooks.CALLS


@pytest.mark.parametrize(
    ("moved_to", "answer"), [(Status.SUCCESS, "refused"), (Status.PENDING, Status.INTERRUPTED)]
)
def test_a_stop_request_follows_an_execution_that_moved_after_it_was_read(
    clock, monkeypatch, moved_to, answer
):
    """Read running, then its outcome (or its failed attempt's return to pending for a retry)
    commits before the flag is written: a finished run is not answered as stopped, a pending one
    is ended."""
    from scheduler_app.exceptions import InvalidState
    from scheduler_app.services import Executions

    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    claims.claim(clock.now(), "node-a", 1, 30)
    Execution.objects.filter(sequence=execution.sequence).update(status=Status.RUNNING)
    stale = Execution.objects.get(sequence=execution.sequence)
    Execution.objects.filter(sequence=execution.sequence).update(status=moved_to, execution_token="")
    reads = iter([stale])
    real_get = Executions.get
    monkeypatch.setattr(
        Executions, "get", lambda self, occurrence_id: next(reads, None) or real_get(self, occurrence_id)
    )
    if answer == "refused":
        with pytest.raises(InvalidState):
            scheduler.executions.request_stop(execution.occurrence_id)
        row = Execution.objects.get(sequence=execution.sequence)
        assert (row.status, row.stop_requested) == (Status.SUCCESS, False)
    else:
        stopped = scheduler.executions.request_stop(execution.occurrence_id)
        assert (stopped.status, stopped.stop_requested) == (Status.INTERRUPTED, True)


def test_an_idle_tick_is_one_query_whatever_the_number_of_tasks(clock, django_assert_num_queries):
    def define(count: int) -> None:
        Task.objects.all().delete()
        Task.objects.bulk_create(
            Task(id=f"t{i}", name="t", cron="0 0 1 1 *", next_run_at=T0 + timedelta(days=300))
            for i in range(count)
        )

    runner = inline_runner(clock)
    runner.tick()
    define(10)
    with django_assert_num_queries(1):
        runner.tick()
    define(10_000)
    with django_assert_num_queries(1):
        runner.tick()


def test_a_retry_interrupted_before_it_runs_keeps_the_failed_attempt_log(clock):
    scheduler.register(definition(retry={"max_attempts": 3, "backoff": [60]}, params={"fail": True}))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    execution = Execution.objects.get()
    scheduler.update_task("report", enabled=False)
    clock.advance(60)
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.error["reason"]) == (
        "interrupted",
        2,
        "task disabled",
    )
    logs = ExecutionLog.objects.filter(occurrence_id=execution.occurrence_id).order_by("attempt")
    assert list(logs.values_list("attempt", "status")) == [(1, "failed"), (2, "interrupted")]


def test_a_stored_definition_with_a_broken_cron_does_not_stall_the_others(clock, caplog):
    scheduler.register(definition("good"))
    scheduler.register(definition("bad"))
    Task.objects.filter(id="bad").update(cron="not a cron")
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    assert Execution.objects.get().task_id == "good"
    assert Task.objects.get(id="bad").next_run_at is None
    assert "bad has an invalid schedule" in caplog.text


def test_an_error_inside_the_hook_that_mentions_json_is_reported_as_is(clock):
    scheduler.register(definition())
    runner = inline_runner(clock)
    with override_settings(
        SCHEDULER_APP={"HOOKS": {"on_task_execute": "tests.test_runner.raises_value_error"}}
    ):
        clock.advance(60)
        runner.tick()
    assert Execution.objects.get().error["message"] == "ValueError: payload is not JSON serializable"


def raises_value_error(event):
    raise ValueError("payload is not JSON serializable")


def test_a_log_lost_at_an_earlier_attempt_is_rebuilt_by_a_later_one(clock, monkeypatch):
    from scheduler_app import logs

    scheduler.register(definition(retry={"max_attempts": 2, "backoff": [0]}, params={"fail": True}))
    runner = inline_runner(clock)
    real_write = logs.write
    failures = iter([True, True])

    def flaky_write(rows):
        if next(failures, False):
            from django.db import OperationalError

            raise OperationalError("log database away")
        real_write(rows)

    monkeypatch.setattr(logs, "write", flaky_write)
    clock.advance(60)
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.attempt, execution.log_persistence) == (1, "pending")
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.log_persistence) == ("failed", "persisted")
    assert sorted(ExecutionLog.objects.values_list("attempt", flat=True)) == [1, 2]


def test_a_large_burst_is_scheduled_in_batches_so_claims_start_early(clock):
    from scheduler_app.runner.scheduling import BATCH

    Task.objects.bulk_create(
        Task(id=f"t{i:04d}", name="t", cron="* * * * *", next_run_at=T0 + timedelta(minutes=1))
        for i in range(BATCH + 100)
    )
    runner = inline_runner(clock, workers=0)
    clock.advance(60)
    runner.tick()
    assert Execution.objects.count() == BATCH
    runner.tick()
    assert Execution.objects.count() == BATCH + 100
    assert Execution.objects.values("task_id").distinct().count() == BATCH + 100


@pytest.mark.parametrize("distinct", [2, 12])
def test_each_scheduled_task_moves_to_its_own_next_fire_time(clock, distinct):
    # Few distinct next instants take one UPDATE each; many take one UPDATE with a per-row CASE.
    for i in range(24):
        scheduler.register(definition(f"task-{i}", cron=f"*/{i % distinct + 1} * * * *"))
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    fired = T0 + timedelta(minutes=1)
    for task in Task.objects.all():
        step = int(task.cron.split()[0][2:])
        following = next(m for m in range(2, 120) if m % step == 0)
        assert task.next_run_at == T0 + timedelta(minutes=following), task.id
    every_minute = sum(1 for i in range(24) if i % distinct == 0)
    assert Execution.objects.filter(scheduled_for=fired).count() == every_minute
