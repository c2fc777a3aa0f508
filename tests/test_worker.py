"""The threaded runner: cancellation on shutdown, stop requests and lost leases."""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager, suppress

import pytest

from scheduler_app import scheduler
from scheduler_app.models import Execution, ExecutionEvent, Status
from tests.factories import definition, transitions
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
    wait_for(lambda: status_of(execution) == Status.INTERRUPTED, timeout=15)  # not the 60 s block
    assert execution.error["message"] == "stop requested"


def test_a_stop_request_reaches_a_running_attempt_within_about_a_tick_not_at_the_renewal(running):
    """With a 300 s lease the renewal comes every 30 s; the runner reads the stop flags of its running
    attempts once per tick interval (0.5 s here) instead."""
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"block": 60})
    running(lease_seconds=300, tick_interval=0.5)
    wait_for(lambda: status_of(execution) == Status.RUNNING)
    scheduler.executions.request_stop(execution.occurrence_id, by="ops")
    wait_for(lambda: status_of(execution) == Status.INTERRUPTED, timeout=15)  # the renewal comes at 30 s
    stopped = Execution.objects.get(sequence=execution.sequence)
    assert (
        stopped.error == {"reason": "stop requested", "message": "stop requested"} and stopped.result is None
    )


def test_a_runner_that_loses_its_lease_cancels_and_writes_nothing_more(running):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"block": 60})
    runner = running(lease_seconds=1.5)
    wait_for(lambda: status_of(execution) == Status.RUNNING)
    # Another node recovered the row: new token, state unknown.
    Execution.objects.filter(sequence=execution.sequence).update(status=Status.UNKNOWN, execution_token="")
    events_before = ExecutionEvent.objects.filter(execution_id=execution.sequence).count()
    wait_for(lambda: not runner.in_flight)
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


@contextmanager
def runner_after_one_claim(monkeypatch, node_id: str, workers: int):
    """A started runner that has claimed once with every worker waiting, and whose writer starts no
    attempt until the block ends; shut down (then stopped) on the way out."""
    from scheduler_app.runner.loop import SchedulerLoop
    from scheduler_app.runner.writer import JournalWriter

    released = threading.Event()
    monkeypatch.setattr(JournalWriter, "start", lambda self, attempt: released.wait(30) and (False, None))
    runner = SchedulerLoop(node_id=node_id, workers=workers, lease_seconds=30, drain_seconds=10)
    runner.start()
    try:
        assert runner._pool is not None
        wait_for(lambda: runner._pool.idle() == workers)
        assert runner.tick()
        yield runner
    finally:
        runner.shutdown()
        released.set()
        runner.stop()


def test_attempts_claimed_for_waiting_workers_are_running_when_the_claim_returns(monkeypatch):
    """Those a waiting worker takes at once start in the claim's tick, in one write; the rest
    stay claimed until a worker is free (here never: workers may not start anything)."""
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=3))
    executions = [scheduler.trigger("report", params={"block": 60}) for _ in range(3)]
    with runner_after_one_claim(monkeypatch, "prestart", workers=2):
        statuses = Counter(status_of(e) for e in executions)
        assert statuses == Counter({Status.RUNNING: 2, Status.CLAIMED: 1})
        running = [e for e in executions if e.status == Status.RUNNING]
        assert len({e.started_at for e in running}) == 1  # one write
    assert Counter(status_of(e) for e in executions) == Counter({Status.INTERRUPTED: 2, Status.PENDING: 1})


