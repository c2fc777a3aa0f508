"""Task definitions, the execution journal, its events, the log projection and runners."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db import models
from django.db.models.base import ModelState
from django.utils import timezone

from scheduler_app import schedule
from scheduler_app.indexes import PartialIndex

M = TypeVar("M", bound=models.Model)

OCCURRENCE_NAMESPACE = uuid.UUID("6f1c2a4e-5b7d-4c1e-9a3f-2d8e7b6c5a41")


class Overlap(models.TextChoices):
    SKIP = "skip", "Skip while busy"
    BUFFER_ONE = "buffer_one", "Keep one waiting"


class MisfirePolicy(models.TextChoices):
    COALESCE = "coalesce", "Run the latest missed fire time once"
    RUN_ALL = "run_all", "Run every missed fire time within the grace"


class DeclaredIn(models.TextChoices):
    NOWHERE = "", "Not declared (register(), the admin or the API)"
    SETTINGS = "settings", "SCHEDULER_APP['TASKS']"
    CODE = "code", "@job"


# Set by refresh_tasks() on a task whose declaration is gone; see services.refresh_tasks.
NO_LONGER_DECLARED = "no longer declared in code (TASKS or @job); disabled at runner start"
# What a task enabled again no longer has: why, by whom, since and until when it was paused.
NOT_PAUSED: dict[str, Any] = {
    "disabled_reason": "",
    "disabled_by": "",
    "disabled_at": None,
    "disabled_until": None,
}


# Created by Task.Meta.permissions; the admin and the REST API check it under this name.
CHANGE_HANDLER_PERMISSION = "scheduler_app.change_task_handler"


class Task(models.Model):
    """One task definition."""

    id = models.CharField(primary_key=True, max_length=128)
    name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    cron = models.CharField(max_length=200, blank=True, help_text="Empty for a one-shot task (run_at).")
    run_at = models.DateTimeField(null=True, blank=True, help_text="The one instant a one-shot task fires.")
    timezone = models.CharField(max_length=64, blank=True, help_text="IANA name; empty means UTC.")
    starts_at = models.DateTimeField(null=True, blank=True, help_text="No fire time before this instant.")
    ends_at = models.DateTimeField(null=True, blank=True, help_text="No fire time at or after this instant.")
    jitter_seconds = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    delete_after_run = models.BooleanField(default=False)
    idempotent = models.BooleanField(default=False)
    retry_max_attempts = models.PositiveSmallIntegerField(default=1)
    retry_backoff = models.JSONField(default=list, blank=True)
    params = models.JSONField(default=dict, blank=True)
    handler = models.JSONField(null=True, blank=True)
    max_concurrency = models.PositiveIntegerField(default=1)
    overlap = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.SKIP)
    misfire_grace_seconds = models.PositiveIntegerField(null=True, blank=True)
    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.COALESCE
    )
    # Where the definition lives when it is declared in code: refresh_tasks() owns those fields.
    declared_in = models.CharField(max_length=16, choices=DeclaredIn.choices, default="", blank=True)
    # A paused task is a disabled one: these say why, by whom, since and until when (then a runner
    # resumes it). Enabling it clears them all.
    disabled_reason = models.CharField(max_length=200, blank=True)
    disabled_by = models.CharField(
        max_length=150, blank=True, help_text="The user, API client or node that disabled it."
    )
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_until = models.DateTimeField(null=True, blank=True, help_text="A runner enables it again then.")
    revision = models.PositiveIntegerField(default=1)
    next_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["enabled", "next_run_at"], name="scheduler_task_due"),
            # The runner's probe reads the earliest end of a pause from one end of it. Partial: the
            # move of an enabled task's next_run_at at each fire time writes no entry into it.
            PartialIndex(
                fields=["enabled", "disabled_until"],
                name="scheduler_task_paused",
                where=models.Q(enabled=False),
            ),
            # The graces tasks set of their own, read at each page of the task list and each status
            # check (lateness.cutoffs): most tasks keep the setting's, and have no entry.
            PartialIndex(
                fields=["misfire_grace_seconds"],
                name="scheduler_task_grace",
                where=models.Q(misfire_grace_seconds__isnull=False),
            ),
        ]
        # Separate from change_task: a handler is code (JavaScript) or a network target (HTTP).
        permissions = [("change_task_handler", "Can change task handlers (JavaScript code, HTTP targets)")]

    def __str__(self) -> str:
        return self.id

    def due_time(self, fire: datetime) -> datetime:
        """When the occurrence of fire time ``fire`` comes due: shifted by the task's jitter."""
        if not self.jitter_seconds:
            return fire
        return fire + schedule.jitter(self.jitter_seconds, scheduled_occurrence_id(self.id, fire))

    def pause_skips(self, fire: datetime) -> bool:
        """Whether the task's pause keeps fire time ``fire`` from running."""
        return not self.enabled and (self.disabled_until is None or fire < self.disabled_until)

    def to_definition(self) -> dict[str, Any]:
        """The definition dict of this task, in the shape register() accepts."""
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "cron": self.cron,
            "run_at": self.run_at,
            "timezone": self.timezone,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "jitter_seconds": self.jitter_seconds,
            "enabled": self.enabled,
            "delete_after_run": self.delete_after_run,
            "idempotent": self.idempotent,
            "retry": {"max_attempts": self.retry_max_attempts, "backoff": list(self.retry_backoff)},
            "params": self.params,
            "handler": self.handler,
            "max_concurrency": self.max_concurrency,
            "overlap": self.overlap,
            "misfire_grace_seconds": self.misfire_grace_seconds,
            "misfire_policy": self.misfire_policy,
        }

    def backoff_before(self, attempt: int) -> float:
        """Seconds to wait before ``attempt`` (2, 3, ...); the last backoff value repeats."""
        backoff = self.retry_backoff or [0]
        return float(backoff[min(attempt - 2, len(backoff) - 1)])


