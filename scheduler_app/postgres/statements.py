"""The journal's statements on PostgreSQL through psycopg 3: fixed texts with server-bound parameters."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from scheduler_app.models import Execution, Task
from scheduler_app.postgres import batch, binding, claims, notify, scheduled, trigger
from scheduler_app.statements.orm import Statements

if TYPE_CHECKING:
    from scheduler_app.runner.claims import Claim
    from scheduler_app.runner.recording import Finish


class PostgresStatements(Statements):
    """Each method does what the ORM's does (tests run both), in one statement where that has several."""

    lone_batches = True

    def wake_ups(self) -> Any:
        return notify if notify.available() else None

    def estimated_rows(self, connection: Any, table: str) -> int | None:
        """reltuples: -1 for a table never vacuumed nor analyzed."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table])
            found = cursor.fetchone()
        return int(found[0]) if found and found[0] >= 0 else None

    @contextmanager
    def kept_plans(self) -> Iterator[None]:
        with binding.kept_plans():
            yield

    @contextmanager
    def cursor(self, connection: Any) -> Iterator[Any]:
        with binding.bound_cursor(connection) as cursor:
            yield cursor

    def candidates(self, now: datetime, limit: int) -> list[Execution]:
        return claims.candidates(now, limit)

    def lock_tasks(self, task_ids: set[str]) -> dict[str, Task]:
        return claims.lock_tasks(task_ids)

    def busy(self, task_ids: Iterable[str]) -> dict[str, int]:
        return claims.busy(task_ids)

    def take(
        self,
        chosen: list[tuple[Execution, Task]],
        now: datetime,
        node: str,
        lease_until: datetime,
        *,
        start: int = 0,
    ) -> list[tuple[Execution, Task]]:
        return claims.take(chosen, now, node, lease_until, start=start)

    def start_batch(self, claimed: Sequence[Claim], node: str, now: datetime) -> set[int]:
        return batch.start(claimed, node, now)

    def finish_batch(self, finishes: Sequence[Finish], node: str, now: datetime) -> set[int]:
        return batch.finish(finishes, node, now)

    def move_next_runs(self, tasks: Sequence[Task]) -> None:
        scheduled.move_next_runs(tasks)

    def insert_scheduled(
        self, rows: Sequence[tuple[Execution, str]], node: str, now: datetime
    ) -> list[Execution]:
        return scheduled.insert(rows, node, now)

    def insert_manual(
        self, execution: Execution, caller_params: dict[str, Any], reason: str, now: datetime, wake: bool
    ) -> bool:
        return trigger.insert_manual(execution, caller_params, reason, now, wake)

    def insert_manual_many(
        self,
        task_id: str,
        source: str,
        planned: list[Execution],
        keyed: list[Any],
        reason: str,
        now: datetime,
    ) -> tuple[list[Execution], list[Any]] | None:
        return trigger.insert_manual_many(task_id, source, planned, keyed, reason, now)


POSTGRES = PostgresStatements()