def test_a_shutdown_releases_a_queued_attempt_even_when_a_cancelled_one_frees_a_worker_at_once(monkeypatch):
    """A worker freed by the shutdown's cancel of a running attempt must find the queued one already
    cancelled: released to pending, not started and interrupted."""
    from scheduler_app.runner.attempt import Attempt

    cancel = Attempt.cancel

    def cancel_then_let_a_freed_worker_take_the_queue(self, reason, **kwargs):
        cancel(self, reason, **kwargs)
        if self.started is not None:  # its handler returns now: give its worker time to take the next
            with suppress(AssertionError):
                wait_for(lambda: runner._pool._queue.qsize() == 0, timeout=2)

    monkeypatch.setattr(Attempt, "cancel", cancel_then_let_a_freed_worker_take_the_queue)
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=2))
    executions = [scheduler.trigger("report", params={"block": 60}) for _ in range(2)]
    with runner_after_one_claim(monkeypatch, "freed", workers=1) as runner:
        assert Counter(status_of(e) for e in executions) == Counter({Status.RUNNING: 1, Status.CLAIMED: 1})
    assert Counter(status_of(e) for e in executions) == Counter({Status.INTERRUPTED: 1, Status.PENDING: 1})


def test_an_attempt_started_early_and_cancelled_before_its_worker_took_it_ends_without_running(clock):
    from scheduler_app.runner import claims
    from scheduler_app.runner.attempt import Attempt, run_attempt
    from tests import hooks

    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    (claim,), _, _ = claims.claim(clock.now(), "node-a", 1, 60, start=1)
    assert claim.started is True
    assert status_of(execution) == Status.RUNNING
    attempt = Attempt(claim)
    attempt.started = (True, clock.now())
    calls = len(hooks.CALLS)
    attempt.cancel("shutdown")
    run_attempt(attempt, "node-a", clock)
    assert (status_of(execution), execution.error["message"]) == (Status.INTERRUPTED, "shutdown")
    assert len(hooks.CALLS) == calls
    moves = transitions(execution.occurrence_id)
    assert moves[-2:] == [(Status.CLAIMED, Status.RUNNING), (Status.RUNNING, Status.INTERRUPTED)]


def test_a_claim_whose_start_fails_is_rolled_back_whole(clock, monkeypatch):
    """The rows a claim starts for waiting workers are claimed and started in its transaction (in
    one statement on PostgreSQL): a failure after them leaves them pending, with no event."""
    from django.db import DatabaseError

    from scheduler_app.runner import claims
    from scheduler_app.statements import journal_statements

    take = type(journal_statements()).take

    def refuse(self, chosen, now, node, lease_until, *, start=0):
        taken = take(self, chosen, now, node, lease_until, start=start)
        assert [row.status for row, _ in taken] == [Status.RUNNING]
        raise DatabaseError("the start failed")

    monkeypatch.setattr(type(journal_statements()), "take", refuse)
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    with pytest.raises(DatabaseError):
        claims.claim(clock.now(), "node-a", 1, 60, start=1)
    assert status_of(execution) == Status.PENDING
    assert transitions(execution.occurrence_id) == [("", Status.PENDING)]


def test_a_claim_whose_early_start_fails_takes_nothing_and_a_later_claim_runs_the_row(running, monkeypatch):
    """The start shares the claim's transaction: when it fails, the row was never claimed."""
    from django.db import DatabaseError

    from scheduler_app.statements import journal_statements

    statements = type(journal_statements())
    original = statements.take
    refused: list[int] = []

    def fails_once(self, chosen, now, node, lease_until, *, start=0):
        taken = original(self, chosen, now, node, lease_until, start=start)
        if not refused and start:
            refused.append(sum(1 for row, _ in taken if row.status == Status.RUNNING))
            raise DatabaseError("the early start failed")
        return taken

    monkeypatch.setattr(statements, "take", fails_once)
    scheduler.register(definition(cron="0 0 1 1 *"))
    running()
    execution = scheduler.trigger("report", params={"result": "ran"}, wait=10)
    assert (execution.status, execution.result) == (Status.SUCCESS, "ran")
    assert refused == [1]
    assert transitions(execution.occurrence_id) == [
        ("", Status.PENDING),
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
        (Status.RUNNING, Status.SUCCESS),
    ]


FINISHED: list[str] = []


def record_finish(event) -> None:
    """An on_task_finish hook: the status its execution has in the database when the hook runs."""
    FINISHED.append(Execution.objects.get(sequence=event.context.sequence).status)


