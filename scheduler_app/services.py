"""The public Python API: definitions, triggers, logs and execution repairs.

Every write happens here, in its own transaction; admin actions, API views and
the management command call these functions and hold no business logic.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, OperationalError, transaction
from django.utils import timezone

from scheduler_app import (
    audit,
    backfill,
    cron,
    database_errors,
    declarations,
    definitions,
    journal,
    listing,
    logs,
    occurrences,
    schedule,
    wakeup,
)
from scheduler_app.conf import scheduler_settings
from scheduler_app.exceptions import (
    Conflict,
    ExecutionNotFound,
    InvalidDefinition,
    InvalidState,
    SchedulerError,
    StorageError,
    TaskAlreadyExists,
    TaskDeclared,
    TaskNotFound,
)
from scheduler_app.models import (
    BACKFILL_SOURCE,
    LEASED,
    NO_LONGER_DECLARED,
    NOT_PAUSED,
    TERMINAL,
    ChangeAction,
    ChangeVia,
    DeclaredIn,
    Execution,
    ExecutionLog,
    LogPersistence,
    Status,
    Task,
    TaskChange,
    manual_occurrence_id,
)
from scheduler_app.statements import journal_statements
from scheduler_app.triggers import KEY_REUSED, Trigger, create_many, payload_hash

logger = logging.getLogger("scheduler_app")

MAX_PAGE_SIZE = 500
# get_logs counts the matching rows at most this far past the page's first one: an exact COUNT over
# millions of log rows took 140 ms (bench/scale.py), longer than reading the page.
LOG_COUNT_AHEAD = 10_000
DEFAULT_NEXT_RUNS = 10
# The furthest a trigger may be put off (delay, or run_at from now): a year.
MAX_DELAY_SECONDS = 366 * 86400
# The most a pause's reason holds: the task's disabled_reason.
MAX_REASON_LENGTH = 200
MAX_NEXT_RUNS = 100
# The most triggers one trigger_many() call takes.
MAX_TRIGGERS = 10_000
TRIGGER_KEYS = frozenset({"idempotency_key", "params"})
RESOLVABLE = (Status.SUCCESS, Status.DISCARDED)


@contextmanager
def storage_errors() -> Iterator[None]:
    """Turn database failures into StorageError with a generic message."""
    try:
        yield
    except SchedulerError:
        raise
    except DatabaseError as exc:
        raise StorageError() from exc


@dataclass(frozen=True)
class LogPage:
    """One page of get_logs results. ``count`` is the number of matching rows when ``count_exact``;
    otherwise there are more than that (counting stopped LOG_COUNT_AHEAD rows past the page's start)."""

    results: list[ExecutionLog]
    count: int
    page: int
    page_size: int
    count_exact: bool = True

    @property
    def has_next(self) -> bool:
        return not self.count_exact or self.page * self.page_size < self.count


def _check_resolvable(execution: Execution, expected_updated_at: datetime) -> None:
    """A caller who read an older version gets Conflict (reload), even if the row is no longer unknown."""
    if execution.updated_at != expected_updated_at:
        raise Conflict("The execution changed since it was read; reload and try again.")
    if execution.status != Status.UNKNOWN:
        raise InvalidState("Only executions in state unknown can be resolved.")


# How many moves of an execution a stop request follows before it gives up (InvalidState).
MOVES_FOLLOWED = 3


class Executions:
    """Operations on the execution journal: ``scheduler.executions``."""

    def get(self, occurrence_id: Any) -> Execution:
        with storage_errors():
            try:
                return Execution.objects.get(occurrence_id=_uuid(occurrence_id))
            except Execution.DoesNotExist:
                raise ExecutionNotFound() from None

    def list(
        self,
        *,
        task_id: str | None = None,
        status: str | None = None,
        trigger_type: str | None = None,
        due_after: datetime | None = None,
        due_before: datetime | None = None,
        limit: int = listing.DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> listing.ExecutionPage:
        """Executions matching every filter given, newest first, one page of ``limit`` (1 to 100)
        at a time: pass the page's ``next_cursor`` as ``cursor`` for the next one."""
        with storage_errors():
            return listing.page(
                task_id=task_id,
                status=status,
                trigger_type=trigger_type,
                due_after=due_after,
                due_before=due_before,
                limit=limit,
                cursor=cursor,
            )

    def list_unknown(self, limit: int = listing.DEFAULT_LIMIT, offset: int = 0) -> builtins.list[Execution]:
        """Executions in state unknown, the oldest change first: the ones waiting for an operator."""
        with storage_errors():
            return listing.window(listing.unknown(), limit, offset)

    def list_log_failures(
        self, limit: int = listing.DEFAULT_LIMIT, offset: int = 0
    ) -> builtins.list[Execution]:
        """Ended and unknown executions whose log rows are not confirmed written, the oldest change first."""
        with storage_errors():
            return listing.window(listing.log_failures(), limit, offset)

    def repair_log(self, occurrence_id: Any) -> builtins.list[ExecutionLog]:
        """Rebuild the log rows of one execution from its journal."""
        execution = self.get(occurrence_id)
        try:
            return logs.repair(execution.occurrence_id)
        except DatabaseError as exc:
            with storage_errors():
                Execution.objects.filter(sequence=execution.sequence).update(
                    log_persistence=LogPersistence.UNCONFIRMED
                )
            raise StorageError("The log rows could not be rebuilt.") from exc

    def resolve_unknown(
        self, occurrence_id: Any, status: str, expected_updated_at: datetime, *, by: str = ""
    ) -> Execution:
        """Settle an unknown execution as success or discarded (compare-and-set on updated_at)."""
        if status not in RESOLVABLE:
            raise InvalidDefinition(
                "The resolution is invalid.", errors={"status": ["Must be success or discarded."]}
            )
        if not isinstance(expected_updated_at, datetime):
            raise InvalidDefinition(
                "The resolution is invalid.", errors={"expected_updated_at": ["Must be a datetime."]}
            )
        execution = self.get(occurrence_id)
        _check_resolvable(execution, expected_updated_at)
        now = timezone.now()
        reason = f"resolved as {status}" + (f" by {by}" if by else "")
        with storage_errors():
            done = journal.transition(
                execution.sequence,
                Status.UNKNOWN,
                status,
                at=now,
                reason=reason,
                token=None,
                node=by,
                attempt=execution.attempt,
                fields={"log_persistence": LogPersistence.PENDING},
                extra_filter={"updated_at": expected_updated_at},
            )
        if not done:
            _check_resolvable(self.get(occurrence_id), expected_updated_at)
        _refresh_logs(execution.occurrence_id)
        return self.get(occurrence_id)

    def request_stop(self, occurrence_id: Any, *, by: str = "") -> Execution:
        """Stop an execution: a pending one ends now, a claimed or running one within about a tick
        (its runner reads the flag at each tick). InvalidState once it has ended."""
        now = timezone.now()
        reason = "stop requested" + (f": by {by}" if by else "")
        with storage_errors():
            # An execution can move between the read and the write (its outcome committed, its
            # failed attempt went back to pending for a retry): read it again and act on its state.
            for _ in range(MOVES_FOLLOWED):
                execution = self.get(occurrence_id)
                if execution.status == Status.PENDING:
                    with transaction.atomic():
                        event = journal.interrupt_pending(execution, now, reason, by, stop_requested=True)
                        if event is not None:
                            journal.append([event])
                    if event is not None:
                        _refresh_logs(execution.occurrence_id)
                        return self.get(occurrence_id)
                elif execution.status in LEASED:
                    flagged = Execution.objects.filter(sequence=execution.sequence, status__in=LEASED).update(
                        stop_requested=True, updated_at=now
                    )
                    if flagged:
                        return self.get(occurrence_id)
                else:
                    break
        raise InvalidState("Only pending, claimed or running executions can be stopped.")


class Scheduler:
    """``from scheduler_app import scheduler``: the whole public Python API."""

    def __init__(self) -> None:
        self.executions = Executions()

    # -- definitions ------------------------------------------------------------

    def register(self, definition: dict[str, Any]) -> Task:
        task = Task(**definitions.validate_definition(definition))
        task.next_run_at = _next_run(task)
        with storage_errors():
            try:
                with transaction.atomic():
                    task.save(force_insert=True)
                    audit.record(ChangeAction.CREATE, task, None, audit.values(task))
            except IntegrityError:
                raise TaskAlreadyExists() from None
        return task

    def update_task(self, task_id: str, **changes: Any) -> Task:
        data = dict(changes)
        with storage_errors(), transaction.atomic():
            try:
                task = Task.objects.select_for_update().get(id=task_id)
            except Task.DoesNotExist:
                raise TaskNotFound() from None
            if "timezone" in data and "cron" not in data:
                data["cron"] = task.cron
            values = definitions.validate_changes(data)
            # A cleared expression (a switch to run_at) is checked with the whole schedule below.
            if values.get("cron") and "timezone" not in changes:
                definitions.raise_if_errors(_cron_errors(values["cron"], task.timezone))
            values = _one_schedule(task, changes, values)
            _refuse_declared(task, values)
            _apply(task, values, ChangeAction.UPDATE)
        return task

    def pause(self, task_id: str, reason: str | None = "", until: datetime | None = None) -> Task:
        """Disable a task, saying why (at most 200 characters) and, optionally, until when: a
        runner enables it again at ``until`` (aware, in the future, at most 366 days ahead).
        Pausing a paused task changes its reason and until."""
        reason = "" if reason is None else reason
        errors = pause_errors(reason, until)
        if errors:
            raise InvalidDefinition("The pause is invalid.", errors=errors)
        with storage_errors(), transaction.atomic():
            task = _locked(task_id)
            if task.disabled_reason == NO_LONGER_DECLARED:
                raise InvalidState(
                    f"Task {task.id!r} is disabled because its declaration is gone: "
                    "declare it again, resume it or delete it."
                )
            _apply(
                task,
                {"enabled": False, "disabled_reason": reason, "disabled_until": until},
                ChangeAction.UPDATE,
            )
        return task

    def resume(self, task_id: str) -> Task:
        """Enable a paused (disabled) task: its schedule goes on from the next fire time after now,
        the minutes of the pause neither run nor count as missed. Nothing for an enabled task."""
        with storage_errors(), transaction.atomic():
            task = _locked(task_id)
            _apply(task, {"enabled": True}, ChangeAction.UPDATE)
        return task

    def replace_task(self, task_id: str, definition: Any) -> Task:
        """Make a task match a whole definition (REST PUT): fields it leaves out take their defaults."""
        if isinstance(definition, dict) and definition.get("id", task_id) != task_id:
            raise InvalidDefinition(errors={"id": ["Must be the id of the task being replaced."]})
        with storage_errors(), transaction.atomic():
            try:
                task = Task.objects.select_for_update().get(id=task_id)
            except Task.DoesNotExist:
                raise TaskNotFound() from None
            data = {**definition, "id": task_id} if isinstance(definition, dict) else definition
            wanted = Task(**definitions.validate_definition(data))
            values = {field: getattr(wanted, field) for field in definitions.MODEL_FIELDS}
            _refuse_declared(task, values)
            _apply(task, values, ChangeAction.REPLACE)
        return task

    def unregister(self, task_id: str) -> None:
        with storage_errors(), transaction.atomic():
            task = Task.objects.select_for_update().filter(id=task_id).first()
            if task is None:
                raise TaskNotFound()
            if task.declared_in != DeclaredIn.NOWHERE:
                raise TaskDeclared(
                    f"Task {task.id!r} is declared in {_where(task)}: remove the declaration instead "
                    "(the task is then disabled at the next runner start, and can be deleted)."
                )
            audit.record(ChangeAction.DELETE, task, audit.values(task), None)
            task.delete()

    def acting_as(self, by: str) -> AbstractContextManager[None]:
        """``with scheduler.acting_as("deploy-bot"):`` records the task changes made inside the
        block as made by that name (the audit trail; the admin and the API record their user)."""
        return audit.acting(by)

    def next_runs(self, task_id: str, n: int = DEFAULT_NEXT_RUNS) -> builtins.list[datetime]:
        """The task's next ``n`` (1 to 100) fire times after now, in UTC, on its cron and timezone
        (daylight saving time as concepts.md says), whether or not it is enabled. A stored schedule
        that cannot be evaluated gives the times found before the problem (none at worst)."""
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_NEXT_RUNS:
            raise InvalidDefinition(
                "The query is invalid.", errors={"n": [f"Must be an integer from 1 to {MAX_NEXT_RUNS}."]}
            )
        with storage_errors():
            task = (
                Task.objects.filter(id=_task_id(task_id))
                .only("cron", "run_at", "timezone", "starts_at", "ends_at", "jitter_seconds")
                .first()
            )
        if task is None:
            raise TaskNotFound()
        times: builtins.list[datetime] = []
        after: datetime | None = timezone.now()
        with suppress(ValueError):  # InvalidCron is a ValueError too
            while after is not None and len(times) < n:
                after = schedule.next_fire(task, after)
                if after is not None:
                    times.append(after)
        return times

    def backfill(
        self, task_id: str, start: datetime, end: datetime, dry_run: bool = True
    ) -> builtins.list[Execution]:
        """The occurrences of the task's fire times in [start, end) that have no execution, oldest
        first: with ``dry_run`` (the default) unsaved, as they would be created; without it created
        pending, to run in turn under the task's max_concurrency. Fire times the runners have not
        passed yet (from the task's next run on) are left to them. At most 1,000 per call
        (InvalidDefinition beyond, naming where to end the range). A paused task's backfilled
        occurrences wait in pending until it is resumed."""
        if not isinstance(dry_run, bool):
            raise InvalidDefinition(
                "The backfill is invalid.", errors={"dry_run": ["Must be true or false."]}
            )
        task_id = _task_id(task_id)
        with storage_errors():
            now = timezone.now()
            found = backfill.plan(task_id, start, end, now)
            if dry_run:
                return [
                    occurrences.scheduled(found.task, fire, now, Status.PENDING, source=BACKFILL_SOURCE)
                    for fire in found.fire_times
                ]
            return backfill.create(found, now)

    def task_history(
        self, task_id: str, limit: int = listing.DEFAULT_LIMIT, offset: int = 0
    ) -> builtins.list[TaskChange]:
        """The changes of a task, newest first, ``limit`` (1 to 100) after the first ``offset``;
        kept after the task is deleted. TaskNotFound when the id has neither a task nor a change."""
        task_id = _task_id(task_id)
        with storage_errors():
            changes = listing.window(
                TaskChange.objects.filter(task_id=task_id).order_by("-id"), limit, offset, "history"
            )
            if not changes and not offset and not Task.objects.filter(id=task_id).exists():
                raise TaskNotFound()
            return changes

    def refresh_tasks(self) -> list[Task]:
        """Make the declared tasks (SCHEDULER_APP["TASKS"] and ``@job``) match their declarations.

        All or nothing, in one transaction. A declaration is the whole
        definition: fields it leaves out take their defaults. A task declared
        before whose declaration is gone is disabled, with the reason
        recorded. A task created by register(), the admin or the API is never
        taken over: TaskAlreadyExists, and nothing changes. Runners starting
        together converge: the one that loses the race to insert a new
        declared task syncs again and finds the row.
        """
        declared = _declared(scheduler_settings.TASKS)
        with storage_errors():
            for _ in range(SYNC_ATTEMPTS - 1):
                try:
                    return _sync(declared)
                except (IntegrityError, OperationalError) as exc:
                    if not _lost_race(exc):
                        raise
            return _sync(declared)

    # -- executions ------------------------------------------------------------

    def trigger(
        self,
        task_id: str,
        source: str | None = None,
        idempotency_key: str | None = None,
        params: dict[str, Any] | None = None,
        wait: float | None = None,
        *,
        run_at: datetime | None = None,
        delay: float | None = None,
    ) -> Execution:
        """Create a manual execution (idempotent per key), due now, at ``run_at`` or after ``delay``
        seconds; optionally wait for its end."""
        errors = _trigger_errors(source, idempotency_key, params)
        errors.update(due_errors(run_at, delay))
        if wait is not None and (not isinstance(wait, (int, float)) or wait < 0 or wait > 3600):
            errors["wait"] = ["Must be a number of seconds from 0 to 3600."]
        if errors:
            raise InvalidDefinition("The trigger is invalid.", errors=errors)
        execution, _ = self._create(task_id, source, idempotency_key, params, run_at, delay)
        if wait:
            execution = self._wait(execution, wait)
        return execution

    def get_or_trigger(
        self,
        task_id: str,
        source: str | None = None,
        idempotency_key: str | None = None,
        params: dict[str, Any] | None = None,
        *,
        run_at: datetime | None = None,
        delay: float | None = None,
    ) -> tuple[Execution, bool]:
        """Like trigger(), without waiting; also says whether the execution was created (False: key reused)."""
        errors = _trigger_errors(source, idempotency_key, params)
        errors.update(due_errors(run_at, delay))
        if errors:
            raise InvalidDefinition("The trigger is invalid.", errors=errors)
        return self._create(task_id, source, idempotency_key, params, run_at, delay)

    def trigger_many(
        self, task_id: str, triggers: list[dict[str, Any]], source: str | None = None
    ) -> list[Execution]:
        """Create many manual executions of one task in one transaction, each trigger a dict with an
        optional ``idempotency_key`` and ``params``; the executions in order (an existing one where a
        key was used before). trigger()'s rules hold for each, and a refused batch writes nothing."""
        return [execution for execution, _ in self.get_or_trigger_many(task_id, triggers, source)]

    def get_or_trigger_many(
        self, task_id: str, triggers: list[dict[str, Any]], source: str | None = None
    ) -> list[tuple[Execution, bool]]:
        """Like trigger_many(); also says of each execution whether this call created it."""
        batch = _valid_triggers(triggers, source)
        with storage_errors():
            results = create_many(task_id, source, batch, timezone.now())
        if any(created for _, created in results):
            wakeup.notify()
        return results

    def _create(
        self,
        task_id: str,
        source: str | None,
        idempotency_key: str | None,
        params: dict[str, Any] | None,
        run_at: datetime | None = None,
        delay: float | None = None,
    ) -> tuple[Execution, bool]:
        digest = payload_hash(params)
        reason = f"triggered by {source}" if source else "triggered"
        with storage_errors():
            now = timezone.now()
            occurrence_id = manual_occurrence_id(task_id, idempotency_key, now)
            due = now + timedelta(seconds=delay) if delay else max(now, run_at) if run_at else now
            if due > now:
                reason += f", due {due.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            execution = occurrences.manual(
                task_id, occurrence_id, source or "", idempotency_key, digest, {}, due, now
            )
            wake = wakeup.carry()
            if journal_statements().insert_manual(execution, params or {}, reason, now, wake):
                if not wake:
                    wakeup.notify()
                return execution, True
            # Elsewhere, and on PostgreSQL when the task is missing or the key was used.
            found = Task.objects.filter(id=task_id).values_list("revision", "params", "retry_max_attempts")[
                :1
            ]
            if not found:
                raise TaskNotFound()
            ((execution.task_revision, task_params, execution.max_attempts),) = found
            execution.params = {**task_params, **(params or {})}
            try:
                with transaction.atomic():
                    execution.save(force_insert=True)
                    journal.append([journal.event(execution.sequence, now, "", Status.PENDING, reason)])
            except IntegrityError:
                existing = Execution.objects.filter(occurrence_id=occurrence_id).first()
                if existing is None:
                    raise
                if existing.payload_hash != digest:
                    raise Conflict(KEY_REUSED) from None
                return existing, False
        wakeup.notify()
        return execution, True

    def _wait(self, execution: Execution, seconds: float) -> Execution:
        deadline = time.monotonic() + seconds
        pause = 0.01
        while True:
            execution.refresh_from_db()
            if execution.status in TERMINAL or execution.status == Status.UNKNOWN:
                return execution
            if time.monotonic() >= deadline:
                return execution
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.25)

    def get_logs(
        self,
        task_id: str | None = None,
        status: str | None = None,
        trigger_type: str | None = None,
        trigger_source: str | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        page: int = 1,
        page_size: int = 20,
    ) -> LogPage:
        errors = listing.filter_errors(
            status, trigger_type, started_after=started_after, started_before=started_before
        )
        if not isinstance(page, int) or isinstance(page, bool) or page < 1:
            errors["page"] = ["Must be a positive integer."]
        if (
            not isinstance(page_size, int)
            or isinstance(page_size, bool)
            or not 1 <= page_size <= MAX_PAGE_SIZE
        ):
            errors["page_size"] = [f"Must be an integer from 1 to {MAX_PAGE_SIZE}."]
        if errors:
            raise InvalidDefinition("The log query is invalid.", errors=errors)
        rows = ExecutionLog.objects.using(logs.log_alias()).all()
        filters = {
            "task_id": task_id,
            "status": status,
            "trigger_type": trigger_type,
            "trigger_source": trigger_source,
            "started_at__gte": started_after,
            "started_at__lt": started_before,
        }
        rows = rows.filter(**{key: value for key, value in filters.items() if value is not None})
        start = (page - 1) * page_size
        counted_up_to = start + LOG_COUNT_AHEAD
        with storage_errors():
            # COUNT(*) over a LIMIT subquery: it stops at the bound however many rows match.
            count = rows[: counted_up_to + 1].count()
            results = list(rows.order_by("-finished_at", "-attempt")[start : start + page_size])
        return LogPage(
            results=results,
            count=min(count, counted_up_to),
            page=page,
            page_size=page_size,
            count_exact=count <= counted_up_to,
        )


