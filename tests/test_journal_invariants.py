"""A model-based test: random interleavings of runners, dying nodes and operators against the real database.

A hypothesis state machine registers tasks, moves a fake clock, ticks inline
runners, triggers (with and without idempotency keys), simulates nodes that
claim or start an attempt and die (or come back late with their old token),
stops, resolves and repairs executions and edits the schedule. After every
step it checks the design's invariants: one scheduled execution per minute,
max_concurrency, fencing, the log projection, the journal's state machine,
frozen terminal executions and at most once for non-idempotent tasks (a
non-idempotent occurrence starts again only after an attempt that failed
with attempts left, never after one whose outcome is unknown).

SCHEDULER_MODEL_EXAMPLES sets the number of examples (default 80).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.forms.models import model_to_dict
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from scheduler_app import journal, logs, scheduler
from scheduler_app.exceptions import Conflict, InvalidState
from scheduler_app.models import (
    LEASED,
    OCCUPYING,
    TERMINAL,
    Execution,
    ExecutionEvent,
    ExecutionLog,
    LogPersistence,
    MaintenanceMark,
    Status,
    Task,
    TriggerType,
)
from scheduler_app.models import Runner as RunnerRecord
from scheduler_app.runner import claims
from scheduler_app.runner.attempt import Attempt, _finish, run_attempt
from scheduler_app.runner.claims import Claim
from scheduler_app.runner.clock import FakeClock
from scheduler_app.runner.recording import Outcome
from tests import hooks
from tests.factories import T0, definition, inline_runner

pytestmark = pytest.mark.django_db

LEASE = 30
TASK_IDS = ("alpha", "beta", "gamma")
NODES = ("node-a", "node-b", "node-c")
CRONS = ("* * * * *", "*/2 * * * *", "*/5 * * * *", "0 0 1 1 *")
KEYS = ("k1", "k2")
PAYLOADS = (None, {"fail": True}, {"fail": False}, {"skip": True}, {"result": 7})

# Every state change the design allows ("" is the creation event).
ALLOWED = {
    "": {Status.PENDING, Status.INTERRUPTED},
    Status.PENDING: {Status.CLAIMED, Status.INTERRUPTED},
    Status.CLAIMED: {Status.RUNNING, Status.PENDING, Status.INTERRUPTED},
    Status.RUNNING: {Status.SUCCESS, Status.FAILED, Status.INTERRUPTED, Status.PENDING, Status.UNKNOWN},
    Status.UNKNOWN: {Status.SUCCESS, Status.DISCARDED},
}
# What a terminal execution must keep forever (log_persistence may still be confirmed later).
FROZEN = (
    "status",
    "attempt",
    "result",
    "error",
    "started_at",
    "finished_at",
    "owner",
    "execution_token",
    "lease_expires_at",
    "due_at",
    "params",
    "updated_at",
)


@dataclass
class Ghost:
    """An attempt claimed (and maybe started) by a node that then stopped answering."""

    claim: Claim
    node: str
    started: bool = False


def row_state(sequence: int) -> dict[str, Any] | None:
    row = Execution.objects.filter(sequence=sequence).first()
    if row is None:
        return None
    state = model_to_dict(row)
    state["events"] = list(
        ExecutionEvent.objects.filter(execution_id=sequence).values_list("id", "to_status", "attempt")
    )
    state["logs"] = sorted(
        ExecutionLog.objects.filter(occurrence_id=row.occurrence_id).values_list("id", "status", "attempt")
    )
    return state


def log_key(log: ExecutionLog) -> tuple[Any, ...]:
    return (log.attempt, log.status, log.result, log.error)


# The varied parts of a registered task; the cron strategy differs between the first task and later ones.
TASK_SHAPES: dict[str, st.SearchStrategy[Any]] = {
    "task_id": st.sampled_from(TASK_IDS),
    "idempotent": st.booleans(),
    "attempts": st.integers(1, 3),
    "backoff": st.sampled_from([[], [0], [10, 60], [90]]),
    "concurrency": st.integers(1, 2),
    "overlap": st.sampled_from(["skip", "buffer_one"]),
    "params": st.sampled_from([{}, {"fail": True}, {"skip": True}, {"result": "ok"}]),
}


class SchedulerMachine(RuleBasedStateMachine):
    clock: FakeClock  # set by the test

    def __init__(self) -> None:
        super().__init__()
        for model in (ExecutionLog, ExecutionEvent, Execution, Task, RunnerRecord, MaintenanceMark):
            model.objects.all().delete()
        hooks.CALLS.clear()
        self.clock.set(T0)
        self.runners = {node: inline_runner(self.clock, node_id=node, lease_seconds=LEASE) for node in NODES}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.keys: dict[tuple[str, str], tuple[Any, int]] = {}
        self.ghosts: list[Ghost] = []
        self.ghost_count = 0
        self.terminal: dict[int, dict[str, Any]] = {}

    # -- definitions ---------------------------------------------------------------

    @initialize(**TASK_SHAPES, cron=st.sampled_from(CRONS[:3]))
    def first_task(self, **kwargs: Any) -> None:
        self.register(**kwargs)

    @rule(**TASK_SHAPES, cron=st.sampled_from(CRONS))
    def register(
        self,
        task_id: str,
        idempotent: bool,
        attempts: int,
        backoff: list[int],
        concurrency: int,
        overlap: str,
        params: dict[str, Any],
        cron: str,
    ) -> None:
        if task_id in self.tasks:
            return
        spec = definition(
            task_id,
            cron=cron,
            idempotent=idempotent,
            retry={"max_attempts": attempts, "backoff": backoff},
            max_concurrency=concurrency,
            overlap=overlap,
            params=params,
        )
        scheduler.register(spec)
        self.tasks[task_id] = spec

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), cron=st.sampled_from(CRONS))
    def change_cron(self, data: st.DataObject, cron: str) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        scheduler.update_task(task_id, cron=cron)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), enabled=st.booleans())
    def toggle(self, data: st.DataObject, enabled: bool) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        scheduler.update_task(task_id, enabled=enabled)

    # -- time and runners -------------------------------------------------------------

    @rule(seconds=st.one_of(st.sampled_from([LEASE + 1, 60, 61, 90, 150, 400]), st.integers(1, 59)))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(node=st.sampled_from(NODES))
    def tick(self, node: str) -> None:
        self.runners[node].tick()

    # -- triggers ------------------------------------------------------------------

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), key=st.one_of(st.none(), st.sampled_from(KEYS)), params=st.sampled_from(PAYLOADS))
    def trigger(self, data: st.DataObject, key: str | None, params: dict[str, Any] | None) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        payload = params or {}
        known = self.keys.get((task_id, key)) if key is not None else None
        if known is not None and known[0] != payload:
            with pytest.raises(Conflict):
                scheduler.trigger(task_id, idempotency_key=key, params=params)
            return
        execution = scheduler.trigger(task_id, source="model", idempotency_key=key, params=params)
        if known is not None:
            assert execution.sequence == known[1], "the same key and payload must return the same execution"
        elif key is not None:
            self.keys[(task_id, key)] = (payload, execution.sequence)

    # -- nodes that die -------------------------------------------------------------

    @rule(data=st.data(), start=st.booleans(), trigger_first=st.booleans(), payload=st.sampled_from(PAYLOADS))
    def ghost_claims(
        self, data: st.DataObject, start: bool, trigger_first: bool, payload: dict[str, Any] | None
    ) -> None:
        """A node claims one due execution (and maybe starts it), then stops answering."""
        if trigger_first and self.tasks:
            scheduler.trigger(data.draw(st.sampled_from(sorted(self.tasks))), params=payload)
        self.ghost_count += 1
        node = f"ghost-{self.ghost_count}"
        claimed, _, _ = claims.claim(self.clock.now(), node, 1, LEASE)
        for claim in claimed:
            ghost = Ghost(claim, node)
            self.ghosts.append(ghost)
            if start:
                self._ghost_start(ghost)

    @precondition(lambda self: any(not ghost.started for ghost in self.ghosts))
    @rule(data=st.data())
    def ghost_starts(self, data: st.DataObject) -> None:
        waiting = [ghost for ghost in self.ghosts if not ghost.started]
        self._ghost_start(data.draw(st.sampled_from(waiting)))

    def _ghost_start(self, ghost: Ghost) -> None:
        execution, token = ghost.claim.execution, ghost.claim.token
        before = row_state(execution.sequence)
        now = self.clock.now()
        started = journal.transition(
            execution.sequence,
            Status.CLAIMED,
            Status.RUNNING,
            at=now,
            token=token,
            node=ghost.node,
            attempt=execution.attempt,
            reason="started",
            fields={"started_at": now},
            extra_filter={"stop_requested": False},
        )
        if started:
            ghost.started = True
            execution.started_at = now
        else:
            assert row_state(execution.sequence) == before, "a refused start must change nothing"
            if before is not None and before["execution_token"] != token:
                self.ghosts.remove(ghost)

    @precondition(lambda self: self.ghosts)
    @rule(data=st.data(), succeed=st.booleans(), partitioned=st.booleans(), node=st.sampled_from(NODES))
    def ghost_comes_back(self, data: st.DataObject, succeed: bool, partitioned: bool, node: str) -> None:
        """The node answers again and finishes with its old token: a no-op once the lease was taken.

        ``partitioned``: it was away longer than its lease and another runner ticked meanwhile.
        """
        ghost = data.draw(st.sampled_from(self.ghosts))
        self.ghosts.remove(ghost)
        if partitioned:
            self.clock.advance(LEASE + 1)
            self.runners[node].tick()
        execution, token = ghost.claim.execution, ghost.claim.token
        before = row_state(execution.sequence)
        assert before is not None
        still_owner = before["execution_token"] == token
        if not still_owner:
            # The fence alone first: a move from the row's own status, with the old token, is refused.
            assert not journal.transition(
                execution.sequence,
                before["status"],
                Status.SUCCESS,
                at=self.clock.now(),
                reason="late",
                token=token,
            )
        attempt = Attempt(ghost.claim)
        if ghost.started:
            outcome = (
                Outcome(Status.SUCCESS, "succeeded", result={"late": True})
                if succeed
                else Outcome(Status.FAILED, "failed", error={"code": "scheduler:031", "message": "late"})
            )
            _finish(attempt, ghost.node, self.clock, outcome, from_status=Status.RUNNING)
        else:
            run_attempt(attempt, ghost.node, self.clock)
        if not still_owner:
            assert row_state(execution.sequence) == before, "a write after a lost lease changed the row"

    @rule()
    def ghost_recovers(self) -> None:
        """A node recovers expired leases, then dies before it writes the log rows of what it recovered."""
        self.ghost_count += 1
        claims.recover_expired(self.clock.now(), f"ghost-{self.ghost_count}")

    # -- operators ------------------------------------------------------------------

    def _pick(self, data: st.DataObject, rows: list[Execution]) -> Execution | None:
        if not rows:
            return None
        return data.draw(st.sampled_from(rows))

    @rule(data=st.data(), anything=st.booleans())
    def request_stop(self, data: st.DataObject, anything: bool) -> None:
        rows = Execution.objects.order_by("sequence")
        if not anything:
            rows = rows.filter(status__in=(Status.PENDING, *LEASED))
        execution = self._pick(data, list(rows))
        if execution is None:
            return
        if execution.status in (Status.PENDING, *LEASED):
            stopped = scheduler.executions.request_stop(execution.occurrence_id, by="model")
            if execution.status == Status.PENDING:
                assert stopped.status == Status.INTERRUPTED
            else:
                assert stopped.stop_requested
        else:
            with pytest.raises(InvalidState):
                scheduler.executions.request_stop(execution.occurrence_id)

    @rule(data=st.data(), stale=st.booleans(), status=st.sampled_from(["success", "discarded"]))
    def resolve_unknown(self, data: st.DataObject, stale: bool, status: str) -> None:
        execution = self._pick(
            data, list(Execution.objects.filter(status=Status.UNKNOWN).order_by("sequence"))
        )
        if execution is None:
            # Resolving anything else is refused.
            other = self._pick(data, list(Execution.objects.exclude(status=Status.UNKNOWN)))
            if other is not None:
                with pytest.raises(InvalidState):
                    scheduler.executions.resolve_unknown(other.occurrence_id, status, other.updated_at)
            return
        if stale:
            before = row_state(execution.sequence)
            with pytest.raises(Conflict):
                scheduler.executions.resolve_unknown(
                    execution.occurrence_id, status, execution.updated_at - timedelta(seconds=1)
                )
            assert row_state(execution.sequence) == before
            return
        resolved = scheduler.executions.resolve_unknown(
            execution.occurrence_id, status, expected_updated_at=execution.updated_at, by="model"
        )
        assert (resolved.status, resolved.log_persistence) == (status, LogPersistence.PERSISTED)

    @rule(data=st.data())
    def repair_log(self, data: st.DataObject) -> None:
        execution = self._pick(data, list(Execution.objects.order_by("sequence")))
        if execution is None:
            return
        scheduler.executions.repair_log(execution.occurrence_id)
        execution.refresh_from_db()
        assert execution.log_persistence == LogPersistence.PERSISTED

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def journal_is_consistent(self) -> None:
        executions = list(Execution.objects.order_by("sequence"))
        events: dict[int, list[ExecutionEvent]] = {}
        for item in ExecutionEvent.objects.order_by("id"):
            events.setdefault(item.execution_id, []).append(item)
        stored_logs: dict[Any, list[ExecutionLog]] = {}
        for log in ExecutionLog.objects.all():
            stored_logs.setdefault(log.occurrence_id, []).append(log)
        tasks = {task.id: task for task in Task.objects.all()}

        # (1) at most one scheduled execution per (task, minute).
        slots = [(row.task_id, row.scheduled_for) for row in executions if row.trigger_type == "scheduled"]
        assert len(slots) == len(set(slots)), "two scheduled executions for one minute"

        # (2) occupancy never exceeds max_concurrency.
        for task_id, task in tasks.items():
            busy = [row.sequence for row in executions if row.task_id == task_id and row.status in OCCUPYING]
            assert len(busy) <= task.max_concurrency, f"{task_id}: {busy} occupy {task.max_concurrency} slots"

        for row in executions:
            chain = events.get(row.sequence, [])
            # (5) the status is the last event's, along a path of the state machine.
            assert chain, f"execution {row.sequence} has no events"
            assert chain[0].from_status == "", chain[0]
            previous = ""
            for item in chain:
                assert item.from_status == previous, f"{row.sequence}: broken chain at {item}"
                assert item.to_status in ALLOWED.get(previous, set()), f"{row.sequence}: illegal {item}"
                previous = item.to_status
            assert row.status == previous, f"{row.sequence} is {row.status}, its journal says {previous}"

            # (4) persisted logs are exactly what the journal projects.
            if row.log_persistence == LogPersistence.PERSISTED:
                task = tasks.get(row.task_id)
                expected = sorted(map(log_key, logs.project(row, chain, task.name if task else "")))
                actual = sorted(map(log_key, stored_logs.get(row.occurrence_id, [])))
                assert actual == expected, f"{row.sequence}: logs {actual} but the journal says {expected}"

            # (6) terminal executions never change again.
            if row.sequence in self.terminal:
                now_state = {field: getattr(row, field) for field in FROZEN}
                assert now_state == self.terminal[row.sequence], f"terminal {row.sequence} changed"
            elif row.status in TERMINAL:
                self.terminal[row.sequence] = {field: getattr(row, field) for field in FROZEN}

            # (7) at most once for non-idempotent tasks: a new start only after a known failed attempt.
            starts = [item for item in chain if item.to_status == Status.RUNNING]
            attempts = [item.attempt for item in starts]
            assert attempts == sorted(set(attempts)), f"{row.sequence}: attempts started {attempts}"
            assert all(n <= row.max_attempts for n in attempts), f"{row.sequence}: {attempts}"
            task = tasks.get(row.task_id)
            if task is not None and not task.idempotent:
                since_start = None
                for item in chain:
                    if item.to_status == Status.RUNNING:
                        assert since_start in (None, "retry"), (
                            f"{row.sequence}: non-idempotent attempt {item.attempt} started again "
                            f"after an attempt that ended {since_start}"
                        )
                        since_start = "running"
                    elif item.from_status == Status.RUNNING:
                        retried = item.to_status == Status.PENDING and item.reason.startswith("retry")
                        since_start = "retry" if retried else item.to_status
                if row.max_attempts == 1:
                    assert len(starts) <= 1, f"{row.sequence}: ran {len(starts)} times"

        # The hook ran at most once per (occurrence, attempt).
        runs = [(call.context.occurrence_id, call.context.attempt) for call in hooks.CALLS]
        assert len(runs) == len(set(runs)), "an attempt ran twice"

        for row in executions:
            if row.trigger_type == TriggerType.MANUAL and row.idempotency_key is not None:
                assert (row.task_id, row.idempotency_key) in self.keys


def test_random_interleavings_keep_the_journal_invariants(clock):
    examples = int(os.environ.get("SCHEDULER_MODEL_EXAMPLES", "80"))
    SchedulerMachine.clock = clock
    run_state_machine_as_test(
        SchedulerMachine,
        settings=settings(
            database=None,
            max_examples=examples,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
