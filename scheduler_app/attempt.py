"""One attempt, start to finish: claimed -> running -> outcome, every write fenced."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DataError, transaction
from django.db import Error as DatabaseLibraryError

from scheduler_app import db, journal, logs
from scheduler_app.claims import Claim
from scheduler_app.clock import Clock
from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.exceptions import TaskSkipped
from scheduler_app.handlers import registry
from scheduler_app.handlers.base import HandlerError, MissingHandler
from scheduler_app.handlers.hooks import call_hook, notify
from scheduler_app.models import ExecutionLog, LogPersistence, Status, Task
from scheduler_app.storable import storable

logger = logging.getLogger("scheduler_app")

EXECUTION_FAILED = "scheduler:023"
HOOK_FAILED = "scheduler:031"
UNSTORABLE_CODES = {"api": "scheduler:025", "js": "scheduler:024"}
# What the database (or its driver, encoding text) raises for content it cannot store, as opposed
# to a dropped connection or an outage.
CONTENT_ERRORS = (DataError, ValueError)


@dataclass
class Attempt:
    """An attempt in flight on this runner and how to stop it."""

    claim: Claim
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    lease_lost: bool = False
    lease_deadline: float = 0.0
    # Set by threaded runners: starts and outcomes then share commits with other attempts'.
    writer: Any = None
    # (started, when), where the runner started the attempt before a worker took it.
    started: tuple[bool, datetime] | None = None

    def cancel(self, reason: str, *, lease_lost: bool = False) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.lease_lost = lease_lost
            self.cancelled.set()


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str
    result: Any = None
    error: dict[str, str] | None = None
    # False for a failure that stands for a success whose result could not be stored:
    # running the handler again would repeat what it did.
    retryable: bool = True


STOPPED = Outcome(
    Status.INTERRUPTED, "stop requested", error={"reason": "stop requested", "message": "stop requested"}
)


def safe_message(exc: BaseException) -> str:
    """A short message for the journal; database errors never leak their SQL or driver text."""
    if isinstance(exc, DatabaseLibraryError):
        return "A database error occurred in the task."
    text = str(exc)
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def call_handler(event: TaskEvent) -> Outcome:
    """Run the start hook and the handler; map every way out to an Outcome that can be stored."""
    outcome, secrets = _call(event)
    try:
        result, error = storable(outcome.result, secrets), storable(outcome.error, secrets)
    except RecursionError:
        result, error = None, _not_json(event.task.handler)
    return Outcome(outcome.status, outcome.reason, result=result, error=error)


def _call(event: TaskEvent) -> tuple[Outcome, list[str]]:
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
    except HandlerError as exc:
        return Outcome(
            Status.FAILED, "failed", error={"code": exc.code, "message": exc.message[:1000]}
        ), secrets
    except Exception as exc:
        logger.exception("attempt of %s failed", event.context.occurrence_id)
        error = {"code": HOOK_FAILED if config is None else EXECUTION_FAILED, "message": safe_message(exc)}
        return Outcome(Status.FAILED, "failed", error=error), secrets
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return Outcome(Status.FAILED, "failed", error=_not_json(config)), secrets
    return Outcome(Status.SUCCESS, "succeeded", result=result), secrets


def _not_json(config: dict[str, Any] | None) -> dict[str, str]:
    return {"code": HOOK_FAILED if config is None else EXECUTION_FAILED, "message": "The result is not JSON."}


def record_start(attempt: Attempt, node: str, now: datetime) -> bool:
    """claimed -> running, fenced by the token; False when the row moved on or a stop was requested."""
    execution, token = attempt.claim.execution, attempt.claim.token

    def start() -> bool:
        return journal.transition(
            execution.sequence,
            Status.CLAIMED,
            Status.RUNNING,
            at=now,
            token=token,
            node=node,
            attempt=execution.attempt,
            reason="started",
            fields={"started_at": now},
            extra_filter={"stop_requested": False},
        )

    try:
        return start()
    except DatabaseLibraryError:
        # The worker's connection may have been dropped while it sat idle (wait_timeout,
        # idle_session_timeout, a proxy, a failover). Nothing was written: retry once on a
        # fresh connection rather than leave the claim to expire. The write stays fenced.
        db.drop_broken_connections()
        return start()


def run_attempt(attempt: Attempt, node: str, clock: Clock) -> None:
    """Run one claimed attempt; after a lost lease nothing more is written."""
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
                fields={"owner": "", "execution_token": "", "lease_expires_at": None, "attempt": number - 1},
            )
        return
    if attempt.started is not None:
        started, now = attempt.started
    elif attempt.writer is not None:
        started, now = attempt.writer.start(attempt)
    else:
        now = clock.now()
        started = record_start(attempt, node, now)
    if not started:
        _finish(attempt, node, clock, STOPPED, from_status=Status.CLAIMED)
        return
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
    outcome = None if attempt.cancelled.is_set() else call_handler(event)
    if outcome is None or attempt.cancelled.is_set():
        if attempt.lease_lost:
            logger.warning("lease lost for %s; the attempt writes nothing more", execution.occurrence_id)
            return
        reason = attempt.cancel_reason
        outcome = Outcome(Status.INTERRUPTED, reason, error={"reason": reason, "message": reason})
    finished = _finish(attempt, node, clock, outcome, from_status=Status.RUNNING, event=event)
    if finished and outcome.status == Status.SUCCESS and task.delete_after_run:
        # Matching the revision spares a definition updated while the attempt ran.
        Task.objects.filter(id=task.id, revision=task.revision).delete()


@dataclass
class Finish:
    """An outcome ready to record: the fenced move, its journal fields and its log row."""

    attempt: Attempt
    outcome: Outcome
    from_status: str
    to_status: str
    reason: str
    fields: dict[str, Any]
    log: ExecutionLog
    now: datetime
    # On the first attempt with logs beside the journal, the log row shares the outcome's commit.
    log_with_outcome: bool


def plan_finish(attempt: Attempt, now: datetime, outcome: Outcome, from_status: str) -> Finish:
    execution, task = attempt.claim.execution, attempt.claim.task
    number = execution.attempt
    retry = outcome.status == Status.FAILED and outcome.retryable and number < execution.max_attempts
    if retry:
        delay = task.backoff_before(number + 1)
        to_status: str = Status.PENDING
        log_status: str = Status.FAILED
        reason = f"retry in {delay:g}s (attempt {number + 1} of {execution.max_attempts})"
        fields: dict[str, Any] = {
            "due_at": now + timedelta(seconds=delay),
            "owner": "",
            "execution_token": "",
            "lease_expires_at": None,
            "error": outcome.error,
        }
    else:
        to_status = log_status = outcome.status
        reason = outcome.reason
        fields = {
            "finished_at": now,
            "lease_expires_at": None,
            "result": outcome.result,
            "error": outcome.error,
        }
    started_at = execution.started_at if from_status == Status.RUNNING else None
    log = logs.build_log(
        execution, task.name, number, log_status, started_at, now, outcome.result, outcome.error
    )
    return Finish(
        attempt,
        outcome,
        from_status,
        to_status,
        reason,
        fields,
        log,
        now,
        log_with_outcome=number == 1 and logs.log_alias() == DEFAULT_DB_ALIAS,
    )


def record_finish(finish: Finish, node: str) -> tuple[Finish, bool, bool]:
    """Record one outcome, fenced; (what was recorded, recorded, log row written with it).

    If the log write fails, the outcome is recorded alone. If the database refuses the
    outcome's content, a clean failure (``unstorable``) is recorded in its place at once,
    rather than leaving the attempt running until its lease expires.
    """
    execution, token = finish.attempt.claim.execution, finish.attempt.claim.token

    def record(finish: Finish, with_log: bool) -> bool:
        with transaction.atomic():
            if with_log:
                logs.write([finish.log])
            persistence = LogPersistence.PERSISTED if with_log else LogPersistence.PENDING
            moved = journal.transition(
                execution.sequence,
                finish.from_status,
                finish.to_status,
                at=finish.now,
                token=token,
                node=node,
                attempt=execution.attempt,
                reason=finish.reason,
                fields={**finish.fields, "log_persistence": persistence},
                result=finish.outcome.result,
                error=finish.outcome.error,
            )
            if not moved:
                transaction.set_rollback(True)
        return moved

    log_written = finish.log_with_outcome
    try:
        try:
            moved = record(finish, log_written)
        except CONTENT_ERRORS:
            raise
        except DatabaseLibraryError:
            # The log row may have been refused, or the connection dropped while it sat idle
            # (MySQL's rollback does not notice): retry the outcome alone on a fresh connection.
            logger.warning("could not write the outcome of %s; retrying it alone", execution.occurrence_id)
            db.drop_broken_connections()
            log_written = False
            moved = record(finish, False)
    except CONTENT_ERRORS:
        logger.warning("the database refused the outcome of %s; recording a failure", execution.occurrence_id)
        db.drop_broken_connections()
        finish = plan_finish(finish.attempt, finish.now, unstorable(finish), finish.from_status)
        log_written = False
        try:
            moved = record(finish, False)
        except (DatabaseLibraryError, ValueError):
            logger.warning(
                "could not record the outcome of %s; its lease will expire", execution.occurrence_id
            )
            return finish, False, False
    except DatabaseLibraryError:
        logger.warning("could not record the outcome of %s; its lease will expire", execution.occurrence_id)
        return finish, False, False
    if not moved:
        logger.warning("lease lost for %s; outcome not recorded", execution.occurrence_id)
    return finish, moved, log_written


def unstorable(finish: Finish) -> Outcome:
    """What is recorded for an outcome the database refused: a failure with its kind's code, never retried
    when it stands for a success (the handler's effects happened)."""
    config = finish.attempt.claim.task.handler
    kind = config.get("kind") if isinstance(config, dict) else None
    code = UNSTORABLE_CODES.get(str(kind), EXECUTION_FAILED)
    error = {"code": code, "message": "The database refused the outcome; it was not stored."}
    outcome = finish.outcome
    if outcome.status == Status.INTERRUPTED:
        return Outcome(Status.INTERRUPTED, outcome.reason, error={"reason": outcome.reason, **error})
    return Outcome(Status.FAILED, "failed", error=error, retryable=outcome.status == Status.FAILED)


def _finish(
    attempt: Attempt,
    node: str,
    clock: Clock,
    outcome: Outcome,
    *,
    from_status: str,
    event: TaskEvent | None = None,
) -> bool:
    execution = attempt.claim.execution
    if attempt.writer is not None:
        finish, done, log_written = attempt.writer.finish(attempt, outcome, from_status)
    else:
        finish, done, log_written = record_finish(
            plan_finish(attempt, clock.now(), outcome, from_status), node
        )
    if not done:
        return False
    execution.status = finish.to_status
    if not log_written:
        logs.write_and_confirm(execution, [finish.log])
    if event is not None:
        event.log = finish.log
        notify("on_task_interrupted" if outcome.status == Status.INTERRUPTED else "on_task_finish", event)
    return True