SCHEDULE_FIELDS = frozenset({"cron", "run_at", "timezone", "starts_at", "ends_at", "enabled"})
# The fields a declaration owns: every definition field but enabled (operators may pause a task).
CODE_OWNED = frozenset(definitions.MODEL_FIELDS) - {"enabled"}
# A sync that lost an insert race sees the winner's row on its next try.
SYNC_ATTEMPTS = 3


def _declared(tasks: Any) -> list[tuple[dict[str, Any], str]]:
    """Every declared definition with where it is declared: TASKS first, then @job."""
    errors: dict[str, list[str]] = {}
    messages = []
    in_settings: list[dict[str, Any]] = []
    try:
        in_settings = validate_settings_tasks(tasks)
    except InvalidDefinition as exc:
        errors.update(exc.errors)
        messages.append(exc.message)
    in_code: list[dict[str, Any]] = []
    try:
        in_code = declarations.validate(settings_ids(tasks))
    except InvalidDefinition as exc:
        errors.update(exc.errors)
        messages.append(exc.message)
    if errors:
        message = messages[0] if len(messages) == 1 else "The declared tasks are invalid."
        raise InvalidDefinition(message, errors=errors)
    return [(d, DeclaredIn.SETTINGS) for d in in_settings] + [(d, DeclaredIn.CODE) for d in in_code]


