"""Group commit: one thread records the starts and outcomes of many attempts in shared transactions.

Workers hand their writes here and wait for the answer, or, for an outcome, hand it on and go
on to their next attempt (``finish_then``). What arrives while a
batch is being written forms the next batch, so under load one write carries
the starts, or the outcomes, of many attempts (``Statements.start_batch`` and
``finish_batch``: a transaction of a few statements on the ORM, one statement
on PostgreSQL) and an idle runner still answers a lone request at once. A lone
request (where the statements do not batch one), and every request of a batch
that fails, takes the one-attempt path of ``recording``, with its own retries
and fallbacks; a batch writes exactly what those paths would.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from scheduler_app import db
from scheduler_app.models import Status
from scheduler_app.runner.attempt import Attempt
from scheduler_app.runner.clock import Clock
from scheduler_app.runner.recording import Answer, Finish, Outcome, plan_finish, record_finish, record_start
from scheduler_app.statements import Statements, journal_statements

logger = logging.getLogger("scheduler_app")

MAX_BATCH = 64


class _Answer:
    """The answer to one request, given once by the writer thread: waited for on a lock, or handed
    to a callback on the writer's thread. concurrent.futures' Future does both with a condition
    and its reentrant lock per request, which cost a tenth of a busy runner's Python."""

    __slots__ = ("_error", "_given", "_then", "_value", "done")

    def __init__(self, then: Callable[[Answer[Any]], None] | None = None) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._then = then
        # Held until the answer is given: the waiter's acquire returns then.
        self._given: threading.Lock | None = None
        if then is None:
            self._given = threading.Lock()
            self._given.acquire()
        self.done = False

    def set_result(self, value: Any) -> None:
        self._value = value
        self._give()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._give()

    def result(self) -> Any:
        assert self.done or self._given is not None, "a callback's answer is read once given"
        if self._given is not None and not self.done:
            with self._given:
                pass
        if self._error is not None:
            raise self._error
        return self._value

    def _give(self) -> None:
        self.done = True
        if self._given is not None:
            self._given.release()
        elif self._then is not None:
            try:
                self._then(self)
            except Exception:  # as a Future's callback: logged, never the writer's failure
                logger.exception("handing on a journal write's answer failed")


@dataclass
class _Request:
    attempt: Attempt
    outcome: Outcome | None = None  # None: a start
    from_status: str = Status.CLAIMED
    answer: _Answer = field(default_factory=_Answer)


class JournalWriter:
    """The runner's writer thread; ``start`` and ``finish`` block the calling worker until committed."""

    def __init__(self, node: str, clock: Clock) -> None:
        self._node = node
        self._clock = clock
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="scheduler-writer", daemon=True)
        self._thread.start()

    def now(self) -> datetime:
        return self._clock.now()

    def start(self, attempt: Attempt) -> tuple[bool, datetime]:
        """claimed -> running; (started, when)."""
        result: tuple[bool, datetime] = self._submit(_Request(attempt))
        return result

    def finish(self, attempt: Attempt, outcome: Outcome, from_status: str) -> tuple[Finish, bool, bool]:
        """Record an outcome at the time of its commit; (what was recorded, recorded, log row written with it)."""
        result: tuple[Finish, bool, bool] = self._submit(_Request(attempt, outcome, from_status))
        return result

    def finish_then(
        self,
        attempt: Attempt,
        outcome: Outcome,
        from_status: str,
        then: Callable[[Answer[tuple[Finish, bool, bool]]], None],
    ) -> None:
        """Queue an outcome and return at once; ``then`` runs on this thread once it is committed
        (or failed), so it must only hand the answer on."""
        self._queue.put(_Request(attempt, outcome, from_status, _Answer(then)))

    def stop(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _submit(self, request: _Request) -> Any:
        self._queue.put(request)
        return request.answer.result()

    def _loop(self) -> None:
        try:
            with journal_statements().kept_plans():
                self._drain()
        finally:
            connections.close_all()

    def _drain(self) -> None:
        """Write what the queue holds, in batches, until it says to stop."""
        while (first := self._queue.get()) is not None:
            batch = [first]
            stopping = False
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._write(batch)
            if stopping:
                break

    def _write(self, batch: list[_Request]) -> None:
        try:
            statements = journal_statements()
            groups = [
                [r for r in batch if r.outcome is None],
                [r for r in batch if r.outcome is not None],
            ]
            if len(batch) > 1 or statements.lone_batches:
                for group in groups:
                    if not group:
                        continue
                    try:
                        answers = write_group(statements, group, self._node, self._clock.now())
                    except (DatabaseError, InterfaceError, ValueError):
                        logger.warning(
                            "a batch of %s journal writes failed; writing them one by one", len(group)
                        )
                        db.drop_broken_connections()
                    else:
                        for request, answer in zip(group, answers, strict=True):
                            request.answer.set_result(answer)
            for request in batch:
                if not request.answer.done:
                    self._write_one(request)
        except BaseException as exc:  # never leave a worker waiting
            for request in batch:
                if not request.answer.done:
                    request.answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    def _write_one(self, request: _Request) -> None:
        try:
            now = self._clock.now()
            if request.outcome is None:
                request.answer.set_result((record_start(request.attempt, self._node, now), now))
            else:
                finish = plan_finish(request.attempt, now, request.outcome, request.from_status)
                request.answer.set_result(record_finish(finish, self._node))
        except Exception as exc:
            request.answer.set_exception(exc)
        finally:
            db.drop_broken_connections()


def write_group(
    statements: Statements, group: list[_Request], node: str, now: datetime
) -> list[tuple[Any, ...]]:
    """A group of starts, or of outcomes, in one batch of the statements, every move at ``now``;
    each request's answer, in order, as the one-attempt path would give it."""
    if group[0].outcome is None:
        started = statements.start_batch([r.attempt.claim for r in group], node, now)
        return [(r.attempt.claim.execution.sequence in started, now) for r in group]
    finishes = [plan_finish(r.attempt, now, r.outcome, r.from_status) for r in group if r.outcome is not None]
    recorded = statements.finish_batch(finishes, node, now)
    answers: list[tuple[Any, ...]] = []
    for finish in finishes:
        if finish.attempt.claim.execution.sequence in recorded:
            answers.append((finish, True, finish.log_with_outcome))
        else:
            # A lost lease, or a stop requested before the outcome: the one-attempt path tells
            # them apart and records the stop.
            answers.append(record_finish(finish, node))
    return answers
