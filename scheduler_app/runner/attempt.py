"""One attempt: call the handler and map how it ended to an Outcome; claimed -> running -> outcome."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import Error as DatabaseLibraryError
from django.db import transaction

from scheduler_app import alerts, audit, journal, logs
from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.exceptions import TaskSkipped
from scheduler_app.handlers import registry
from scheduler_app.handlers.base import HandlerError, MissingHandler, Resumable
from scheduler_app.handlers.hooks import call_hook, hook_follows, notify
from scheduler_app.models import ChangeAction, ChangeVia, Execution, Status, Task
from scheduler_app.runner import limits
from scheduler_app.runner.claims import Claim
from scheduler_app.runner.clock import Clock
from scheduler_app.runner.recording import (
    EXECUTION_FAILED,
    STOPPED,
    Answer,
    DirectJournal,
    Finish,
    HandsOff,
    JournalPort,
    Outcome,
)
from scheduler_app.storable import storable

logger = logging.getLogger("scheduler_app")

HOOK_FAILED = "scheduler:031"
# What call_handler returns for a handler that stopped at its cancellation with work going on elsewhere.
RESUMABLE = Outcome(Status.PENDING, "resumable")


@dataclass
class Attempt:
    """An attempt in flight on this runner and how to stop it."""

    claim: Claim
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    lease_lost: bool = False
    # Cancelled by the runner's shutdown: a handler whose work goes on elsewhere releases the attempt.
    release: bool = False
    lease_deadline: float = 0.0
    # Where its start and outcome are recorded; threaded runners set their batching writer,
    # whose commits the attempt then shares with others'. None: the direct journal.
    journal: JournalPort | None = None
    # (started, when), where the runner started the attempt before a worker took it.
    started: tuple[bool, datetime] | None = None
    # Set by the worker as the handler starts, when its kind has a time limit (runner/limits.py).
    limit: limits.Limit | None = None
    # Exactly one of the two comes true: the handler returned, so its worker records the outcome,
    # or the runner abandoned it past its limit and recorded it unknown.
    returned: bool = False
    abandoned: bool = False
    # Threaded runners: how to run what follows the commit of a handed-off outcome (a worker of
    # the pool runs it; None: nothing does). With it, the worker hands the outcome to the writer
    # and takes its next attempt at once instead of waiting for the commit.
    follow_up: Callable[[Attempt, Callable[[], object] | None], None] | None = None
    # The outcome was handed to the writer: the runner renews, cancels and counts the attempt no
    # more; it stays in flight until what follows its commit has run.
    handed_off: bool = False
    _ending: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cancel(self, reason: str, *, lease_lost: bool = False, release: bool = False) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.lease_lost = lease_lost
            self.release = release
            self.cancelled.set()

    def handler_returned(self) -> bool:
        """Called by the worker once the handler is done: True unless the attempt was abandoned first,
        in which case the worker writes nothing."""
        with self._ending:
            self.returned = not self.abandoned
            return self.returned

    def abandon(self) -> bool:
        """Called by the runner past the grace: True unless the handler returned (or it was
        abandoned) first."""
        with self._ending:
            if self.returned or self.abandoned:
                return False
            self.abandoned = True
            return True


def safe_message(exc: BaseException) -> str:
    """A short message for the journal; database errors never leak their SQL or driver text."""
    if isinstance(exc, DatabaseLibraryError):
        return "A database error occurred in the task."
    text = str(exc)
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def call_handler(event: TaskEvent, *, last_attempt: bool = True) -> Outcome:
    """Run the start hook and the handler; map every way out to an Outcome that can be stored.

    A failure that will be retried is logged as one warning; the last one with its traceback.
    """
    outcome, secrets = _call(event, last_attempt)
    try:
        result, error = storable(outcome.result, secrets), storable(outcome.error, secrets)
    except RecursionError:
        result, error = None, _not_json(event.task.handler)
    return Outcome(outcome.status, outcome.reason, result=result, error=error)


def _call(event: TaskEvent, last_attempt: bool) -> tuple[Outcome, list[str]]:
    """The outcome as the handler left it, and the secrets to scrub from it."""
    config = event.task.handler
    secrets: list[str] = []
    try:
        call_hook("on_task_start", event)
        handler = registry.for_config(config)
        if handler is None:
            raise MissingHandler("The task's handler kind is not installed.")
        secrets = handler.secrets(config) if config is not None else []
        result = handler.run(event)
    except TaskSkipped as exc:
        error = {"reason": "skipped", "message": exc.message[:500]}
        return Outcome(Status.INTERRUPTED, "skipped by the task", error=error), secrets
    except MissingHandler as exc:
        error = {"reason": "missing handler", "message": str(exc)}
        return Outcome(Status.INTERRUPTED, "missing handler", error=error), secrets
    except Resumable:
        if event.cancelled.is_set():
            return RESUMABLE, secrets
        error = {
            "code": HOOK_FAILED if config is None else EXECUTION_FAILED,
            "message": "The handler stopped as if cancelled, but was not.",
        }
        return Outcome(Status.FAILED, "failed", error=error), secrets
    except HandlerError as exc:
        return Outcome(
            Status.FAILED, "failed", error={"code": exc.code, "message": exc.message[:1000]}
        ), secrets
    except Exception as exc:
        message = safe_message(exc)
        if last_attempt:
            logger.exception("attempt %s of %s failed", event.context.attempt, event.context.occurrence_id)
        else:
            logger.warning(
                "attempt %s of %s failed (%s); it will be retried",
                event.context.attempt,
                event.context.occurrence_id,
                message,
            )
        error = {"code": HOOK_FAILED if config is None else EXECUTION_FAILED, "message": message}
        return Outcome(Status.FAILED, "failed", error=error), secrets
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return Outcome(Status.FAILED, "failed", error=_not_json(config)), secrets
    return Outcome(Status.SUCCESS, "succeeded", result=result), secrets


def _not_json(config: dict[str, Any] | None) -> dict[str, str]:
    return {"code": HOOK_FAILED if config is None else EXECUTION_FAILED, "message": "The result is not JSON."}


def run_attempt(attempt: Attempt, node: str, clock: Clock) -> bool:
    """Run one claimed attempt; after a lost lease nothing more is written.

    True when its outcome was handed off (``Attempt.follow_up``): what follows the commit (the
    log row when it did not share it, the hooks, ``delete_after_run``) then runs later, on a worker.
    """
    execution, task, token = attempt.claim.execution, attempt.claim.task, attempt.claim.token
    number = execution.attempt
    if attempt.cancelled.is_set() and attempt.started is None:
        if attempt.cancel_reason.startswith("stop requested"):
            _finish(attempt, node, clock, STOPPED, from_status=Status.CLAIMED)
        else:
            journal.transition(
                execution.sequence,
                Status.CLAIMED,
                Status.PENDING,
                at=clock.now(),
                token=token,
                node=node,
                attempt=number,
                reason=f"released before start: {attempt.cancel_reason}",
                fields={**journal.released(), "attempt": number - 1},
            )
        return False
    if attempt.started is not None:
        started, now = attempt.started
    else:
        started, now = _port(attempt, node, clock).start(attempt)
    if not started:
        _finish(attempt, node, clock, STOPPED, from_status=Status.CLAIMED)
        return False
    execution.started_at = now
    context = ExecutionContext(
        occurrence_id=str(execution.occurrence_id),
        sequence=execution.sequence,
        attempt=number,
        execution_token=token,
        task_id=execution.task_id,
        params=dict(execution.params),
        trigger_type=execution.trigger_type,
        trigger_source=execution.trigger_source,
    )
    event = TaskEvent(task=task, context=context, cancelled=attempt.cancelled)
    # Cancelled while it waited for this worker (started early), it ends without running.
    last_attempt = number >= execution.max_attempts
    outcome = None
    if not attempt.cancelled.is_set():
        attempt.limit = limits.start(task.handler)
        outcome = call_handler(event, last_attempt=last_attempt)
    if not attempt.handler_returned():
        logger.warning(
            "the handler of %s returned after its attempt was recorded unknown; nothing is written",
            execution.occurrence_id,
        )
        return False
    if outcome is None or attempt.cancelled.is_set():
        if attempt.lease_lost:
            logger.warning("lease lost for %s; the attempt writes nothing more", execution.occurrence_id)
            return False
        reason = attempt.cancel_reason
        if outcome is not None and outcome.status == Status.PENDING and attempt.release:
            _release_resumable(attempt, node, clock)
            return False
        if reason == limits.TIME_LIMIT and attempt.limit is not None:
            outcome = limits.timed_out(attempt.limit)
        else:
            outcome = Outcome(Status.INTERRUPTED, reason, error={"reason": reason, "message": reason})
    follow_up, writer = attempt.follow_up, attempt.journal
    if follow_up is not None and isinstance(writer, HandsOff):
        attempt.handed_off = True
        writer.finish_then(
            attempt,
            outcome,
            Status.RUNNING,
            lambda answer: follow_up(attempt, _after(attempt, answer, outcome, event)),
        )
        return True
    _finish(attempt, node, clock, outcome, from_status=Status.RUNNING, event=event)
    return False


def _release_resumable(attempt: Attempt, node: str, clock: Clock) -> None:
    """running -> pending, the same attempt, for the next claim to resume (its work goes on elsewhere)."""
    execution, token = attempt.claim.execution, attempt.claim.token
    now = clock.now()
    journal.transition(
        execution.sequence,
        Status.RUNNING,
        Status.PENDING,
        at=now,
        token=token,
        node=node,
        attempt=execution.attempt,
        reason=journal.FOLLOW_AFTER_SHUTDOWN,
        fields={**journal.released(), "attempt": execution.attempt - 1, "due_at": now},
    )


def _finish(
    attempt: Attempt,
    node: str,
    clock: Clock,
    outcome: Outcome,
    *,
    from_status: str,
    event: TaskEvent | None = None,
) -> bool:
    answer = _port(attempt, node, clock).finish(attempt, outcome, from_status)
    return _recorded(attempt, answer, outcome, event)


def _after(
    attempt: Attempt, answer: Answer[tuple[Finish, bool, bool]], outcome: Outcome, event: TaskEvent
) -> Callable[[], object] | None:
    """On the writer's thread, once a handed-off outcome's commit is answered: what a worker runs
    after it, or None when nothing does (the log row shared the commit, and no hook, receiver,
    alert or deletion waits for it), which spares a worker's wake-up per execution."""
    try:
        finish, done, log_written = answer.result()
    except Exception:
        return lambda: answer.result()  # raised again on the worker, which logs it
    name = _after_hook(outcome)
    if not (
        done
        and log_written
        and finish.to_status not in alerts.SIGNALS
        and not hook_follows(name, type(attempt.claim.task))
        and not (outcome.status == Status.SUCCESS and attempt.claim.task.delete_after_run)
    ):
        return lambda: _recorded(attempt, (finish, done, log_written), outcome, event)
    _settle(attempt.claim.execution, finish)
    return None