def _sync(declared: list[tuple[dict[str, Any], str]]) -> list[Task]:
    wanted: dict[str, Task] = {}
    for definition, source in declared:
        task = Task(**definitions.validate_definition(definition))
        task.declared_in = source
        wanted[task.id] = task
    synced: dict[str, Task] = {}
    with transaction.atomic():
        existing = Task.objects.select_for_update().filter(id__in=list(wanted)).order_by("id")
        found = {task.id: task for task in existing}
        taken = sorted(task_id for task_id, task in found.items() if registered_by_hand(task))
        if taken:
            raise TaskAlreadyExists(
                f"Declared tasks collide with tasks created by register(), the admin or the API: "
                f"{', '.join(taken)}. Rename the declarations, or delete those tasks first "
                "(check scheduler_app.E039)."
            )
        # In id order, so that runners inserting the same new tasks wait on each other, not deadlock.
        for task_id in sorted(wanted):
            task = wanted[task_id]
            if task_id not in found:
                task.next_run_at = _next_run(task)
                task.save(force_insert=True)
                audit.record(ChangeAction.CREATE, task, None, audit.values(task), via=ChangeVia.CODE)
                synced[task_id] = task
                continue
            values = {field: getattr(task, field) for field in definitions.MODEL_FIELDS}
            if found[task_id].disabled_reason == NO_LONGER_DECLARED:
                values["disabled_reason"] = ""
            else:
                # enabled is the operator's once the task exists: a pause outlives the next deploy.
                del values["enabled"]
            _apply(
                found[task_id],
                {**values, "declared_in": task.declared_in},
                ChangeAction.UPDATE,
                via=ChangeVia.CODE,
            )
            synced[task_id] = found[task_id]
        gone = Task.objects.select_for_update().exclude(declared_in=DeclaredIn.NOWHERE)
        for task in gone.exclude(id__in=list(wanted)).order_by("id"):
            _apply(
                task,
                {
                    "enabled": False,
                    "declared_in": DeclaredIn.NOWHERE,
                    "disabled_reason": NO_LONGER_DECLARED,
                    # A pause of it does not end: the task is no longer the operator's to run.
                    "disabled_until": None,
                },
                ChangeAction.UPDATE,
                via=ChangeVia.CODE,
            )
            logger.warning("task %s is no longer declared in TASKS or @job: disabled", task.id)
    return [synced[task_id] for task_id in wanted]


