"""System checks for SCHEDULER_APP, run by manage.py check and before run_scheduler."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.utils.module_loading import import_string

from scheduler_app.conf import DEFAULTS, scheduler_settings
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.handlers.hooks import HOOK_NAMES

POSITIVE_NUMBERS = ("TICK_INTERVAL", "LEASE_SECONDS", "WORKERS", "DRAIN_SECONDS")
OPTIONAL_POSITIVE_INTS = ("MAX_LOGS", "RETENTION_DAYS")
HOST_NAME = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*\.?$", re.IGNORECASE)


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
    messages.extend(_check_js())
    messages.extend(_check_http())
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


def _check_js() -> list[CheckMessage]:
    js = scheduler_settings.JS
    if not isinstance(js, dict):
        return [Error("SCHEDULER_APP['JS'] must be a dict.", id="scheduler_app.E001")]
    messages: list[CheckMessage] = []
    if not _is_number(js.get("TIMEOUT")) or not 0 < js["TIMEOUT"] <= 3600:
        messages.append(
            Error(
                "SCHEDULER_APP['JS']['TIMEOUT'] must be a number of seconds above 0 and at most 3600.",
                id="scheduler_app.E001",
            )
        )
    for name in ("MEMORY_LIMIT_MB", "RESULT_MAX_BYTES"):
        value = js.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            messages.append(
                Error(f"SCHEDULER_APP['JS']['{name}'] must be a positive integer.", id="scheduler_app.E001")
            )
    return messages


def _check_http() -> list[CheckMessage]:
    http = scheduler_settings.HTTP
    if not isinstance(http, dict):
        return [Error("SCHEDULER_APP['HTTP'] must be a dict.", id="scheduler_app.E001")]
    messages: list[CheckMessage] = []
    unknown = sorted(str(key) for key in set(http) - set(DEFAULTS["HTTP"]))
    if unknown:
        messages.append(
            Error(
                f"Unknown SCHEDULER_APP['HTTP'] keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS['HTTP']))}.",
                id="scheduler_app.E001",
            )
        )
    if not _is_number(http["TIMEOUT"]) or not 0 < http["TIMEOUT"] <= 3600:
        messages.append(
            Error(
                "SCHEDULER_APP['HTTP']['TIMEOUT'] must be a number of seconds above 0 and at most 3600.",
                id="scheduler_app.E001",
            )
        )
    for name in ("MAX_RESPONSE_BYTES", "RESULT_MAX_BYTES"):
        value = http[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            messages.append(
                Error(f"SCHEDULER_APP['HTTP']['{name}'] must be a positive integer.", id="scheduler_app.E001")
            )
    if not isinstance(http["ALLOW_PRIVATE_NETWORKS"], bool):
        messages.append(
            Error(
                "SCHEDULER_APP['HTTP']['ALLOW_PRIVATE_NETWORKS'] must be True or False.",
                id="scheduler_app.E001",
            )
        )
    networks = http["ALLOWED_NETWORKS"]
    if not isinstance(networks, (list, tuple)):
        messages.append(
            Error("SCHEDULER_APP['HTTP']['ALLOWED_NETWORKS'] must be a list.", id="scheduler_app.E001")
        )
        networks = []
    for entry in networks:
        if not _is_network_or_host(entry):
            messages.append(
                Error(
                    f"SCHEDULER_APP['HTTP']['ALLOWED_NETWORKS'] holds {entry!r}, which is neither a CIDR nor a host name.",
                    hint='Give a list such as ["10.1.0.0/16", "fd00::/8", "billing.internal"].',
                    id="scheduler_app.E001",
                )
            )
    return messages


def _is_network_or_host(entry: Any) -> bool:
    if not isinstance(entry, str):
        return False
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return len(entry.strip()) <= 253 and bool(HOST_NAME.match(entry.strip()))
    return True


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
