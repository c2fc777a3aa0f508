"""How an attempt's start and outcome reach the journal: the port an Attempt holds, the planned
finish, and the direct journal (inline runs, and the writer's fallback for one attempt)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from django.db import DEFAULT_DB_ALIAS, DataError, transaction
from django.db import Error as DatabaseLibraryError

from scheduler_app import db, journal, logs
from scheduler_app.models import Execution, ExecutionLog, LogPersistence, Status
from scheduler_app.runner.clock import Clock

if TYPE_CHECKING:
    from scheduler_app.runner.attempt import Attempt

logger = logging.getLogger("scheduler_app")

EXECUTION_FAILED = "scheduler:023"
UNSTORABLE_CODES = {"api": "scheduler:025", "js": "scheduler:024"}
# What the database (or its driver, encoding text) raises for content it cannot store, as opposed
# to a dropped connection or an outage.
CONTENT_ERRORS = (DataError, ValueError)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as it is recorded."""

    status: str
    reason: str
    result: Any = None
    error: dict[str, str] | None = None
    # False for a failure that stands for a success whose result could not be stored:
    # running the handler again would repeat what it did.
    retryable: bool = True


T_co = TypeVar("T_co", covariant=True)


class Answer(Protocol[T_co]):
    """What a write came to: its value, or the exception it raised."""

    def result(self) -> T_co: ...


class JournalPort(Protocol):
    """Where an attempt records its start and its outcome, fenced by its token."""

    def start(self, attempt: Attempt) -> tuple[bool, datetime]:
        """claimed -> running; (started, when). False: the row moved on or a stop was requested."""
        ...

    def finish(self, attempt: Attempt, outcome: Outcome, from_status: str) -> tuple[Finish, bool, bool]:
        """Record an outcome; (what was recorded, recorded, log row written with it)."""
        ...


@runtime_checkable
class HandsOff(Protocol):
    """A journal that records outcomes without making the caller wait (the runner's writer)."""

    def finish_then(
        self,
        attempt: Attempt,
        outcome: Outcome,
        from_status: str,
        then: Callable[[Answer[tuple[Finish, bool, bool]]], None],
    ) -> None:
        """Record an outcome without waiting for it: ``then`` gets the answer of ``finish``, once known."""
        ...


class DirectJournal:
    """Each start and outcome in a transaction of its own, on the calling thread's connection."""

    def __init__(self, node: str, clock: Clock) -> None:
        self.node = node
        self.clock = clock

    def start(self, attempt: Attempt) -> tuple[bool, datetime]:
        now = self.clock.now()
        return record_start(attempt, self.node, now), now

    def finish(self, attempt: Attempt, outcome: Outcome, from_status: str) -> tuple[Finish, bool, bool]:
        return record_finish(plan_finish(attempt, self.clock.now(), outcome, from_status), self.node)


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

    def columns(self, *, with_log: bool | None = None) -> dict[str, Any]:
        """Every column the finish writes, with the log-persistence flag that says whether its log row
        shares the commit (``with_log``, by default as planned). The one definition of a finish's
        write: the direct journal, the ORM batch and the PostgreSQL batch all take it from here."""
        shared = self.log_with_outcome if with_log is None else with_log
        return {
            **self.fields,
            "status": self.to_status,
            "updated_at": self.now,
            "log_persistence": LogPersistence.PERSISTED if shared else LogPersistence.PENDING,
        }


# What a stop request leaves: no result is registered once it is committed (docs/operations.md).
STOPPED = Outcome(
    Status.INTERRUPTED, "stop requested", error={"reason": "stop requested", "message": "stop requested"}
)


# Outcomes that stand whatever a stop request says (registers_result).
NO_RESULT = (Status.INTERRUPTED, Status.UNKNOWN)


def registers_result(finish: Finish) -> bool:
    """Whether a stop request committed before this outcome turns it into STOPPED: every outcome but
    an interruption (which registers no result) and unknown (a handler that may still run: saying it
    stopped would be a guess)."""
    return finish.outcome.status not in NO_RESULT


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
            **journal.released(),
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
        if to_status == Status.UNKNOWN:
            # Nobody owns an attempt of unknown outcome: clearing its token fences out a late write.
            fields.update(journal.released())
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
            columns = finish.columns(with_log=with_log)
            del columns["status"], columns["updated_at"]  # transition writes them
            moved = journal.transition(
                execution.sequence,
                finish.from_status,
                finish.to_status,
                at=finish.now,
                token=token,
                node=node,
                attempt=execution.attempt,
                reason=finish.reason,
                fields=columns,
                extra_filter={"stop_requested": False} if registers_result(finish) else None,
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
        try:
            moved = record(finish, False)
        except (DatabaseLibraryError, ValueError):
            moved = None
    except DatabaseLibraryError:
        moved = None
    if (
        moved is False
        and registers_result(finish)
        and _stop_requested(execution.sequence, token, finish.from_status)
    ):
        # An operator asked for a stop before this outcome arrived: it is not registered.
        finish = plan_finish(finish.attempt, finish.now, STOPPED, finish.from_status)
        try:
            moved = record(finish, log_written)
        except DatabaseLibraryError:
            moved = None
    if moved is None:
        logger.warning("could not record the outcome of %s; its lease will expire", execution.occurrence_id)
        return finish, False, False
    if not moved:
        logger.warning("lease lost for %s; outcome not recorded", execution.occurrence_id)
    return finish, moved, log_written and moved


def _stop_requested(sequence: int, token: str, status: str) -> bool:
    """Whether the row is still this attempt's and an operator asked for a stop."""
    return Execution.objects.filter(
        journal.owned(token, status), sequence=sequence, stop_requested=True
    ).exists()


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