def registered_by_hand(task: Task) -> bool:
    """Whether a declaration with this task's id would take over a task register() created."""
    return task.declared_in == DeclaredIn.NOWHERE and task.disabled_reason != NO_LONGER_DECLARED


def _lost_race(exc: DatabaseError) -> bool:
    """A sync that lost to another runner's: a unique violation, or a deadlock (MariaDB's gap locks
    on rows not inserted yet)."""
    return isinstance(exc, IntegrityError) or database_errors.cause_of(exc) == "deadlock"


def _where(task: Task) -> str:
    if task.declared_in == DeclaredIn.SETTINGS:
        return "SCHEDULER_APP['TASKS']"
    return declarations.where(task.id)


def _refuse_declared(task: Task, values: dict[str, Any]) -> None:
    """Refuse changes to the fields a declared task's declaration owns (enabled stays free)."""
    if task.declared_in == DeclaredIn.NOWHERE:
        return
    changed = {field for field in CODE_OWNED & set(values) if getattr(task, field) != values[field]}
    if not changed:
        return
    names = sorted({"retry" if field.startswith("retry_") else field for field in changed})
    raise TaskDeclared(
        f"Task {task.id!r} is declared in {_where(task)}: change {', '.join(names)} there. "
        "Enabling, disabling and running it now stay allowed.",
        fields=names,
        declared_in=task.declared_in,
    )


