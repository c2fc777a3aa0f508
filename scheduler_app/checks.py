"""System checks for SCHEDULER_APP, run by manage.py check and before run_scheduler."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.utils.module_loading import import_string

from scheduler_app.conf import DEFAULTS, scheduler_settings
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.handlers.hooks import HOOK_NAMES

POSITIVE_NUMBERS = ("TICK_INTERVAL", "LEASE_SECONDS", "WORKERS", "DRAIN_SECONDS")
OPTIONAL_POSITIVE_INTS = ("MAX_LOGS", "RETENTION_DAYS")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    user = getattr(settings, "SCHEDULER_APP", {})
    if not isinstance(user, dict):
        return [
            Error("SCHEDULER_APP must be a dict.", hint="Set SCHEDULER_APP = {...}.", id="scheduler_app.E001")
        ]
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        messages.append(
            Error(
                f"Unknown SCHEDULER_APP keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="scheduler_app.E001",
            )
        )
    for name in POSITIVE_NUMBERS:
        value = getattr(scheduler_settings, name)
        if not _is_number(value) or value <= 0:
            messages.append(
                Error(f"SCHEDULER_APP['{name}'] must be a positive number.", id="scheduler_app.E001")
            )
    if not isinstance(scheduler_settings.WORKERS, int) or isinstance(scheduler_settings.WORKERS, bool):
        messages.append(Error("SCHEDULER_APP['WORKERS'] must be an integer.", id="scheduler_app.E001"))
    grace = scheduler_settings.MISFIRE_GRACE_SECONDS
    if not _is_number(grace) or grace < 1:
        messages.append(
            Error("SCHEDULER_APP['MISFIRE_GRACE_SECONDS'] must be a number >= 1.", id="scheduler_app.E001")
        )
    hooks = scheduler_settings.HOOKS
    if isinstance(hooks, dict) and set(hooks) - set(HOOK_NAMES):
        messages.append(
            Error(
                f"Unknown SCHEDULER_APP['HOOKS'] names: {', '.join(sorted(set(hooks) - set(HOOK_NAMES)))}.",
                hint=f"Known hooks: {', '.join(HOOK_NAMES)}.",
                id="scheduler_app.E003",
            )
        )
    for name in OPTIONAL_POSITIVE_INTS:
        value = getattr(scheduler_settings, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            messages.append(
                Error(f"SCHEDULER_APP['{name}'] must be None or a positive integer.", id="scheduler_app.E001")
            )
    messages.extend(_check_tasks())
    messages.extend(_check_paths())
    if scheduler_settings.LOG_DATABASE not in settings.DATABASES:
        messages.append(
            Error(
                f"SCHEDULER_APP['LOG_DATABASE'] names an unknown database alias {scheduler_settings.LOG_DATABASE!r}.",
                hint="Use an alias from DATABASES.",
                id="scheduler_app.E004",
            )
        )
    redis_url = scheduler_settings.REDIS_URL
    if redis_url and not str(redis_url).startswith(("redis://", "rediss://", "unix://")):
        messages.append(
            Warning(
                "SCHEDULER_APP['REDIS_URL'] is not a redis://, rediss:// or unix:// URL; wake-ups will fail.",
                hint="Use redis://host:6379/0 or leave it unset (runners then find work at their next tick).",
                id="scheduler_app.W001",
            )
        )
    return messages


def _check_tasks() -> list[CheckMessage]:
    from scheduler_app.services import validate_declared_tasks

    try:
        validate_declared_tasks(scheduler_settings.TASKS)
    except InvalidDefinition as exc:
        detail = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.errors.items())
        return [
            Error(
                f"SCHEDULER_APP['TASKS'] is invalid: {detail}",
                hint="Fix the definitions; run_scheduler refuses to start until then.",
                id="scheduler_app.E002",
            )
        ]
    return []


def _check_paths() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for group in ("HOOKS", "HANDLERS"):
        entries = getattr(scheduler_settings, group)
        if not isinstance(entries, dict):
            messages.append(Error(f"SCHEDULER_APP['{group}'] must be a dict.", id="scheduler_app.E003"))
            continue
        for name, path in entries.items():
            if callable(path):
                continue
            try:
                import_string(path)
            except ImportError:
                messages.append(
                    Error(
                        f"SCHEDULER_APP['{group}'][{name!r}] cannot be imported: {path!r}.",
                        hint="Give a dotted path to a callable (a class for HANDLERS).",
                        id="scheduler_app.E003",
                    )
                )
    return messages