def finish_hook():
    from django.conf import settings
    from django.test import override_settings

    hooks = {**settings.SCHEDULER_APP["HOOKS"], "on_task_finish": "tests.test_worker.record_finish"}
    FINISHED.clear()
    return override_settings(SCHEDULER_APP={**settings.SCHEDULER_APP, "HOOKS": hooks})


def hold_outcomes(monkeypatch) -> threading.Event:
    """The writer writes no outcome until the returned event is set (starts still go through)."""
    from scheduler_app.runner.writer import JournalWriter

    gate = threading.Event()
    write = JournalWriter._write

    def held(self, batch):
        if any(request.outcome is not None for request in batch):
            gate.wait(30)
        write(self, batch)

    monkeypatch.setattr(JournalWriter, "_write", held)
    return gate


def test_a_worker_hands_its_outcome_to_the_writer_and_is_free_before_the_commit(clock, monkeypatch):
    """What follows the commit (the hooks, the attempt leaving flight) runs after it, as the work
    handed back to a worker; never on the writer's thread."""
    import queue

    from scheduler_app.runner import claims
    from scheduler_app.runner.attempt import Attempt, run_attempt
    from scheduler_app.runner.writer import JournalWriter

    gate = hold_outcomes(monkeypatch)
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"result": "ran"})
    (claim,), _, _ = claims.claim(clock.now(), "node-a", 1, 60)
    writer = JournalWriter("node-a", clock)
    follow_ups: queue.Queue = queue.Queue()
    attempt = Attempt(claim, journal=writer, follow_up=lambda _, work: follow_ups.put(work))
    try:
        with finish_hook():
            assert run_attempt(attempt, "node-a", clock)
            assert attempt.handed_off
            assert status_of(execution) == Status.RUNNING
            assert follow_ups.empty()
            gate.set()
            work = follow_ups.get(timeout=20)
            assert (status_of(execution), execution.result) == (Status.SUCCESS, "ran")
            assert FINISHED == []
            assert work()
            assert FINISHED == [Status.SUCCESS]
    finally:
        gate.set()
        writer.stop(10)


@pytest.mark.parametrize("follows", ["nothing", "hook", "receiver", "delete_after_run", "failed for good"])
def test_a_worker_runs_what_follows_an_outcome_only_when_something_does(clock, follows):
    """A success whose log row shared its commit, with no hook, signal receiver, alert or deletion
    after it, is taken out of flight on the writer's thread: no worker wakes for it. Anything that
    follows still runs on a worker, after the commit."""
    from contextlib import nullcontext

    from scheduler_app import signals
    from scheduler_app.runner import claims
    from scheduler_app.runner.attempt import Attempt, run_attempt
    from scheduler_app.runner.writer import JournalWriter

    received = []
    FINISHED.clear()

    def receiver(sender, event, **kwargs):
        received.append(event.context.sequence)

    task = {"cron": "0 0 1 1 *", "delete_after_run": follows == "delete_after_run"}
    scheduler.register(definition(**task))
    params = {"fail": True} if follows == "failed for good" else {"result": "ran"}
    execution = scheduler.trigger("report", params=params)
    (claim,), _, _ = claims.claim(clock.now(), "node-a", 1, 60)
    writer = JournalWriter("node-a", clock)
    follow_ups = []
    done = threading.Event()

    def follow_up(attempt, work):
        follow_ups.append(work)
        done.set()

    if follows == "receiver":
        signals.task_finished.connect(receiver)
    try:
        with finish_hook() if follows == "hook" else nullcontext():
            assert run_attempt(Attempt(claim, journal=writer, follow_up=follow_up), "node-a", clock)
            assert done.wait(20)
            (work,) = follow_ups
            ended = Status.FAILED if follows == "failed for good" else Status.SUCCESS
            assert status_of(execution) == ended
            if follows == "nothing":
                assert work is None
                assert claim.execution.status == ended
                return
            assert work()
            assert claim.execution.status == ended
            assert ([Status.SUCCESS] if follows == "hook" else []) == FINISHED
            assert received == ([execution.sequence] if follows == "receiver" else [])
            if follows == "delete_after_run":
                from scheduler_app.models import Task

                assert not Task.objects.filter(id="report").exists()
    finally:
        signals.task_finished.disconnect(receiver)
        writer.stop(10)


