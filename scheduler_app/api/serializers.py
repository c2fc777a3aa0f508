"""Representations of tasks, executions and logs; request bodies handed to the services.

Request serializers declare their fields for the schema but validate only the
shape of the request (an object with known keys): the services validate the
values, so the API and the Python API accept and refuse exactly the same input.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from scheduler_app import definitions
from scheduler_app.api.schema import document_field, one_object
from scheduler_app.handlers import registry
from scheduler_app.listing import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET
from scheduler_app.logs import LOG_FIELDS
from scheduler_app.models import (
    DeclaredIn,
    Execution,
    ExecutionEvent,
    ExecutionLog,
    Runner,
    Status,
    Task,
    TaskChange,
    TriggerType,
)
from scheduler_app.services import (
    DEFAULT_NEXT_RUNS,
    LOG_COUNT_AHEAD,
    MAX_DELAY_SECONDS,
    MAX_NEXT_RUNS,
    MAX_PAGE_SIZE,
    MAX_REASON_LENGTH,
)
from scheduler_app.values import short_text

MAX_PAGE = 1_000_000


class PassThroughSerializer(serializers.Serializer):
    """Checks that the body is an object with known keys; the service checks the values."""

    # Fields converted from their JSON form (a datetime string) before the service sees them.
    converted: tuple[str, ...] = ()

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"": ["Must be a JSON object."]})
        read_only = {name for name, field in self.fields.items() if field.read_only}
        unknown = sorted(str(key) for key in data if key not in self.fields)
        if unknown:
            names = ", ".join(short_text(key) for key in unknown)
            raise serializers.ValidationError({"": [f"Unknown fields: {names}."]})
        values = {key: value for key, value in data.items() if key not in read_only}
        errors: dict[str, Any] = {}
        for name in self.converted:
            if name in values:
                try:
                    values[name] = self.fields[name].run_validation(values[name])
                except serializers.ValidationError as exc:
                    errors[name] = exc.detail
        if errors:
            raise serializers.ValidationError(errors)
        return values


class RetrySerializer(serializers.Serializer):
    max_attempts = serializers.IntegerField(min_value=1, max_value=definitions.MAX_ATTEMPTS, required=False)
    backoff = serializers.ListField(
        child=serializers.FloatField(min_value=0, max_value=86400 * 7),
        max_length=definitions.MAX_ATTEMPTS,
        required=False,
        help_text="Seconds before attempt 2, 3, ...; the last value repeats.",
    )


@document_field(
    {
        "type": "object",
        "nullable": True,
        "properties": {"kind": {"type": "string"}},
        "required": ["kind"],
        "additionalProperties": True,
        "description": "A handler config ({kind: api | js | ...}) or null for the hooks; secrets masked on output.",
    }
)
class HandlerField(serializers.JSONField):
    pass


class TaskSerializer(PassThroughSerializer):
    """A task definition (the dict of ``scheduler.register``) with its bookkeeping fields."""

    converted = definitions.INSTANTS

    id = serializers.CharField(max_length=128, help_text="Letters, digits, hyphens and underscores.")
    name = serializers.CharField(max_length=definitions.MAX_NAME_LENGTH, required=False, allow_blank=True)
    description = serializers.CharField(max_length=10_000, required=False, allow_blank=True)
    cron = serializers.CharField(
        max_length=definitions.MAX_CRON_LENGTH,
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="Five cron fields, or a macro such as @daily; empty for a one-shot task (run_at).",
    )
    run_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="A one-shot task fires once at this instant (ISO 8601), instead of on a cron expression.",
    )
    timezone = serializers.CharField(
        max_length=64, required=False, allow_blank=True, allow_null=True, help_text="IANA name; empty is UTC."
    )
    starts_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="No fire time before this instant."
    )
    ends_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="No fire time at or after this instant."
    )
    jitter_seconds = serializers.IntegerField(
        min_value=0,
        max_value=definitions.MAX_JITTER_SECONDS,
        required=False,
        help_text="Each scheduled occurrence comes due up to this many seconds after its fire time, "
        "by an offset taken from its occurrence id; shorter than the shortest interval.",
    )
    enabled = serializers.BooleanField(required=False)
    delete_after_run = serializers.BooleanField(required=False)
    idempotent = serializers.BooleanField(required=False)
    retry = RetrySerializer(required=False, allow_null=True)
    params = serializers.DictField(required=False, allow_null=True)
    handler = HandlerField(required=False, allow_null=True)
    max_concurrency = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    overlap = serializers.ChoiceField(choices=definitions.OVERLAP_CHOICES, required=False)
    misfire_grace_seconds = serializers.IntegerField(
        min_value=1, max_value=86400 * 31, required=False, allow_null=True
    )
    misfire_policy = serializers.ChoiceField(
        choices=definitions.MISFIRE_POLICIES,
        required=False,
        help_text="coalesce: fire times missed within the grace run once; run_all: each runs.",
    )
    declared_in = serializers.ChoiceField(
        choices=DeclaredIn.choices,
        read_only=True,
        help_text="Where the task is declared in code: settings (TASKS) or code (@job); empty when it is not. "
        "A declared task's fields other than enabled are changed in its declaration (409, scheduler:044).",
    )
    disabled_reason = serializers.CharField(
        read_only=True,
        help_text="Why the task is paused (disabled): the pause's reason, or a declaration removed.",
    )
    disabled_by = serializers.CharField(
        read_only=True, help_text="Who paused (disabled) it: a user, an API client, a name; or empty."
    )
    disabled_at = serializers.DateTimeField(read_only=True, allow_null=True, help_text="Paused since.")
    disabled_until = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="A runner resumes (enables) it then; null: not by itself."
    )
    revision = serializers.IntegerField(read_only=True)
    next_run_at = serializers.DateTimeField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        values = super().to_internal_value(data)
        task = self.instance
        if isinstance(task, Task):
            if values.get("id", task.id) != task.id:
                raise serializers.ValidationError({"id": ["Cannot be changed."]})
            values.pop("id", None)
            # Values sent back as they were shown masked stand for the stored secrets.
            if values.get("handler") is not None:
                values["handler"] = registry.unmask(values["handler"], task.handler)
        return values

    def to_representation(self, task: Task) -> dict[str, Any]:
        data = task.to_definition()
        data["handler"] = registry.masked(task.handler)
        data["declared_in"] = task.declared_in
        data["disabled_reason"] = task.disabled_reason
        data["disabled_by"] = task.disabled_by
        data["revision"] = task.revision
        for name in (
            "disabled_at",
            "disabled_until",
            "next_run_at",
            "created_at",
            "updated_at",
            *definitions.INSTANTS,
        ):
            value = getattr(task, name)
            data[name] = self.fields[name].to_representation(value) if value else None
        return data


class TriggerSerializer(PassThroughSerializer):
    converted = ("run_at",)

    # The metaclass moves declared fields out of the class, so these names shadow nothing.
    source = serializers.CharField(  # type: ignore[assignment]
        max_length=200, required=False, allow_null=True, allow_blank=True, help_text="Default: the user name."
    )
    idempotency_key = serializers.CharField(
        min_length=1,
        max_length=128,
        required=False,
        allow_null=True,
        help_text="The same key returns the same execution; with other params it is refused (409).",
    )
    params = serializers.DictField(
        required=False, allow_null=True, help_text="Merged over the task's params for this execution."
    )
    run_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="When to run it (ISO 8601 with an offset); a time passed runs at once. Not with delay.",
    )
    delay = serializers.FloatField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_DELAY_SECONDS,
        help_text="Run it this many seconds from now. Not with run_at.",
    )


class PauseSerializer(PassThroughSerializer):
    converted = ("until",)

    reason = serializers.CharField(
        max_length=MAX_REASON_LENGTH,
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="Why it is paused, shown with the task.",
    )
    until = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="When a runner resumes it by itself (ISO 8601 with an offset; in the future, at most "
        "366 days ahead). Null or left out: until resumed.",
    )


class BackfillSerializer(PassThroughSerializer):
    converted = ("start", "end")

    start = serializers.DateTimeField(
        help_text="The range's first instant (ISO 8601 with an offset; without one it is read in the "
        "site's TIME_ZONE)."
    )
    end = serializers.DateTimeField(help_text="The range's end, left out of it.")
    dry_run = serializers.BooleanField(
        required=False, default=True, help_text="True (the default): only list what would be created."
    )


class BatchTriggerSerializer(PassThroughSerializer):
    """One trigger of a batch: the batch has one source."""

    idempotency_key = TriggerSerializer._declared_fields["idempotency_key"]
    params = TriggerSerializer._declared_fields["params"]


class TriggerManySerializer(PassThroughSerializer):
    source = serializers.CharField(  # type: ignore[assignment]
        max_length=200, required=False, allow_null=True, allow_blank=True, help_text="Default: the user name."
    )
    triggers = serializers.ListField(
        child=BatchTriggerSerializer(), min_length=1, max_length=10_000, help_text="At most 10,000."
    )


class ResolveSerializer(PassThroughSerializer):
    converted = ("expected_updated_at",)

    status = serializers.ChoiceField(choices=["success", "discarded"])
    expected_updated_at = serializers.DateTimeField(
        help_text="The execution's updated_at exactly as read (ISO 8601 with microseconds)."
    )


class ExecutionSerializer(serializers.ModelSerializer):
    """The safe projection of an execution: no params, handler, URL or execution token."""

    class Meta:
        model = Execution
        fields: tuple[str, ...] = (
            "occurrence_id",
            "sequence",
            "task_id",
            "task_revision",
            "trigger_type",
            "trigger_source",
            "idempotency_key",
            "scheduled_for",
            "missed_fire_times",
            "due_at",
            "status",
            "attempt",
            "max_attempts",
            "owner",
            "lease_expires_at",
            "stop_requested",
            "result",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "updated_at",
            "log_persistence",
        )
        read_only_fields: tuple[str, ...] = fields


class ExecutionRowSerializer(ExecutionSerializer):
    """An execution in a list: the projection without its result payload (the detail view has it)."""

    class Meta(ExecutionSerializer.Meta):
        fields = tuple(name for name in ExecutionSerializer.Meta.fields if name != "result")
        read_only_fields = fields


class ExecutionQuerySerializer(serializers.Serializer):
    """The filters and the page of ``GET executions/``."""

    task_id = serializers.CharField(max_length=128, required=False)
    status = serializers.ChoiceField(choices=Status.values, required=False)
    trigger_type = serializers.ChoiceField(choices=TriggerType.values, required=False)
    due_after = serializers.DateTimeField(required=False, help_text="due_at >= this instant.")
    due_before = serializers.DateTimeField(required=False, help_text="due_at < this instant.")
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT)
    cursor = serializers.CharField(
        max_length=64, required=False, help_text="The next_cursor of the page before, unchanged."
    )


@one_object
class ExecutionPageSerializer(serializers.Serializer):
    """A page of ``GET executions/``, newest first."""

    next = serializers.URLField(allow_null=True, help_text="The next page's address; null on the last page.")
    next_cursor = serializers.CharField(
        allow_null=True, help_text="The cursor of the next page; null on the last."
    )
    results = ExecutionRowSerializer(many=True)


class WindowQuerySerializer(serializers.Serializer):
    """limit and offset of the operator's lists (unknown executions, log failures)."""

    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT)
    offset = serializers.IntegerField(min_value=0, max_value=MAX_OFFSET, default=0)


