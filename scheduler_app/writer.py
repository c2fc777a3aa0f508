"""Group commit: one thread records the starts and outcomes of many attempts in shared transactions.

Workers hand their writes here and wait for the answer. What arrives while a
batch is being written forms the next batch, so under load one transaction
carries many attempts (one fenced UPDATE per kind of move, one INSERT of
events, one of log rows) and an idle runner still answers a lone request at
once. A lone request, and every request of a batch that fails, takes the
one-attempt path of ``attempt``, with its own retries and fallbacks; a batch
writes exactly what those paths would.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError, connections, transaction
from django.db.models import Case, F, Field, Value, When

from scheduler_app import db, journal, logs, pg_batch
from scheduler_app.attempt import Attempt, Finish, Outcome, plan_finish, record_finish, record_start
from scheduler_app.clock import Clock
from scheduler_app.models import Execution, ExecutionEvent, LogPersistence, Status

logger = logging.getLogger("scheduler_app")

MAX_BATCH = 64


@dataclass
class _Request:
    attempt: Attempt
    outcome: Outcome | None = None  # None: a start
    from_status: str = Status.CLAIMED
    answer: Future[Any] = field(default_factory=Future)


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

    def stop(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _submit(self, request: _Request) -> Any:
        self._queue.put(request)
        return request.answer.result()

    def _loop(self) -> None:
        try:
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
        finally:
            connections.close_all()

    def _write(self, batch: list[_Request]) -> None:
        try:
            if db.server_binding():
                # A statement per kind of move; even a lone request saves round trips there.
                groups = [
                    [r for r in batch if r.outcome is None],
                    [r for r in batch if r.outcome is not None],
                ]
                write = write_statement
            else:
                groups = [batch] if len(batch) > 1 else []
                write = write_batch
            for group in groups:
                if not group:
                    continue
                try:
                    answers = write(group, self._node, self._clock.now())
                except (DatabaseError, InterfaceError, ValueError):
                    logger.warning("a batch of %s journal writes failed; writing them one by one", len(group))
                    db.drop_broken_connections()
                else:
                    for request, answer in zip(group, answers, strict=True):
                        request.answer.set_result(answer)
            for request in batch:
                if not request.answer.done():
                    self._write_one(request)
        except BaseException as exc:  # never leave a worker waiting
            for request in batch:
                if not request.answer.done():
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


def start_batch(attempts: list[Attempt], node: str, now: datetime) -> None:
    """claimed -> running for ``attempts`` in the calling thread, in one write; each attempt's
    ``started`` holds its answer. On a database error nothing is written and the attempts stay
    claimed, for their workers to start."""
    requests = [_Request(attempt) for attempt in attempts]
    write = write_statement if db.server_binding() else write_batch
    try:
        answers = write(requests, node, now)
    except (DatabaseError, InterfaceError, ValueError):
        logger.warning(
            "starting %s claimed attempts together failed; their workers start them", len(attempts)
        )
        db.drop_broken_connections()
        return
    for attempt, (started, when) in zip(attempts, answers, strict=True):
        attempt.started = (started, when)


def write_batch(batch: list[_Request], node: str, now: datetime) -> list[tuple[Any, ...]]:
    """Write a batch in one transaction, every move at ``now``; each request's answer, in order."""
    with transaction.atomic():
        current = journal.lock_rows(r.attempt.claim.execution.sequence for r in batch)

        def owned(request: _Request) -> bool:
            claim = request.attempt.claim
            token, status, stop = current.get(claim.execution.sequence, ("", "", True))
            return (
                token == claim.token
                and status == request.from_status
                and not (stop and request.outcome is None)
            )

        starts = [r for r in batch if r.outcome is None and owned(r)]
        finishes = {
            id(r): plan_finish(r.attempt, now, r.outcome, r.from_status)
            for r in batch
            if r.outcome is not None and owned(r)
        }
        events: list[ExecutionEvent] = []
        if starts:
            Execution.objects.filter(
                sequence__in=[r.attempt.claim.execution.sequence for r in starts]
            ).update(status=Status.RUNNING, started_at=now, updated_at=now)
            for r in starts:
                execution = r.attempt.claim.execution
                events.append(
                    journal.event(
                        execution.sequence,
                        now,
                        Status.CLAIMED,
                        Status.RUNNING,
                        "started",
                        node=node,
                        attempt=execution.attempt,
                    )
                )
        if finishes:
            _record_outcomes(list(finishes.values()))
            for finish in finishes.values():
                execution = finish.attempt.claim.execution
                events.append(
                    journal.event(
                        execution.sequence,
                        now,
                        finish.from_status,
                        finish.to_status,
                        finish.reason,
                        node=node,
                        attempt=execution.attempt,
                        result=finish.outcome.result,
                        error=finish.outcome.error,
                    )
                )
        journal.append(events)
    started = {id(r) for r in starts}
    answers: list[tuple[Any, ...]] = []
    for request in batch:
        if request.outcome is None:
            answers.append((id(request) in started, now))
        elif id(request) in finishes:
            finish = finishes[id(request)]
            answers.append((finish, True, finish.log_with_outcome))
        else:
            execution = request.attempt.claim.execution
            logger.warning("lease lost for %s; outcome not recorded", execution.occurrence_id)
            answers.append(
                (plan_finish(request.attempt, now, request.outcome, request.from_status), False, False)
            )
    return answers


