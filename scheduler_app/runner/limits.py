"""Time limits of attempts: how long a handler may run, the grace it then has to stop, and what is
recorded when it does not.

A handler kind names its limit (``Handler.time_limit``; the ``on_task_execute`` hook's is
HOOK_TIMEOUT). The runner's loop watches each attempt's deadline on its monotonic clock, as it
watches lease deadlines: at the limit it sets the attempt's ``cancelled`` event. A handler that
returns or raises within the grace ends ``failed`` with TIME_LIMIT_EXCEEDED, and the retry policy
applies. A thread cannot be killed, so one that does not return is abandoned: the runner records
the attempt ``unknown`` (fenced by its token, which the move clears) and starts a worker in its
place; when the handler returns at last, its worker writes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import Error as DatabaseLibraryError

from scheduler_app import alerts, db, journal, logs
from scheduler_app.handlers import registry
from scheduler_app.models import Execution, Status
from scheduler_app.runner.clock import Clock
from scheduler_app.runner.recording import DirectJournal, Outcome
from scheduler_app.values import is_number

if TYPE_CHECKING:
    from scheduler_app.runner.attempt import Attempt

logger = logging.getLogger("scheduler_app")

TIME_LIMIT_EXCEEDED = "scheduler:034"
# The cancel reason of an attempt stopped at its limit.
TIME_LIMIT = "time limit exceeded"
# The reason recorded for an attempt whose handler outlived the grace.
DID_NOT_RETURN = "time limit exceeded; the handler did not return"
# A cancelled handler may take this share of its limit to return, at most GRACE_SECONDS: enough
# to stop cleanly, while a short limit is not stretched many times over.
GRACE_SHARE = 0.5
GRACE_SECONDS = 30.0

CANCEL = "cancel"
ABANDON = "abandon"


def grace(seconds: float) -> float:
    """How long a handler cancelled at a limit of ``seconds`` has to return."""
    return min(GRACE_SECONDS, seconds * GRACE_SHARE)


@dataclass
class Limit:
    """One attempt's time limit, on the runner's monotonic clock."""

    seconds: float
    deadline: float
    # When the runner cancelled the attempt at its limit; None until then.
    timed_out_at: float | None = None

    def next_deadline(self) -> float:
        """When the runner next owes the attempt something: its cancellation, then its abandonment."""
        if self.timed_out_at is None:
            return self.deadline
        return self.timed_out_at + grace(self.seconds)


def time_limit(config: dict[str, Any] | None) -> float | None:
    """The seconds a task's handler kind allows one attempt; None for no limit beyond its own."""
    try:
        handler = registry.for_config(config)
        limit = None if handler is None else handler.time_limit(config if config is not None else {})
    except Exception:
        logger.exception("the handler's time limit could not be read; the attempt runs without one")
        return None
    if limit is None:
        return None
    if not is_number(limit) or not limit > 0:
        logger.warning("ignoring the time limit %r: it is not a positive number of seconds", limit)
        return None
    return float(limit)


def start(config: dict[str, Any] | None) -> Limit | None:
    """The limit of an attempt whose handler starts now."""
    seconds = time_limit(config)
    return None if seconds is None else Limit(seconds, time.monotonic() + seconds)


def watched(attempt: Attempt) -> Limit | None:
    """The limit the runner still has to enforce on ``attempt``; None once its handler returned or
    it was abandoned."""
    limit = attempt.limit
    if limit is None or attempt.returned or attempt.abandoned:
        return None
    return limit


def step(attempt: Attempt, now: float) -> str | None:
    """What the runner owes ``attempt`` at monotonic ``now``: CANCEL, ABANDON or nothing."""
    limit = watched(attempt)
    if limit is None or now < limit.next_deadline():
        return None
    return CANCEL if limit.timed_out_at is None else ABANDON


def time_out(attempt: Attempt, now: float) -> None:
    """Cancel an attempt at its limit; its handler sees ``event.cancelled``."""
    assert attempt.limit is not None
    attempt.limit.timed_out_at = now
    execution = attempt.claim.execution
    logger.warning(
        "attempt %s of %s reached its time limit of %gs; cancelled, it has %gs to return",
        execution.attempt,
        execution.occurrence_id,
        attempt.limit.seconds,
        grace(attempt.limit.seconds),
    )
    attempt.cancel(TIME_LIMIT)


def timed_out(limit: Limit) -> Outcome:
    """The outcome of a handler that returned or raised after it was cancelled at its limit."""
    message = f"The attempt ran past its time limit of {limit.seconds:g}s and was cancelled."
    return Outcome(Status.FAILED, "failed", error={"code": TIME_LIMIT_EXCEEDED, "message": message})


def did_not_return(limit: Limit) -> Outcome:
    """The outcome of an abandoned attempt: it may still act, so nobody knows how it ends."""
    message = (
        f"{DID_NOT_RETURN} within {grace(limit.seconds):g}s of being cancelled"
        f" at its time limit of {limit.seconds:g}s; it may still be running"
    )
    return Outcome(Status.UNKNOWN, DID_NOT_RETURN, error={"reason": TIME_LIMIT, "message": message})


def record_unknown(attempt: Attempt, node: str, clock: Clock) -> bool:
    """Record an abandoned attempt ``unknown`` with its log row, fenced by its token.

    True when done: recorded, or the row is no longer this attempt's. False when the database
    failed: the attempt keeps its lease and the runner tries again.
    """
    assert attempt.limit is not None
    execution = attempt.claim.execution
    try:
        finish, recorded, log_written = DirectJournal(node, clock).finish(
            attempt, did_not_return(attempt.limit), Status.RUNNING
        )
        if recorded:
            logger.error(
                "attempt %s of %s did not return within its grace; recorded unknown, its thread is abandoned",
                execution.attempt,
                execution.occurrence_id,
            )
            if not log_written:
                logs.write_and_confirm(execution, [finish.log])
            execution.status, execution.error = Status.UNKNOWN, finish.fields.get("error")
            alerts.ended(execution, Status.UNKNOWN, finish.now)
            return True
        owned = journal.owned(attempt.claim.token, Status.RUNNING)
        return not Execution.objects.filter(owned, sequence=execution.sequence).exists()
    except DatabaseLibraryError:
        db.drop_broken_connections()
        return False
