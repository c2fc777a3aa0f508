"""Lists of the journal for people and programs: keyset pages of executions, and the operator's
lists (unknown executions, log failures) by limit and offset."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.models import ENDED, UNLOGGED, Execution, Status, TriggerType

MAX_LIMIT = 100
DEFAULT_LIMIT = 50
# The operator's lists are short; an offset past this is a mistake, and past 2**63 one no database takes.
MAX_OFFSET = 1_000_000
MAX_SEQUENCE = 2**63 - 1
CURSOR_PREFIX = "before:"

Row = TypeVar("Row", bound=Model)


@dataclass(frozen=True)
class ExecutionPage:
    """One page of ``scheduler.executions.list``: newest first; ``next_cursor`` asks for the next
    page, None on the last."""

    results: list[Execution]
    next_cursor: str | None


def unknown() -> QuerySet[Execution]:
    """Executions waiting for an operator, the oldest change first."""
    return Execution.objects.filter(status=Status.UNKNOWN).order_by("updated_at", "sequence")


def log_failures() -> QuerySet[Execution]:
    """Ended and unknown executions whose log rows are not confirmed written, the oldest change first."""
    return Execution.objects.filter(status__in=ENDED, log_persistence__in=UNLOGGED).order_by(
        "updated_at", "sequence"
    )


def window(rows: QuerySet[Row], limit: Any, offset: Any, what: str = "execution") -> list[Row]:
    """``limit`` rows (1 to MAX_LIMIT) after the first ``offset``; ``what`` names the query in
    the error."""
    errors = _limit_errors(limit)
    if not _is_int(offset) or not 0 <= offset <= MAX_OFFSET:
        errors["offset"] = [f"Must be an integer from 0 to {MAX_OFFSET}."]
    if errors:
        raise InvalidDefinition(f"The {what} query is invalid.", errors=errors)
    return list(rows[offset : offset + limit])


def page(
    *,
    task_id: Any = None,
    status: Any = None,
    trigger_type: Any = None,
    due_after: Any = None,
    due_before: Any = None,
    limit: Any = DEFAULT_LIMIT,
    cursor: Any = None,
) -> ExecutionPage:
    """Executions matching every filter given, newest (highest sequence) first, ``limit`` at a time;
    each page starts where the cursor of the one before ended, so rows added meanwhile never
    shift a page."""
    errors = _limit_errors(limit)
    if task_id is not None and (not isinstance(task_id, str) or len(task_id) > 128):
        errors["task_id"] = ["Must be a task id (text of at most 128 characters)."]
    errors.update(filter_errors(status, trigger_type, due_after=due_after, due_before=due_before))
    before = None
    if cursor is not None:
        before = _sequence(cursor)
        if before is None:
            errors["cursor"] = ["Must be a cursor given by an earlier page, unchanged."]
    if errors:
        raise InvalidDefinition("The execution query is invalid.", errors=errors)
    filters = {
        "task_id": task_id,
        "status": status,
        "trigger_type": trigger_type,
        "due_at__gte": due_after,
        "due_at__lt": due_before,
        "sequence__lt": before,
    }
    rows = Execution.objects.filter(**{key: value for key, value in filters.items() if value is not None})
    found = list(rows.order_by("-sequence")[: limit + 1])
    more = len(found) > limit
    results = found[:limit]
    return ExecutionPage(results, _cursor(results[-1].sequence) if more else None)


def filter_errors(status: Any, trigger_type: Any, **instants: Any) -> dict[str, list[str]]:
    """What is wrong with the filters the journal's and the logs' lists share, by field."""
    errors: dict[str, list[str]] = {}
    if status is not None and status not in Status.values:
        errors["status"] = [f"Must be one of: {', '.join(Status.values)}."]
    if trigger_type is not None and trigger_type not in TriggerType.values:
        errors["trigger_type"] = [f"Must be one of: {', '.join(TriggerType.values)}."]
    for name, value in instants.items():
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            errors[name] = ["Must be a timezone-aware datetime."]
    return errors


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _limit_errors(limit: Any) -> dict[str, list[str]]:
    if not _is_int(limit) or not 1 <= limit <= MAX_LIMIT:
        return {"limit": [f"Must be an integer from 1 to {MAX_LIMIT}."]}
    return {}


def _cursor(sequence: int) -> str:
    return base64.urlsafe_b64encode(f"{CURSOR_PREFIX}{sequence}".encode()).decode().rstrip("=")


def _sequence(cursor: Any) -> int | None:
    """The sequence a cursor of ``_cursor`` holds; None for anything else."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= 64:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    number = text.removeprefix(CURSOR_PREFIX)
    if not text.startswith(CURSOR_PREFIX) or not number.isascii() or not number.isdigit() or len(number) > 19:
        return None
    sequence = int(number)
    return sequence if sequence <= MAX_SEQUENCE else None