class ChangeAction(models.TextChoices):
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"
    ENABLE = "enable"
    DISABLE = "disable"
    DELETE = "delete"


class ChangeVia(models.TextChoices):
    ADMIN = "admin", "admin"
    API = "api", "REST API"
    PYTHON = "python", "Python API"
    CODE = "code", "sync from code"
    RUNNER = "runner", "runner (delete_after_run, end of a pause)"


class TaskChange(models.Model):
    """One change of a task definition: who made it, when, each field old -> new (the handler
    masked). The audit trail: kept when the task is deleted."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(max_length=128)
    at = models.DateTimeField()
    action = models.CharField(max_length=16, choices=ChangeAction.choices)
    via = models.CharField(max_length=16, choices=ChangeVia.choices)
    by = models.CharField(
        max_length=150, blank=True, help_text="The user, API client or node; empty from code."
    )
    revision = models.PositiveIntegerField(
        help_text="The task's revision after the change (the last one for a delete)."
    )
    changes = models.JSONField(default=dict, help_text="Each changed field: [old, new].")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["task_id", "id"], name="scheduler_taskchange_task")]

    def __str__(self) -> str:
        return f"{self.task_id} {self.action} r{self.revision}"


class Status(models.TextChoices):
    PENDING = "pending"
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    UNKNOWN = "unknown"
    DISCARDED = "discarded"


TERMINAL = (Status.SUCCESS, Status.FAILED, Status.INTERRUPTED, Status.DISCARDED)
OCCUPYING = (Status.CLAIMED, Status.RUNNING, Status.UNKNOWN)
LEASED = (Status.CLAIMED, Status.RUNNING)
# Executions whose attempts are over: a log row is due for each.
ENDED = (*TERMINAL, Status.UNKNOWN)


class TriggerType(models.TextChoices):
    SCHEDULED = "scheduled"
    MANUAL = "manual"


class LogPersistence(models.TextChoices):
    PENDING = "pending"
    PERSISTED = "persisted"
    UNCONFIRMED = "unconfirmed"


UNLOGGED = (LogPersistence.PENDING, LogPersistence.UNCONFIRMED)


# Occurrence and log ids (docs/concepts.md, "Occurrence identity"). All but a keyed manual trigger's
# are UUIDs of version 7: 48 bits of milliseconds since 1970 (a fire time, a manual trigger's
# creation), then bits of their own. The rows of a burst then take neighbouring keys and go to the
# last few pages of their unique index; with random keys each went to a page of its own, in an
# index that outgrows the database's buffers in a journal of millions of rows: a read and a whole
# page written to the WAL for each row (bench/scale.py). Not version 8: MariaDB's uuid type
# refuses some of those.
_TIME_BITS = 48
_REST_BITS = 128 - _TIME_BITS
_VERSION_7 = 7 << 76
_RFC_VARIANT = 0b10 << 62
_NOT_REST = 0xF << 76 | 0b11 << 62
_MILLISECOND = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _version_7(milliseconds: int, rest: int) -> uuid.UUID:
    """A UUID of version 7: ``milliseconds`` in its first 48 bits, then the bits of ``rest`` but
    for its version and variant."""
    head = (milliseconds % (1 << _TIME_BITS)) << _REST_BITS
    tail = rest & ((1 << _REST_BITS) - 1) & ~_NOT_REST
    return uuid.UUID(int=head | tail | _VERSION_7 | _RFC_VARIANT)


def _milliseconds(instant: datetime) -> int:
    return (instant.astimezone(UTC) - _EPOCH) // _MILLISECOND


def _named(name: str, instant: datetime) -> uuid.UUID:
    """The milliseconds of ``instant``, then the bits of uuid5(NAMESPACE, name): the same on every node."""
    return _version_7(_milliseconds(instant), uuid.uuid5(OCCURRENCE_NAMESPACE, name).int)


def scheduled_occurrence_id(task_id: str, scheduled_for: datetime) -> uuid.UUID:
    return _named(f"{task_id}|{_fire_text(scheduled_for)}", scheduled_for)


def _fire_text(fire: datetime) -> str:
    """A fire time in an occurrence id: to the minute, as every cron fire time is; a one-shot task's
    run_at off the minute to the microsecond, so that it never takes the id of a run of the task
    earlier in the same minute (a cron run at 10:00, then run_at 10:00:40)."""
    fire = fire.astimezone(UTC)
    if fire.second or fire.microsecond:
        return f"{fire:%Y-%m-%dT%H:%M:%S.%fZ}"
    return f"{fire:%Y-%m-%dT%H:%MZ}"


def missed_occurrence_id(task_id: str, first: datetime) -> uuid.UUID:
    """The record of fire times skipped by a misfire: an id of its own, so that each skipped fire
    time's own id stays free for a backfill."""
    return _named(f"{task_id}|missed|{_fire_text(first)}", first)