def write_statement(batch: list[_Request], node: str, now: datetime) -> list[tuple[Any, ...]]:
    """PostgreSQL: a batch of starts, or of outcomes, in one statement (``pg_batch``); answers as write_batch's."""
    if batch[0].outcome is None:
        started = pg_batch.start([r.attempt for r in batch], node, now)
        return [(r.attempt.claim.execution.sequence in started, now) for r in batch]
    finishes = [plan_finish(r.attempt, now, r.outcome, r.from_status) for r in batch if r.outcome is not None]
    recorded = pg_batch.finish(finishes, node, now)
    answers: list[tuple[Any, ...]] = []
    for finish in finishes:
        execution = finish.attempt.claim.execution
        if execution.sequence in recorded:
            answers.append((finish, True, finish.log_with_outcome))
        else:
            logger.warning("lease lost for %s; outcome not recorded", execution.occurrence_id)
            answers.append((finish, False, False))
    return answers


def _record_outcomes(finishes: list[Finish]) -> None:
    """One UPDATE for all outcomes (rows already locked and owned), and their log rows."""
    logs.write([f.log for f in finishes if f.log_with_outcome])
    columns: dict[str, dict[int, Any]] = defaultdict(dict)
    for f in finishes:
        sequence = f.attempt.claim.execution.sequence
        persistence = LogPersistence.PERSISTED if f.log_with_outcome else LogPersistence.PENDING
        for column, value in {
            **f.fields,
            "status": f.to_status,
            "updated_at": f.now,
            "log_persistence": persistence,
        }.items():
            columns[column][sequence] = value
    sequences = [f.attempt.claim.execution.sequence for f in finishes]
    Execution.objects.filter(sequence__in=sequences).update(
        **{column: _per_row(column, values, len(sequences)) for column, values in columns.items()}
    )


def _per_row(column: str, values: dict[int, Any], rows: int) -> Any:
    """A column's new value per row as one expression; rows without a value keep theirs."""
    output = Execution._meta.get_field(column)
    assert isinstance(output, Field)
    groups: dict[str, tuple[Any, list[int]]] = {}
    for sequence, value in values.items():
        key = json.dumps(value, sort_keys=True, default=str)
        groups.setdefault(key, (value, []))[1].append(sequence)
    if len(groups) == 1 and len(values) == rows:
        ((value, _),) = groups.values()
        return Value(value, output_field=output)
    whens = [
        When(sequence__in=members, then=Value(value, output_field=output))
        for value, members in groups.values()
    ]
    return Case(*whens, default=F(column), output_field=output)