def _settle(execution: Execution, finish: Finish) -> None:
    """The attempt's copy of its execution, as its recorded outcome left the row."""
    execution.status = finish.to_status
    execution.error = finish.fields.get("error", execution.error)


def _after_hook(outcome: Outcome) -> str:
    return "on_task_interrupted" if outcome.status == Status.INTERRUPTED else "on_task_finish"


def _recorded(
    attempt: Attempt, answer: tuple[Finish, bool, bool], outcome: Outcome, event: TaskEvent | None
) -> bool:
    """What follows the commit of an outcome: its log row if it did not share the commit, the
    hooks, ``delete_after_run``; False when the outcome was not recorded."""
    finish, done, log_written = answer
    if not done:
        return False
    execution, task = attempt.claim.execution, attempt.claim.task
    _settle(execution, finish)
    if not log_written:
        logs.write_and_confirm(execution, [finish.log])
    alerts.ended(execution, finish.to_status, finish.now)
    if event is not None:
        event.log = finish.log
        notify(_after_hook(outcome), event)
        if outcome.status == Status.SUCCESS and task.delete_after_run:
            _delete_after_run(task, execution.owner)
    return True


def _delete_after_run(task: Task, node: str) -> None:
    """Delete the task as this attempt read it: matching the revision spares a definition
    updated while the attempt ran. A one-shot task whose instant is still ahead (a run now before
    its run_at) is kept for that run."""
    with transaction.atomic(), audit.acting(node, via=ChangeVia.RUNNER):
        current = Task.objects.select_for_update().filter(id=task.id, revision=task.revision).first()
        if current is not None and (current.run_at is None or current.next_run_at is None):
            audit.record(ChangeAction.DELETE, current, audit.values(current), None)
            current.delete()


def _port(attempt: Attempt, node: str, clock: Clock) -> JournalPort:
    return attempt.journal or DirectJournal(node, clock)