def manual_occurrence_id(task_id: str, idempotency_key: str | None, now: datetime | None = None) -> uuid.UUID:
    """With a key, uuid5: the same key finds the same execution whenever it comes again. Without
    one, a uuid7 as Python 3.14's uuid.uuid7() makes it: the milliseconds of ``now`` (the
    execution's creation; by default the current time), then random bits."""
    if idempotency_key is None:
        created = timezone.now() if now is None else now
        return _version_7(_milliseconds(created), int.from_bytes(os.urandom(10)))
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{task_id}|manual|{idempotency_key}")


def log_id(occurrence_id: uuid.UUID, attempt: int) -> uuid.UUID:
    """The id of the log row of an occurrence's attempt: the first 48 bits of the occurrence id (a
    time, but for a keyed trigger's), then the bits of uuid5(occurrence_id, str(attempt)).
    Deterministic, so that a log row written again overwrites itself."""
    return _version_7(occurrence_id.int >> _REST_BITS, uuid.uuid5(occurrence_id, str(attempt)).int)


def built(model: type[M], values: dict[str, Any], *, db: str | None = None) -> M:
    """``model(**values)``, or with ``db`` what ``model.from_db(db, ...)`` returns, built without
    ``Model.__init__`` and so without the pre_init and post_init signals, which nothing in this
    app listens to. For the runner's hot paths, which build hundreds of rows per claim or batch
    and where ``__init__`` was most of their Python (py-spy; cProfile of bench/scheduling.py).
    A new instance needs every field in ``values``; a loaded one's missing fields load on use,
    as deferred ones do."""
    instance = model.__new__(model)
    instance.__dict__.update(values)
    state = instance._state = ModelState()
    if db is not None:
        state.adding, state.db = False, db
    return instance