def test_stopping_waits_for_what_follows_handed_off_outcomes(monkeypatch):
    from scheduler_app.runner.loop import SchedulerLoop
    from scheduler_app.runner.workers import WorkerPool
    from tests import hooks

    gate = hold_outcomes(monkeypatch)
    in_flight_at_pool_stop = []
    stop_pool = WorkerPool.stop

    def stop(self, timeout):
        in_flight_at_pool_stop.append(len(runner.in_flight))
        gate.set()
        return stop_pool(self, timeout)

    monkeypatch.setattr(WorkerPool, "stop", stop)
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=2))
    calls = len(hooks.CALLS)
    executions = [scheduler.trigger("report") for _ in range(2)]
    runner = SchedulerLoop(node_id="handing-off", workers=2, lease_seconds=30, drain_seconds=10)
    wait_idle = runner.wait_idle

    def idle(timeout, **options):
        gate.set()
        return wait_idle(timeout, **options)

    monkeypatch.setattr(runner, "wait_idle", idle)
    with finish_hook():
        runner.start()
        try:
            runner.tick()
            wait_for(lambda: len(hooks.CALLS) == calls + 2)
            wait_for(lambda: all(a.handed_off for a in list(runner.in_flight.values())))
        finally:
            runner.shutdown()
            runner.stop()
        assert in_flight_at_pool_stop == [0]
        assert FINISHED == [Status.SUCCESS, Status.SUCCESS]
    assert [status_of(e) for e in executions] == [Status.SUCCESS, Status.SUCCESS]


def test_the_pool_starts_threads_as_work_arrives_up_to_its_size_and_ends_them_when_idle():
    from scheduler_app.runner.workers import WorkerPool

    pool = WorkerPool(2, lambda attempt: None, idle_seconds=0.2)
    assert (pool.threads(), pool.idle()) == (0, 2)
    release = threading.Event()
    ran: list[int] = []

    def work(n: int):
        return lambda: release.wait(20) and ran.append(n)

    try:
        for n in range(3):
            pool.submit(work(n))
        assert pool.threads() == 2
        # A thread counts as waiting until it has counted out the item it took.
        wait_for(lambda: pool.idle() == 0)
        release.set()
        wait_for(lambda: sorted(ran) == [0, 1, 2])
        wait_for(lambda: pool.threads() == 0)
        pool.submit(work(3))
        wait_for(lambda: ran[-1:] == [3])
        assert pool.threads() == 1
    finally:
        release.set()
        assert pool.stop(10)
    assert pool.threads() == 0


def test_the_default_worker_count_is_sixteen_and_four_on_sqlite():
    from django.db import connection

    from scheduler_app.runner.loop import SchedulerLoop

    expected = 4 if connection.vendor == "sqlite" else 16
    assert SchedulerLoop(node_id="defaults").workers == expected
    assert SchedulerLoop(node_id="given", workers=3).workers == 3


def test_a_shutdown_that_comes_during_a_claim_cancels_the_attempts_that_claim_took(running, monkeypatch):
    """The claim commits its rows before the runner counts them in flight: a shutdown between the
    two must not leave them to run their handlers through the drain."""
    from scheduler_app.runner import claims

    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 3}))
    runner_of: dict[str, object] = {}
    original = claims.claim

    def claim_then_shut_down(*args, **kwargs):
        claimed, ended, left_due = original(*args, **kwargs)
        if claimed:
            runner_of["runner"].shutdown()
        return claimed, ended, left_due

    monkeypatch.setattr(claims, "claim", claim_then_shut_down)
    runner_of["runner"] = running()
    execution = scheduler.trigger("report", params={"block": 60})
    wait_for(lambda: status_of(execution) == Status.INTERRUPTED)
    assert (execution.attempt, execution.error["message"]) == (1, "shutdown")