class ExecutionWindowSerializer(serializers.Serializer):
    """A window of an operator's list, the oldest change first."""

    count = serializers.IntegerField(help_text="How many executions the whole list holds.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = ExecutionRowSerializer(many=True)


class TaskChangeSerializer(serializers.ModelSerializer):
    """One change of a task: who (via admin, api, python, code or runner; by whom), when, and
    each changed field as [old, new], the handler masked."""

    class Meta:
        model = TaskChange
        fields = ("id", "task_id", "at", "action", "via", "by", "revision", "changes")
        read_only_fields = fields


class NextRunsQuerySerializer(serializers.Serializer):
    n = serializers.IntegerField(
        min_value=1, max_value=MAX_NEXT_RUNS, default=DEFAULT_NEXT_RUNS, help_text="How many fire times."
    )


class FireTimeSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="The fire time in UTC.")
    local = serializers.CharField(help_text="The same instant on the task's clock, with its UTC offset.")


class NextRunSerializer(FireTimeSerializer):
    due = serializers.DateTimeField(
        help_text="When it comes due, in UTC: the fire time plus the task's jitter."
    )
    runs = serializers.BooleanField(help_text="False for a fire time the task's pause keeps from running.")


class NextRunsSerializer(serializers.Serializer):
    """A task's next fire times on its cron (or its one run_at) and timezone, inside its active
    window, daylight saving time applied."""

    task_id = serializers.CharField()
    cron = serializers.CharField(help_text="Empty for a one-shot task.")
    run_at = serializers.DateTimeField(allow_null=True, help_text="A one-shot task's instant.")
    timezone = serializers.CharField(help_text="IANA name; empty is UTC.")
    starts_at = serializers.DateTimeField(allow_null=True, help_text="No fire time before it.")
    ends_at = serializers.DateTimeField(allow_null=True, help_text="No fire time at or after it.")
    jitter_seconds = serializers.IntegerField()
    enabled = serializers.BooleanField(help_text="A paused task has fire times but does not run them.")
    disabled_until = serializers.DateTimeField(allow_null=True, help_text="When its pause ends.")
    next_runs = NextRunSerializer(many=True)


