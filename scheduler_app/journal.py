"""Journal writes: every state change is one conditional UPDATE plus one appended event."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Q

from scheduler_app.models import Execution, ExecutionEvent, LogPersistence, Status

# The lengths of ExecutionEvent.reason and .node: longer texts are cut, never refused.
REASON_LENGTH = 500
# running -> pending without an outcome: a django_task attempt whose enqueued task runs on, to be
# followed by the next claim as the same attempt (no log row: the attempt has not ended).
FOLLOW_AFTER_LEASE = "lease expired while following an enqueued task; will follow it"
FOLLOW_AFTER_SHUTDOWN = "released at shutdown; the next claim follows the enqueued task"
RESUMED = (FOLLOW_AFTER_LEASE, FOLLOW_AFTER_SHUTDOWN)
NODE_LENGTH = 200


def event(
    execution_id: int,
    at: datetime,
    from_status: str,
    to_status: str,
    reason: str,
    *,
    node: str = "",
    attempt: int = 0,
    result: Any = None,
    error: Any = None,
) -> ExecutionEvent:
    """An unsaved event row."""
    return ExecutionEvent(
        execution_id=execution_id,
        at=at,
        from_status=from_status,
        to_status=to_status,
        reason=reason[:REASON_LENGTH],
        node=node[:NODE_LENGTH],
        attempt=attempt,
        result=result,
        error=error,
    )


def append(events: Iterable[ExecutionEvent]) -> None:
    """Insert events with plain multi-row INSERTs: the journal's hottest write skips bulk_create's
    per-object work (no primary keys are read back; nothing reads them)."""
    rows = list(events)
    if not rows:
        return
    connection = connections[router.db_for_write(ExecutionEvent)]
    fields = [f for f in ExecutionEvent._meta.concrete_fields if not f.primary_key]
    table = connection.ops.quote_name(ExecutionEvent._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
    row_sql = f"({', '.join(['%s'] * len(fields))})"
    size = max(1, connection.ops.bulk_batch_size(fields, rows))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            params = [
                f.get_db_prep_save(getattr(row, f.attname), connection) for row in chunk for f in fields
            ]
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {', '.join([row_sql] * len(chunk))}", params
            )


def owned(token: str, *statuses: str) -> Q:
    """The fence: the row still carries this claim's token, in one of ``statuses``.

    Every write after a claim is made under it (transitions, the writer's batches, lease renewal,
    recovery). Its twins: ``holds`` for rows already locked and read, and ``_owned_rows`` in
    ``postgres/batch.py``, in SQL.
    """
    return Q(execution_token=token, status__in=statuses)


def holds(row: tuple[str, str, bool] | None, token: str, *statuses: str, starting: bool = True) -> bool:
    """``owned`` for a row as ``lock_rows`` read it; with ``starting`` (a start, or an outcome that
    registers a result) also no stop requested."""
    if row is None:
        return False
    held_token, status, stop_requested = row
    return held_token == token and status in statuses and not (starting and stop_requested)


def released() -> dict[str, Any]:
    """The fields that give a lease up: no owner, no token, no expiry."""
    return {"owner": "", "execution_token": "", "lease_expires_at": None}


def lock_rows(sequences: Iterable[int]) -> dict[int, tuple[str, str, bool]]:
    """Lock executions in sequence order (so two such transactions never wait on each other in a
    cycle) and read what fencing needs: sequence -> (token, status, stop requested)."""
    locked = (
        Execution.objects.select_for_update()
        .filter(sequence__in=list(sequences))
        .order_by("sequence")
        .values_list("sequence", "execution_token", "status", "stop_requested")
    )
    return {sequence: (token, status, stop) for sequence, token, status, stop in locked}


def transition(
    sequence: int,
    from_status: str,
    to_status: str,
    *,
    at: datetime,
    reason: str,
    token: str | None,
    node: str = "",
    attempt: int = 0,
    fields: dict[str, Any] | None = None,
    extra_filter: dict[str, Any] | None = None,
    result: Any = None,
    error: Any = None,
) -> bool:
    """Move one execution from ``from_status`` to ``to_status`` and append the event.

    With a ``token`` the write is fenced: False (and nothing written) means the
    caller no longer owns the row.
    """
    rows = Execution.objects.filter(sequence=sequence, status=from_status, **(extra_filter or {}))
    if token is not None:
        rows = rows.filter(owned(token, from_status))
    with transaction.atomic(savepoint=False):
        if rows.update(status=to_status, updated_at=at, **(fields or {})) != 1:
            return False
        append(
            [
                event(
                    sequence,
                    at,
                    from_status,
                    to_status,
                    reason,
                    node=node,
                    attempt=attempt,
                    result=result,
                    error=error,
                )
            ]
        )
    return True


def interrupt_pending(
    row: Execution, now: datetime, reason: str, node: str, *, stop_requested: bool = False
) -> ExecutionEvent | None:
    """End a pending execution without running it; returns the event to append, None if it moved on.

    ``stop_requested`` records that an operator asked for it (request_stop), as on leased rows.

    A retry that waited counts as the attempt it prevents, so the failed
    attempt before it keeps its own log row.
    """
    # A released django_task attempt (handler_ref kept, counter restored) ran: it is the one that ends.
    attempt = row.attempt + 1 if row.attempt or row.handler_ref else 0
    error = {"reason": reason.split(":", 1)[0], "message": reason}
    fields = {
        "finished_at": now,
        "error": error,
        "attempt": attempt,
        "started_at": None,
        "log_persistence": LogPersistence.PENDING,
    }
    if stop_requested:
        fields["stop_requested"] = True
    if not Execution.objects.filter(sequence=row.sequence, status=Status.PENDING).update(
        status=Status.INTERRUPTED, updated_at=now, **fields
    ):
        return None
    row.status, row.updated_at, row.finished_at = Status.INTERRUPTED, now, now
    row.error, row.attempt, row.started_at = error, attempt, None
    row.stop_requested = row.stop_requested or stop_requested
    return event(
        row.sequence, now, Status.PENDING, Status.INTERRUPTED, reason, node=node, attempt=attempt, error=error
    )
