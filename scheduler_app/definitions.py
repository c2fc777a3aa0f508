"""Validation and normalisation of task definitions (the dict users write).

Also the checks every way in shares (Python, REST API, admin form): JSON text is read
with ``parse_json`` and values no database could store are found by ``check_json``.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from scheduler_app import cron, schedule
from scheduler_app.conf import scheduler_settings
from scheduler_app.exceptions import InvalidCron, InvalidDefinition
from scheduler_app.values import is_int, short_text

# \Z, not $: "$" also matches before a final newline.
ID_PATTERN = re.compile(r"^[-a-zA-Z0-9_]{1,128}\Z")
OVERLAP_CHOICES = ("skip", "buffer_one")
MISFIRE_POLICIES = ("coalesce", "run_all")
# The most a task's occurrences may be shifted, whatever its interval: a week.
MAX_JITTER_SECONDS = 7 * 86400
# Instants a task may name (run_at, starts_at, ends_at).
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
INSTANTS = ("run_at", "starts_at", "ends_at")
MAX_ATTEMPTS = 100
MAX_NAME_LENGTH = 200
MAX_CRON_LENGTH = 200
# A definition (or a REST request body) as compact JSON, and its nesting (MySQL stops at 100).
MAX_JSON_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32
MAX_REPORTED = 20

FIELDS = (
    "id",
    "name",
    "description",
    "cron",
    "run_at",
    "timezone",
    "starts_at",
    "ends_at",
    "jitter_seconds",
    "enabled",
    "delete_after_run",
    "idempotent",
    "retry",
    "params",
    "handler",
    "max_concurrency",
    "overlap",
    "misfire_grace_seconds",
    "misfire_policy",
)
UPDATABLE = frozenset(FIELDS) - {"id"}
# The Task fields a definition sets: "retry" is stored as two columns.
MODEL_FIELDS = tuple(
    column
    for field in FIELDS
    if field != "id"
    for column in (("retry_max_attempts", "retry_backoff") if field == "retry" else (field,))
)
CLEARABLE = frozenset({"retry", "handler", "timezone", "cron", *INSTANTS})

Errors = dict[str, list[str]]


def parse_json(text: str) -> Any:
    """Read JSON text; ValueError when it is not JSON (NaN and Infinity are not) or nests past the stack."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"Nested too deeply (at most {MAX_JSON_DEPTH} levels).") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_json(value: Any, path: str, errors: Errors, depth: int = 0) -> None:
    """Collect the places in ``value`` that PostgreSQL, MySQL or SQLite could not store as sent.

    NUL characters and unpaired surrogates in strings or keys, numbers that
    are not finite, and nesting deeper than MAX_JSON_DEPTH.
    """
    if len(errors) >= MAX_REPORTED:
        return
    if depth > MAX_JSON_DEPTH:
        errors.setdefault(path, []).append(f"Nested too deeply (at most {MAX_JSON_DEPTH} levels).")
    elif isinstance(value, str):
        if problem := _text_problem(value):
            errors.setdefault(path, []).append(problem)
    elif isinstance(value, float) and not math.isfinite(value):
        errors.setdefault(path, []).append("Must be a finite number.")
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{_printable(key)}" if path else _printable(key)
            if isinstance(key, str) and (problem := _text_problem(key)):
                errors.setdefault(name, []).append(f"Key: {problem}")
            check_json(item, name, errors, depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(item, f"{path}.{index}" if path else str(index), errors, depth + 1)


def _text_problem(text: str) -> str:
    if "\x00" in text:
        return "Must not contain NUL characters."
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "Must not contain unpaired surrogates."
    return ""


def _printable(key: Any) -> str:
    """A key as error paths show it: NUL and unpaired surrogates escaped."""
    return str(key).replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _check_storable(data: dict[str, Any]) -> None:
    """Refuse, before any other check, values no database can store and definitions over MAX_JSON_BYTES."""
    errors: Errors = {}
    check_json(data, "", errors)
    if not errors:
        size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8"))
        if size > MAX_JSON_BYTES:
            errors[""] = [f"The definition is larger than {MAX_JSON_BYTES} bytes as JSON."]
    raise_if_errors(errors)


def is_json(value: Any) -> bool:
    """Whether ``value`` is JSON as Python holds it (NaN and Infinity are not)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _check_text(errors: Errors, field: str, value: Any, max_length: int) -> None:
    if not isinstance(value, str):
        errors.setdefault(field, []).append("Must be a string.")
    elif len(value) > max_length:
        errors.setdefault(field, []).append(f"At most {max_length} characters.")


def _check_bool(errors: Errors, field: str, value: Any) -> None:
    if not isinstance(value, bool):
        errors.setdefault(field, []).append("Must be true or false.")


def normalise_retry(value: Any, errors: Errors) -> tuple[int, list[int]]:
    """Return (max_attempts, backoff) from a retry dict; None means no retry."""
    if value is None:
        return 1, []
    if not isinstance(value, dict):
        errors.setdefault("retry", []).append("Must be an object with max_attempts and backoff.")
        return 1, []
    unknown = set(value) - {"max_attempts", "backoff"}
    if unknown:
        errors.setdefault("retry", []).append(f"Unknown keys: {', '.join(sorted(map(str, unknown)))}.")
    attempts = value.get("max_attempts", 1)
    if not is_int(attempts) or not 1 <= attempts <= MAX_ATTEMPTS:
        errors.setdefault("retry.max_attempts", []).append(f"Must be an integer from 1 to {MAX_ATTEMPTS}.")
        attempts = 1
    backoff = value.get("backoff", [])
    if isinstance(backoff, (int, float)) and not isinstance(backoff, bool):
        backoff = [backoff]
    if not isinstance(backoff, list) or not all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b <= 86400 * 7 for b in backoff
    ):
        errors.setdefault("retry.backoff", []).append(
            "Must be a list of non-negative numbers of seconds (at most one week each)."
        )
        backoff = []
    if len(backoff) > MAX_ATTEMPTS:
        errors.setdefault("retry.backoff", []).append(f"At most {MAX_ATTEMPTS} values.")
    return attempts, [int(b) if float(b).is_integer() else b for b in backoff]


def _check_handler(errors: Errors, value: Any) -> None:
    if value is None:
        return
    from scheduler_app.handlers import registry

    if not isinstance(value, dict):
        errors.setdefault("handler", []).append("Must be an object with a kind, or null.")
        return
    kind = value.get("kind")
    handler = registry.get(kind) if isinstance(kind, str) else None
    if handler is None:
        known = ", ".join(registry.kinds()) or "none"
        errors.setdefault("handler.kind", []).append(
            f"Unknown handler kind {short_text(kind)} (known: {known})."
        )
        return
    if not is_json(value):
        errors.setdefault("handler", []).append("Must be JSON.")
        return
    for field, messages in handler.validate(value).items():
        errors.setdefault(f"handler.{field}" if field else "handler", []).extend(messages)


def validate_fields(data: dict[str, Any], errors: Errors) -> dict[str, Any]:
    """Check the given definition fields; return model field values for those present."""
    values: dict[str, Any] = {}
    if "id" in data:
        task_id = data["id"]
        if not isinstance(task_id, str) or not ID_PATTERN.match(task_id):
            errors.setdefault("id", []).append(
                "Must be 1-128 characters: letters, digits, hyphens and underscores."
            )
        else:
            values["id"] = task_id
    for field, limit in (("name", MAX_NAME_LENGTH), ("description", 10_000)):
        if field in data:
            _check_text(errors, field, data[field], limit)
            values[field] = data[field]
    if "cron" in data or "timezone" in data:
        expression = data.get("cron") or ""
        zone = data.get("timezone") or ""
        if not isinstance(expression, str):
            errors.setdefault("cron", []).append("Must be a string of 5 fields.")
        elif len(expression) > MAX_CRON_LENGTH:
            errors.setdefault("cron", []).append(f"At most {MAX_CRON_LENGTH} characters.")
        elif not isinstance(zone, str):
            errors.setdefault("timezone", []).append("Must be an IANA timezone name.")
        else:
            try:
                # An empty expression is a one-shot task's (run_at): only its zone is checked.
                cron.validate(expression, zone) if expression.strip() else cron.validate_timezone(zone)
            except InvalidCron as exc:
                for field, messages in exc.errors.items():
                    errors.setdefault(field, []).extend(messages)
        if "cron" in data:
            values["cron"] = " ".join(expression.split()) if isinstance(expression, str) else expression
        if "timezone" in data:
            values["timezone"] = zone
    for field in INSTANTS:
        if field in data:
            values[field] = _instant(errors, field, data[field])
    if "jitter_seconds" in data:
        value = data["jitter_seconds"]
        if not is_int(value) or not 0 <= value <= MAX_JITTER_SECONDS:
            errors.setdefault("jitter_seconds", []).append(
                f"Must be an integer number of seconds from 0 to {MAX_JITTER_SECONDS}."
            )
        values["jitter_seconds"] = value
    if "misfire_policy" in data:
        if data["misfire_policy"] not in MISFIRE_POLICIES:
            errors.setdefault("misfire_policy", []).append(f"Must be one of: {', '.join(MISFIRE_POLICIES)}.")
        values["misfire_policy"] = data["misfire_policy"]
    for field in ("enabled", "delete_after_run", "idempotent"):
        if field in data:
            _check_bool(errors, field, data[field])
            values[field] = data[field]
    if "retry" in data:
        values["retry_max_attempts"], values["retry_backoff"] = normalise_retry(data["retry"], errors)
    if "params" in data:
        params = data["params"] if data["params"] is not None else {}
        if not isinstance(params, dict) or not is_json(params):
            errors.setdefault("params", []).append("Must be a JSON object.")
        values["params"] = params
    if "handler" in data:
        _check_handler(errors, data["handler"])
        values["handler"] = data["handler"]
    if "max_concurrency" in data:
        value = data["max_concurrency"]
        if not is_int(value) or not 1 <= value <= 1000:
            errors.setdefault("max_concurrency", []).append("Must be an integer from 1 to 1000.")
        values["max_concurrency"] = value
    if "overlap" in data:
        if data["overlap"] not in OVERLAP_CHOICES:
            errors.setdefault("overlap", []).append(f"Must be one of: {', '.join(OVERLAP_CHOICES)}.")
        values["overlap"] = data["overlap"]
    if "misfire_grace_seconds" in data:
        value = data["misfire_grace_seconds"]
        if value is not None and (not is_int(value) or not 1 <= value <= 86400 * 31):
            errors.setdefault("misfire_grace_seconds", []).append(
                "Must be null or an integer number of seconds from 1 to 31 days."
            )
        elif value is not None and value >= (_retention_seconds() or math.inf):
            # A runner looking back that far could find a fire time whose execution retention deleted.
            errors.setdefault("misfire_grace_seconds", []).append(
                "Must be shorter than the journal's retention (JOURNAL_RETENTION_DAYS)."
            )
        values["misfire_grace_seconds"] = value
    return values


def _retention_seconds() -> int | None:
    days = scheduler_settings.JOURNAL_RETENTION_DAYS
    return int(days) * 86400 if is_int(days) and days > 0 else None


def _instant(errors: Errors, field: str, value: Any) -> datetime | None:
    """A timezone-aware instant, given as a datetime or as ISO 8601 text with an offset; in UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            errors.setdefault(field, []).append("Must be an ISO 8601 date and time with an offset.")
            return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        errors.setdefault(field, []).append("Must be a timezone-aware date and time.")
        return None
    if not EARLIEST <= value < LATEST:
        errors.setdefault(field, []).append("Must be between the years 2000 and 9000.")
        return None
    return value.astimezone(UTC)


def check_schedule(task: dict[str, Any], errors: Errors, now: datetime) -> None:
    """Check how the fields of a whole task (model field values) fit together: a cron expression or
    a run_at, not both; a window that is not empty and holds a fire time (with both bounds; one
    bound alone may end a task's runs); a jitter shorter than the shortest interval."""
    if errors.keys() & {"cron", "timezone", *INSTANTS, "jitter_seconds"}:
        return
    expression, run_at = task.get("cron") or "", task.get("run_at")
    if expression and run_at is not None:
        errors.setdefault("run_at", []).append("Give cron or run_at, not both.")
        return
    if not expression and run_at is None:
        errors.setdefault("cron", []).append(
            "A cron expression, or a run_at for a one-shot task, is required."
        )
        return
    starts_at, ends_at = task.get("starts_at"), task.get("ends_at")
    if starts_at is not None and ends_at is not None and ends_at <= starts_at:
        errors.setdefault("ends_at", []).append("Must be after starts_at.")
        return
    # A schedule that can never fire inside its window is a mistake, not a task that waits.
    if run_at is not None:
        if starts_at is not None and run_at < starts_at:
            errors.setdefault("run_at", []).append("Must be at or after starts_at: it would never fire.")
        if ends_at is not None and run_at >= ends_at:
            errors.setdefault("run_at", []).append("Must be before ends_at: it would never fire.")
    elif starts_at is not None and ends_at is not None:
        zone = task.get("timezone") or ""
        try:
            first: datetime | None = cron.next_fire_time(
                expression, zone, starts_at - schedule.ONE_MICROSECOND
            )
        except ValueError:
            first = None
        if first is None or first >= ends_at:
            errors.setdefault("ends_at", []).append(
                "The window from starts_at until ends_at holds no fire time of the cron expression "
                f"({_utc_text(starts_at)} to {_utc_text(ends_at)}, in {zone or 'UTC'}): it would never fire."
            )
    jitter = task.get("jitter_seconds") or 0
    if jitter and expression:
        interval = schedule.shortest_interval(expression, task.get("timezone") or "", now)
        if interval is not None and jitter >= interval.total_seconds():
            errors.setdefault("jitter_seconds", []).append(
                f"Must be shorter than the shortest interval between fire times ({interval.total_seconds():g} s)."
            )


def _utc_text(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def validate_definition(data: Any) -> dict[str, Any]:
    """Validate a whole definition; return the model field values or raise InvalidDefinition."""
    if not isinstance(data, dict):
        raise InvalidDefinition("A task definition must be an object.", errors={"": ["Must be an object."]})
    _check_storable(data)
    errors: Errors = {}
    unknown = sorted(str(key) for key in data if key not in FIELDS)
    if unknown:
        errors[""] = [f"Unknown fields: {', '.join(short_text(k) for k in unknown)}."]
    if "id" not in data:
        errors.setdefault("id", []).append("This field is required.")
    values = validate_fields(data, errors)
    check_schedule(values, errors, datetime.now(UTC))
    raise_if_errors(errors)
    values.setdefault("name", values["id"])
    return values


def validate_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """Validate a partial update; None clears retry, handler and timezone."""
    _check_storable(changes)
    errors: Errors = {}
    unknown = sorted(str(key) for key in changes if key not in UPDATABLE)
    if unknown:
        errors[""] = [f"Unknown or read-only fields: {', '.join(short_text(k) for k in unknown)}."]
    for key, value in changes.items():
        if value is None and key in UPDATABLE and key not in CLEARABLE and key != "misfire_grace_seconds":
            errors.setdefault(key, []).append("Cannot be null.")
    values = validate_fields({k: v for k, v in changes.items() if k in UPDATABLE}, errors)
    raise_if_errors(errors)
    return values


def raise_if_errors(errors: Errors) -> None:
    if not errors:
        return
    cron_fields = {"cron", "timezone"}
    if set(errors) <= cron_fields:
        raise InvalidCron("The cron expression or timezone is invalid.", errors=errors)
    raise InvalidDefinition("The task definition is invalid.", errors=errors)