# The trigger source of backfilled occurrences. They were asked for fire time by fire time: a pause
# holds them in pending (the claim passes over them) where it ends the other scheduled ones.
BACKFILL_SOURCE = "backfill"


def held_by_pause() -> models.Q:
    """On Execution: backfilled occurrences of paused tasks, which wait for the task's resume."""
    return models.Q(
        trigger_source=BACKFILL_SOURCE,
        trigger_type=TriggerType.SCHEDULED,
        task_id__in=Task.objects.filter(enabled=False).values("id"),
    )


class ExecutionQuerySet(models.QuerySet):
    def due(self, now: datetime) -> ExecutionQuerySet:
        return self.filter(status=Status.PENDING, due_at__lte=now)

    def lease_expired(self, now: datetime) -> ExecutionQuerySet:
        return self.filter(status__in=LEASED, lease_expires_at__lt=now)

    def occupying(self) -> ExecutionQuerySet:
        # Two conditions, each one of a small partial index on PostgreSQL (leased rows, unknown
        # rows), rather than one IN list that neither matches.
        return self.filter(models.Q(status__in=LEASED) | models.Q(status=Status.UNKNOWN))

    def count_by_task(self) -> dict[str, int]:
        """How many of these executions each task has."""
        rows = (
            self.order_by().values("task_id").annotate(n=models.Count("sequence")).values_list("task_id", "n")
        )
        return dict(rows)


# Created by Execution.Meta.permissions; the admin and the REST API check it under this name.
RESOLVE_UNKNOWN_PERMISSION = "scheduler_app.resolve_unknown"