def _switched(task: Task, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with what turning the task off or on implies: disabling records since when and
    by whom (who acts, as the audit trail records it); enabling clears why, who, since and until."""
    if "enabled" not in values or values["enabled"] == task.enabled:
        return values
    if values["enabled"]:
        return {**values, **NOT_PAUSED}
    return {"disabled_at": timezone.now(), "disabled_by": audit.actor(), **values}


def pause_errors(reason: Any, until: Any) -> dict[str, list[str]]:
    """What is wrong with a pause's reason and until, by field (the admin's form asks too)."""
    errors: dict[str, list[str]] = {}
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        errors["reason"] = [f"Must be a string of at most {MAX_REASON_LENGTH} characters."]
    else:
        definitions.check_json(reason, "reason", errors)
    if until is None:
        return errors
    if not isinstance(until, datetime) or until.utcoffset() is None:
        errors["until"] = ["Must be a timezone-aware datetime."]
    elif until <= timezone.now():
        errors["until"] = ["Must be in the future."]
    elif until > timezone.now() + timedelta(seconds=MAX_DELAY_SECONDS):
        errors["until"] = ["Must be at most 366 days from now."]
    return errors


def _locked(task_id: Any) -> Task:
    """The task, locked for the rest of the transaction; TaskNotFound if there is none."""
    task = Task.objects.select_for_update().filter(id=_task_id(task_id)).first()
    if task is None:
        raise TaskNotFound()
    return task


def _next_run(task: Task) -> datetime | None:
    """Where a new or rescheduled task starts: its next fire time, or a one-shot's run_at even
    when it has passed (it runs at once within the misfire grace; see concepts.md)."""
    if task.run_at is not None:
        return schedule.next_fire(task, task.run_at - schedule.ONE_MICROSECOND)
    return schedule.next_fire(task, timezone.now())


def _one_schedule(task: Task, changes: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """An update that sets a cron expression clears run_at and the other way round; the task as
    it would be after the update is checked as a whole (one schedule, window, jitter)."""
    if values.get("cron") and "run_at" not in changes:
        values = {**values, "run_at": None}
    elif values.get("run_at") is not None and "cron" not in changes:
        values = {**values, "cron": ""}
    after = {field: values.get(field, getattr(task, field)) for field in definitions.MODEL_FIELDS}
    errors: dict[str, list[str]] = {}
    definitions.check_schedule(after, errors, timezone.now())
    definitions.raise_if_errors(errors)
    return values


def _apply(task: Task, values: dict[str, Any], action: str, via: str | None = None) -> bool:
    """Save the fields that differ, bump the revision, record the change; the next run moves
    only if the schedule changed."""
    values = _switched(task, values)
    changed = {field: value for field, value in values.items() if getattr(task, field) != value}
    if not changed:
        return False
    before = audit.values(task)
    for field, value in changed.items():
        setattr(task, field, value)
    task.revision += 1
    if "run_at" in changed:
        task.next_run_at = _next_run(task)
    elif SCHEDULE_FIELDS & set(changed):
        # A one-shot whose instant passed while it was disabled does not run when enabled.
        task.next_run_at = schedule.next_fire(task, timezone.now())
    task.save()
    audit.record(action, task, before, audit.values(task), via=via)
    return True


def _valid_triggers(batch: Any, source: Any) -> list[Trigger]:
    """The batch of trigger_many() as Trigger values; InvalidDefinition naming each bad field."""
    errors = _trigger_errors(source, None, None)
    if not isinstance(batch, (list, tuple)) or not 1 <= len(batch) <= MAX_TRIGGERS:
        errors["triggers"] = [f"Must be a list of 1 to {MAX_TRIGGERS} triggers."]
        raise InvalidDefinition("The triggers are invalid.", errors=errors)
    for n, item in enumerate(batch):
        if not isinstance(item, dict):
            errors[f"triggers[{n}]"] = ["Must be an object with idempotency_key and params, both optional."]
            continue
        unknown = sorted(str(key) for key in set(item) - TRIGGER_KEYS)
        if unknown:
            errors[f"triggers[{n}]"] = [f"Unknown keys: {', '.join(unknown)}."]
        for field, messages in _trigger_errors(None, item.get("idempotency_key"), item.get("params")).items():
            errors[f"triggers[{n}].{field}"] = messages
    if errors:
        raise InvalidDefinition("The triggers are invalid.", errors=errors)
    return [Trigger(item.get("idempotency_key"), item.get("params")) for item in batch]


def due_errors(run_at: Any, delay: Any) -> dict[str, list[str]]:
    """What is wrong with when a trigger asks to run: an aware instant, or seconds from now, not both."""
    errors: dict[str, list[str]] = {}
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.utcoffset() is None):
        errors["run_at"] = ["Must be a timezone-aware datetime."]
    elif run_at is not None and run_at > timezone.now() + timedelta(seconds=MAX_DELAY_SECONDS):
        errors["run_at"] = ["Must be at most 366 days from now."]
    if delay is not None and (
        not isinstance(delay, (int, float)) or isinstance(delay, bool) or not 0 <= delay <= MAX_DELAY_SECONDS
    ):
        errors["delay"] = [f"Must be a number of seconds from 0 to {MAX_DELAY_SECONDS}."]
    if run_at is not None and delay is not None:
        errors["run_at"] = ["Give run_at or delay, not both."]
    return errors


def _trigger_errors(source: Any, idempotency_key: Any, params: Any) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if params is not None and (not isinstance(params, dict) or not definitions.is_json(params)):
        errors["params"] = ["Must be a JSON object."]
    elif params is not None:
        # What no database can store is refused here, as the API's parser and register() refuse it.
        definitions.check_json(params, "params", errors)
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 128
    ):
        errors["idempotency_key"] = ["Must be 1-128 characters."]
    elif idempotency_key is not None:
        definitions.check_json(idempotency_key, "idempotency_key", errors)
    if source is not None and (not isinstance(source, str) or len(source) > 200):
        errors["source"] = ["Must be a string of at most 200 characters."]
    elif source is not None:
        definitions.check_json(source, "source", errors)
    return errors


def _refresh_logs(occurrence_id: Any) -> None:
    # The journal change is committed; a failed log write leaves log_persistence
    # pending, where list_log_failures() shows it for repair.
    with suppress(DatabaseError):
        logs.repair(occurrence_id)


def _task_id(value: Any) -> str:
    """A task id as given; TaskNotFound for anything no task can have (some databases refuse a NUL)."""
    if not isinstance(value, str) or not definitions.ID_PATTERN.match(value):
        raise TaskNotFound()
    return value


def _uuid(value: Any) -> Any:
    import uuid

    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ExecutionNotFound() from None


def _cron_errors(expression: str, zone: str) -> dict[str, list[str]]:
    from scheduler_app.exceptions import InvalidCron

    try:
        cron.validate(expression, zone)
    except InvalidCron as exc:
        return exc.errors
    return {}


def validate_declared_tasks(declared: Any) -> list[dict[str, Any]]:
    """Check the declared tasks: SCHEDULER_APP["TASKS"] (``declared``) and the @job declarations.

    Errors are keyed ``TASKS[i].field`` and ``@job('name').field``; a task has one declaration.
    """
    return [definition for definition, _ in _declared(declared)]


def settings_ids(declared: Any) -> set[str]:
    """The ids SCHEDULER_APP["TASKS"] declares, valid or not."""
    if not isinstance(declared, (list, tuple)):
        return set()
    return {item["id"] for item in declared if isinstance(item, dict) and isinstance(item.get("id"), str)}


def validate_settings_tasks(declared: Any) -> list[dict[str, Any]]:
    """Check SCHEDULER_APP["TASKS"]: a list of valid definitions with unique ids."""
    if not isinstance(declared, (list, tuple)):
        raise InvalidDefinition(
            "SCHEDULER_APP['TASKS'] must be a list of definitions.", errors={"TASKS": ["Must be a list."]}
        )
    errors: dict[str, list[str]] = {}
    seen: set[str] = set()
    for index, definition in enumerate(declared):
        try:
            definitions.validate_definition(definition)
        except InvalidDefinition as exc:
            for field, messages in exc.errors.items():
                errors.setdefault(f"TASKS[{index}].{field}" if field else f"TASKS[{index}]", []).extend(
                    messages
                )
            continue
        if definition["id"] in seen:
            errors.setdefault(f"TASKS[{index}].id", []).append(f"Duplicate id {definition['id']!r}.")
        seen.add(definition["id"])
    if errors:
        raise InvalidDefinition("SCHEDULER_APP['TASKS'] has invalid definitions.", errors=errors)
    return list(declared)


scheduler = Scheduler()