class BackfilledSerializer(serializers.Serializer):
    """What a backfill found: the fire times without an execution, and what it created of them."""

    task_id = serializers.CharField()
    dry_run = serializers.BooleanField(help_text="True: nothing was written.")
    count = serializers.IntegerField(help_text="How many fire times a dry run found, or this call created.")
    fire_times = FireTimeSerializer(many=True)
    executions = ExecutionSerializer(many=True, help_text="The executions created, oldest first.")


class TaskHistorySerializer(serializers.Serializer):
    """A window of a task's changes, newest first."""

    count = serializers.IntegerField(help_text="How many changes the task's history holds.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = TaskChangeSerializer(many=True)


class TriggeredSerializer(serializers.Serializer):
    """What trigger-many answers: how many executions it created, and each execution in order."""

    created = serializers.IntegerField(help_text="How many of the executions this call created.")
    executions = ExecutionSerializer(many=True)


class ExecutionEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ExecutionEvent
        fields = ("at", "from_status", "to_status", "reason", "node", "attempt", "result", "error")
        read_only_fields = fields


class ExecutionDetailSerializer(ExecutionSerializer):
    """The safe projection with the state history, oldest first."""

    events = ExecutionEventSerializer(many=True, read_only=True)

    class Meta(ExecutionSerializer.Meta):
        fields = (*ExecutionSerializer.Meta.fields, "events")
        read_only_fields = fields


class RunnerSerializer(serializers.ModelSerializer):
    """A runner process and its state on the database clock (the rule of scheduler_status)."""

    state = serializers.SerializerMethodField(help_text="alive, silent or stopped.")

    class Meta:
        model = Runner
        fields: tuple[str, ...] = (
            "node_id",
            "state",
            "host",
            "pid",
            "version",
            "started_at",
            "last_seen_at",
            "silent_after",
            "stopped_at",
        )
        read_only_fields: tuple[str, ...] = fields

    def get_state(self, runner: Runner) -> str:
        return str(getattr(runner, "state", ""))


class LogSerializer(serializers.ModelSerializer):
    class Meta:
        model = ExecutionLog
        fields = ("id", *LOG_FIELDS)
        read_only_fields = fields


@one_object
class LogPageSerializer(serializers.Serializer):
    """A page of log rows, newest finished_at first."""

    count = serializers.IntegerField(
        help_text="How many log rows match, when count_exact; otherwise more than this match."
    )
    count_exact = serializers.BooleanField(
        help_text=f"False when counting stopped {LOG_COUNT_AHEAD:,} rows past this page's first one."
    )
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = LogSerializer(many=True)


class RepairSerializer(serializers.Serializer):
    occurrence_id = serializers.UUIDField()
    logs = LogSerializer(many=True)


class TaskQuerySerializer(serializers.Serializer):
    enabled = serializers.BooleanField(required=False, allow_null=True, default=None)
    search = serializers.CharField(
        max_length=200, required=False, allow_blank=True, help_text="Part of the id or the name."
    )


class LogQuerySerializer(serializers.Serializer):
    task_id = serializers.CharField(max_length=128, required=False)
    status = serializers.ChoiceField(choices=Status.values, required=False)
    trigger_type = serializers.ChoiceField(choices=TriggerType.values, required=False)
    trigger_source = serializers.CharField(max_length=200, required=False, allow_blank=True)
    started_after = serializers.DateTimeField(required=False, help_text="started_at >= this instant.")
    started_before = serializers.DateTimeField(required=False, help_text="started_at < this instant.")
    page = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=1)
    page_size = serializers.IntegerField(min_value=1, max_value=MAX_PAGE_SIZE, default=20)


class ErrorSerializer(serializers.Serializer):
    """Every error response."""

    code = serializers.CharField(
        help_text="scheduler:NNN for scheduler errors; DRF's code (not_authenticated, permission_denied, ...) otherwise."
    )
    message = serializers.CharField()
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Messages per field, dotted for nested ones (retry.max_attempts); '' is the object itself.",
    )
    correlation_id = serializers.CharField(
        required=False, help_text="5xx only: quote it to find the details in the server log."
    )