class Execution(models.Model):
    """One occurrence of a task: the journal row."""

    sequence = models.BigAutoField(primary_key=True)
    occurrence_id = models.UUIDField(unique=True)
    task_id = models.CharField(max_length=128)
    task_revision = models.PositiveIntegerField(default=0)
    trigger_type = models.CharField(max_length=16, choices=TriggerType.choices)
    trigger_source = models.CharField(max_length=200, blank=True)
    # Unique with the task through occurrence_id, which is derived from both (manual_occurrence_id):
    # a second index on them would be one more index entry to write at every change of the row.
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    payload_hash = models.CharField(max_length=64, blank=True)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    # The fire times this occurrence stands for besides scheduled_for: merged into its run, or
    # skipped by a misfire ({"count", "first", "last", "listed"}).
    missed_fire_times = models.JSONField(null=True, blank=True)
    due_at = models.DateTimeField()
    params = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempt = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=1)
    owner = models.CharField(max_length=200, blank=True)
    execution_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    stop_requested = models.BooleanField(default=False)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # What a handler started outside this row, such as a django_task's result id; "" when nothing.
    handler_ref = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    log_persistence = models.CharField(
        max_length=16, choices=LogPersistence.choices, default=LogPersistence.PENDING
    )

    objects = ExecutionQuerySet.as_manager()

    class Meta:
        ordering = ["-sequence"]
        indexes = [
            # Claims read due rows in (due_at, sequence) order and stop at their limit: with the
            # sequence in the index they read no more rows than they lock, however many are due.
            PartialIndex(
                fields=["status", "due_at", "sequence"],
                name="scheduler_execution_due",
                where=models.Q(status=Status.PENDING),
            ),
            PartialIndex(
                fields=["status", "lease_expires_at"],
                name="scheduler_execution_lease",
                where=models.Q(status__in=LEASED),
            ),
            # A task's executions newest first (its last outcome, its page of the journal): a
            # backward read that stops at the first match. What occupies a task's slots is found
            # through small partial indexes (``occupying()``; on PostgreSQL, by task, through
            # scheduler_execution_occupying, built by migration 0001 only there), not this one.
            models.Index(fields=["task_id", "sequence"], name="scheduler_execution_task"),
            # The operator's lists and health checks: few rows, found without reading the history.
            PartialIndex(
                fields=["status", "updated_at"],
                name="scheduler_execution_unknown",
                where=models.Q(status=Status.UNKNOWN),
            ),
            PartialIndex(
                fields=["log_persistence", "updated_at"],
                name="scheduler_execution_unlogged",
                where=models.Q(status__in=ENDED, log_persistence__in=UNLOGGED),
            ),
            # Journal retention deletes the oldest ended rows first (scheduler_app/retention.py).
            PartialIndex(
                fields=["finished_at"],
                name="scheduler_execution_ended",
                where=models.Q(status__in=TERMINAL),
            ),
        ]
        permissions = [("resolve_unknown", "Can resolve executions in state unknown")]

    def __str__(self) -> str:
        return f"{self.task_id} {self.occurrence_id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class ExecutionEvent(models.Model):
    """One state change of an execution; terminal attempt events carry result and error."""

    # No constraint in the database: an event is written only in the statement or transaction that
    # moves its execution, whose row that transaction holds locked; PostgreSQL's check of each
    # event's key would add a statement per event (four per execution) to the hot path.
    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="events", db_constraint=False
    )
    at = models.DateTimeField()
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    reason = models.CharField(max_length=500, blank=True)
    node = models.CharField(max_length=200, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.from_status or '-'} -> {self.to_status} ({self.reason})"


class ExecutionLog(models.Model):
    """One finished attempt, as users query it: a projection of the journal."""

    id = models.UUIDField(primary_key=True)
    # Not indexed: an occurrence's rows are read by their ids (logs.ids_of); an index on it would be
    # one more entry to write for every row, and a page of its own for each keyed trigger's row.
    occurrence_id = models.UUIDField()
    task_id = models.CharField(max_length=128)
    task_name = models.CharField(max_length=200, blank=True)
    trigger_type = models.CharField(max_length=16, choices=TriggerType.choices)
    trigger_source = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    duration_ms = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-finished_at", "-attempt"]
        indexes = [
            models.Index(fields=["task_id", "finished_at"], name="scheduler_log_task"),
            models.Index(fields=["finished_at"], name="scheduler_log_finished"),
            models.Index(fields=["started_at"], name="scheduler_log_started"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} attempt {self.attempt}: {self.status}"


class RunnerQuerySet(models.QuerySet):
    def with_state(self, now: datetime | models.Func) -> RunnerQuerySet:
        """Annotate ``state``: stopped, alive (its heartbeat is not overdue at ``now``) or silent.

        Runners write their heartbeat on the database clock: pass ``now`` read from it, or the
        database function ``Now()``.
        """
        return self.annotate(
            state=models.Case(
                models.When(~models.Q(stopped_at=None), then=models.Value("stopped")),
                models.When(silent_after__gte=now, then=models.Value("alive")),
                default=models.Value("silent"),
                output_field=models.CharField(),
            )
        )


class Runner(models.Model):
    """One live or past runner process."""

    node_id = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # Written with each heartbeat: two heartbeat periods later, and a margin for slow ticks. A
    # runner whose next heartbeat has not come by then is silent, whatever its own --lease.
    silent_after = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    version = models.CharField(max_length=32)

    objects = RunnerQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.node_id


class MaintenanceMark(models.Model):
    """When a cluster-wide chore (log retention) last ran: a compare-and-set guard."""

    name = models.CharField(primary_key=True, max_length=64)
    last_run_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name
