"""System checks for SCHEDULER_APP, run by manage.py check and before run_scheduler.

Each condition has its own id in CHECKS; docs/operations.md lists them all.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, router
from django.utils.module_loading import import_string

from scheduler_app import jobs
from scheduler_app.conf import DEFAULTS, scheduler_settings
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.handlers.hooks import HOOK_NAMES
from scheduler_app.handlers.v8 import v8_available
from scheduler_app.values import is_number

# The tag of these checks: `manage.py check --tag scheduler_app` runs them alone, and run_scheduler,
# which runs only tagged checks (management/base.py), runs them.
TAG = "scheduler_app"
HOST_NAME = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*\.?$", re.IGNORECASE)


@dataclass(frozen=True)
class Check:
    """One condition: its level, its message (a str.format template) and how to fix it."""

    level: type[Error] | type[Warning]
    message: str
    hint: str


def _known(keys: dict[str, Any]) -> str:
    return f"Known keys: {', '.join(sorted(keys))}."


CHECKS: dict[str, Check] = {
    "scheduler_app.E001": Check(Error, "SCHEDULER_APP must be a dict.", "Set SCHEDULER_APP = {...}."),
    "scheduler_app.E002": Check(
        Error,
        "SCHEDULER_APP['TASKS'] is invalid: {detail}",
        "Fix the definitions; run_scheduler refuses to start until then.",
    ),
    "scheduler_app.E003": Check(
        Error,
        "SCHEDULER_APP['HANDLERS'][{name!r}] cannot be imported: {path!r} ({error}).",
        "Give the dotted path of a Handler class, such as myproject.handlers.CommandHandler.",
    ),
    "scheduler_app.E004": Check(
        Error,
        "SCHEDULER_APP['LOG_DATABASE'] names an unknown database alias {alias!r}.",
        "Use an alias from DATABASES.",
    ),
    "scheduler_app.E005": Check(Error, "Unknown SCHEDULER_APP keys: {keys}.", _known(DEFAULTS)),
    "scheduler_app.E006": Check(
        Error, "SCHEDULER_APP['TICK_INTERVAL'] must be a positive number.", "Give seconds, such as 1.0."
    ),
    "scheduler_app.E007": Check(
        Error, "SCHEDULER_APP['LEASE_SECONDS'] must be a positive number.", "Give seconds, such as 300."
    ),
    "scheduler_app.E008": Check(
        Error,
        "SCHEDULER_APP['WORKERS'] must be a positive integer or None.",
        "Give a thread count, such as 16, or None for the default.",
    ),
    "scheduler_app.E009": Check(
        Error,
        "SCHEDULER_APP['MISFIRE_GRACE_SECONDS'] must be a number >= 1.",
        "Give seconds, such as 60.",
    ),
    "scheduler_app.E010": Check(
        Error, "SCHEDULER_APP['DRAIN_SECONDS'] must be a positive number.", "Give seconds, such as 30."
    ),
    "scheduler_app.E011": Check(
        Error,
        "SCHEDULER_APP['MAX_LOGS'] must be None or a positive integer.",
        "Give a row count, such as 100000, or None to keep every log row.",
    ),
    "scheduler_app.E012": Check(
        Error,
        "SCHEDULER_APP['RETENTION_DAYS'] must be None or a positive integer.",
        "Give a number of days, such as 30, or None to keep log rows of any age.",
    ),
    "scheduler_app.E013": Check(
        Error, "SCHEDULER_APP['HTTP'] must be a dict.", 'Set "HTTP": {...} with the keys to change.'
    ),
    "scheduler_app.E014": Check(
        Error, "Unknown SCHEDULER_APP['HTTP'] keys: {keys}.", _known(DEFAULTS["HTTP"])
    ),
    "scheduler_app.E015": Check(
        Error,
        "SCHEDULER_APP['HTTP']['TIMEOUT'] must be a number of seconds above 0 and at most 3600.",
        "Give seconds, such as 30.",
    ),
    "scheduler_app.E016": Check(
        Error,
        "SCHEDULER_APP['HTTP']['MAX_RESPONSE_BYTES'] must be a positive integer.",
        "Give bytes, such as 1048576.",
    ),
    "scheduler_app.E017": Check(
        Error,
        "SCHEDULER_APP['HTTP']['RESULT_MAX_BYTES'] must be a positive integer.",
        "Give bytes, such as 65536.",
    ),
    "scheduler_app.E018": Check(
        Error, "SCHEDULER_APP['HTTP']['ALLOW_PRIVATE_NETWORKS'] must be True or False.", "Give True or False."
    ),
    "scheduler_app.E019": Check(
        Error,
        "SCHEDULER_APP['HTTP']['ALLOWED_NETWORKS'] must be a list.",
        'Give a list such as ["10.1.0.0/16", "fd00::/8", "billing.internal"].',
    ),
    "scheduler_app.E020": Check(
        Error,
        "SCHEDULER_APP['HTTP']['ALLOWED_NETWORKS'] holds {entry!r}, which is neither a CIDR nor a host name.",
        'Give a list such as ["10.1.0.0/16", "fd00::/8", "billing.internal"].',
    ),
    "scheduler_app.E021": Check(
        Error, "SCHEDULER_APP['JS'] must be a dict.", 'Set "JS": {...} with the keys to change.'
    ),
    "scheduler_app.E022": Check(Error, "Unknown SCHEDULER_APP['JS'] keys: {keys}.", _known(DEFAULTS["JS"])),
    "scheduler_app.E023": Check(
        Error,
        "SCHEDULER_APP['JS']['TIMEOUT'] must be a number of seconds above 0 and at most 3600.",
        "Give seconds, such as 30.",
    ),
    "scheduler_app.E024": Check(
        Error,
        "SCHEDULER_APP['JS']['MEMORY_LIMIT_MB'] must be a positive integer.",
        "Give megabytes, such as 128.",
    ),
    "scheduler_app.E025": Check(
        Error,
        "SCHEDULER_APP['JS']['RESULT_MAX_BYTES'] must be a positive integer.",
        "Give bytes, such as 65536.",
    ),
    "scheduler_app.E026": Check(
        Error,
        "SCHEDULER_APP['HOOKS'] must be a dict.",
        'Map hook names to dotted paths, such as {"on_task_execute": "myproject.tasks.run"}.',
    ),
    "scheduler_app.E027": Check(
        Error, "Unknown SCHEDULER_APP['HOOKS'] names: {names}.", f"Known hooks: {', '.join(HOOK_NAMES)}."
    ),
    "scheduler_app.E028": Check(
        Error,
        "SCHEDULER_APP['HOOKS'][{name!r}] cannot be imported: {path!r} ({error}).",
        "Give the dotted path of a function that takes one event, or the function itself.",
    ),
    "scheduler_app.E029": Check(
        Error,
        "SCHEDULER_APP['HANDLERS'] must be a dict.",
        'Map handler kinds to dotted paths of Handler classes, such as {"command": "myproject.handlers.CommandHandler"}.',
    ),
    "scheduler_app.E030": Check(
        Error,
        "SCHEDULER_APP['API_PERMISSION_CLASSES'] must be None or a list.",
        'Give a list such as ["scheduler_app.api.permissions.HasModelPermissions"], '
        "or None for staff users with model permissions.",
    ),
    "scheduler_app.E031": Check(
        Error,
        "SCHEDULER_APP['API_PERMISSION_CLASSES'] holds {entry!r}, which is not an importable DRF permission class.",
        "Give the dotted path of a subclass of rest_framework.permissions.BasePermission.",
    ),
    "scheduler_app.E032": Check(
        Error,
        "USE_TZ is False: the scheduler stores and compares aware datetimes (cron timezones, leases).",
        "Set USE_TZ = True (Django's default since 5.0).",
    ),
    "scheduler_app.E033": Check(
        Error,
        "SCHEDULER_APP['TICK_INTERVAL'] ({tick:g} s) is not below LEASE_SECONDS / 3 ({third:g} s): "
        "leases are renewed by the tick loop, so running attempts would lose them.",
        "Keep TICK_INTERVAL well below LEASE_SECONDS / 3, such as 1.0 with LEASE_SECONDS 300.",
    ),
    "scheduler_app.E035": Check(
        Error, "SCHEDULER_APP['HOOK_TIMEOUT'] must be a positive number.", "Give seconds, such as 3600."
    ),
    "scheduler_app.E036": Check(
        Error,
        "SCHEDULER_APP['FUNCTIONS'] must be a dict.",
        'Map function names to dotted paths, such as {"send-invoices": "billing.invoices.send"}.',
    ),
    "scheduler_app.E037": Check(
        Error,
        "SCHEDULER_APP['FUNCTIONS'][{name!r}] cannot be imported: {path!r} ({error}).",
        "Give the dotted path of a function that takes one event, or the function itself.",
    ),
    "scheduler_app.E038": Check(
        Error,
        "Two functions are registered under the name {name!r}: {paths}.",
        "Give each @job and each FUNCTIONS entry a name of its own.",
    ),
    "scheduler_app.E041": Check(
        Error,
        "SCHEDULER_APP['TASK_MODULES'] must be a list of module names.",
        'Give dotted module names, such as ["reports.tasks"], for tasks outside the installed apps.',
    ),
    "scheduler_app.E042": Check(
        Error,
        "SCHEDULER_APP['TASK_MODULES'] holds {module!r}, which cannot be imported ({error}).",
        "Give the dotted name of a module on the Python path, such as reports.tasks.",
    ),
    "scheduler_app.E044": Check(
        Error,
        "SCHEDULER_APP['JOURNAL_RETENTION_DAYS'] must be None or a positive integer.",
        "Give a number of days, such as 90, or None to keep the journal whole.",
    ),
    "scheduler_app.E045": Check(
        Error,
        "SCHEDULER_APP['JOURNAL_RETENTION_DAYS'] ({days} days) is not longer than MISFIRE_GRACE_SECONDS"
        " ({grace} s).",
        "Keep executions longer than a runner may still look back for a missed fire time: give more days,"
        " or a shorter grace.",
    ),
    "scheduler_app.E046": Check(
        Error, "SCHEDULER_APP['ALERTS'] must be a dict.", 'Set "ALERTS": {...} with the keys to change.'
    ),
    "scheduler_app.E047": Check(
        Error, "Unknown SCHEDULER_APP['ALERTS'] keys: {keys}.", _known(DEFAULTS["ALERTS"])
    ),
    "scheduler_app.E048": Check(
        Error,
        "SCHEDULER_APP['ALERTS']['MAIL_ADMINS'] must be a list of statuses among \"unknown\" and \"failed\".",
        'Give ["unknown"], ["unknown", "failed"], or [] to send no mail.',
    ),
    "scheduler_app.E049": Check(
        Error,
        "SCHEDULER_APP['ALERTS']['EVERY_SECONDS'] must be a positive number.",
        "Give seconds, such as 300: at most one mail per status that often, across the cluster.",
    ),
    "scheduler_app.E050": Check(
        Error,
        "SCHEDULER_APP['ALERTS']['BASE_URL'] must be empty or an http(s) URL.",
        'Give the address the admin is served under, such as "https://ops.example.com", or "" for paths.',
    ),
    "scheduler_app.E043": Check(
        Error,
        "SCHEDULER_APP['PREPARED_STATEMENTS'] must be True, False or None.",
        "Leave it None (prepared unless DISABLE_SERVER_SIDE_CURSORS is set), or give False behind a"
        " transaction-mode pooler that does not keep prepared statements.",
    ),
    "scheduler_app.W001": Check(
        Warning,
        "SCHEDULER_APP['REDIS_URL'] is not a redis://, rediss:// or unix:// URL; wake-ups will fail.",
        "Use redis://host:6379/0 or leave it unset (runners then find work at their next tick).",
    ),
    "scheduler_app.W002": Check(
        Warning,
        "SCHEDULER_APP['TICK_INTERVAL'] ({tick:g} s) is not well below LEASE_SECONDS / 3 ({third:g} s): "
        "a slow tick or a database hiccup can make a running attempt lose its lease.",
        "Keep TICK_INTERVAL at most LEASE_SECONDS / 6, such as 1.0 with LEASE_SECONDS 300.",
    ),
    "scheduler_app.W003": Check(
        Warning,
        "DATABASES[{alias!r}] is SQLite without OPTIONS 'transaction_mode': 'IMMEDIATE': "
        "runners sharing it fail claims with 'database is locked' and retry them.",
        'Set "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20} (docs/operations.md, SQLite).',
    ),
    "scheduler_app.W005": Check(
        Warning,
        "SCHEDULER_APP['TASKS'] declares js tasks ({ids}), but mini-racer is not installed: "
        "their attempts on this node fail with scheduler:033.",
        "Install django-scheduler-app[js] on every node that runs run_scheduler; "
        "nodes that only serve the admin or the API do not need it.",
    ),
    "scheduler_app.W004": Check(
        Warning,
        "The database holds enabled js tasks ({ids}), but mini-racer is not installed: "
        "their attempts on this node fail with scheduler:033.",
        "Install django-scheduler-app[js] on every node that runs run_scheduler; "
        "nodes that only serve the admin or the API do not need it.",
    ),
    "scheduler_app.E039": Check(
        Error,
        "Declared tasks ({ids}) have the ids of tasks created by register(), the admin or the API: "
        "run_scheduler refuses to take them over.",
        "Rename the declarations (TASKS or @job), or delete those tasks so that the next runner start "
        "creates them from their declarations.",
    ),
    "scheduler_app.E040": Check(
        Error,
        "@job declarations are invalid: {detail}",
        "Fix the @job(...) arguments; run_scheduler refuses to start until then.",
    ),
}

# A problem found: the id of its condition and the values its message names.
Problem = tuple[str, dict[str, Any]]


def _is_positive_number(value: Any) -> bool:
    return is_number(value) and value > 0


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_timeout(value: Any) -> bool:
    return is_number(value) and 0 < value <= 3600


# Values that are wrong on their own: (id, setting, key inside a dict setting or None, test).
VALUE_RULES: tuple[tuple[str, str, str | None, Callable[[Any], bool]], ...] = (
    ("scheduler_app.E006", "TICK_INTERVAL", None, _is_positive_number),
    ("scheduler_app.E007", "LEASE_SECONDS", None, _is_positive_number),
    ("scheduler_app.E008", "WORKERS", None, lambda value: value is None or _is_positive_int(value)),
    ("scheduler_app.E009", "MISFIRE_GRACE_SECONDS", None, lambda value: is_number(value) and value >= 1),
    ("scheduler_app.E010", "DRAIN_SECONDS", None, _is_positive_number),
    ("scheduler_app.E011", "MAX_LOGS", None, lambda value: value is None or _is_positive_int(value)),
    ("scheduler_app.E012", "RETENTION_DAYS", None, lambda value: value is None or _is_positive_int(value)),
    (
        "scheduler_app.E044",
        "JOURNAL_RETENTION_DAYS",
        None,
        lambda value: value is None or _is_positive_int(value),
    ),
    ("scheduler_app.E035", "HOOK_TIMEOUT", None, _is_positive_number),
    (
        "scheduler_app.E043",
        "PREPARED_STATEMENTS",
        None,
        lambda value: value is None or isinstance(value, bool),
    ),
    (
        "scheduler_app.E048",
        "ALERTS",
        "MAIL_ADMINS",
        lambda value: isinstance(value, (list, tuple)) and set(value) <= {"unknown", "failed"},
    ),
    ("scheduler_app.E049", "ALERTS", "EVERY_SECONDS", _is_positive_number),
    (
        "scheduler_app.E050",
        "ALERTS",
        "BASE_URL",
        lambda value: isinstance(value, str) and (not value or value.startswith(("http://", "https://"))),
    ),
    ("scheduler_app.E015", "HTTP", "TIMEOUT", _is_timeout),
    ("scheduler_app.E016", "HTTP", "MAX_RESPONSE_BYTES", _is_positive_int),
    ("scheduler_app.E017", "HTTP", "RESULT_MAX_BYTES", _is_positive_int),
    ("scheduler_app.E018", "HTTP", "ALLOW_PRIVATE_NETWORKS", lambda value: isinstance(value, bool)),
    ("scheduler_app.E019", "HTTP", "ALLOWED_NETWORKS", lambda value: isinstance(value, (list, tuple))),
    ("scheduler_app.E023", "JS", "TIMEOUT", _is_timeout),
    ("scheduler_app.E024", "JS", "MEMORY_LIMIT_MB", _is_positive_int),
    ("scheduler_app.E025", "JS", "RESULT_MAX_BYTES", _is_positive_int),
)

# The dict settings: (setting, id when it is not a dict, id for unknown keys or None).
DICT_SETTINGS: tuple[tuple[str, str, str | None], ...] = (
    ("HTTP", "scheduler_app.E013", "scheduler_app.E014"),
    ("ALERTS", "scheduler_app.E046", "scheduler_app.E047"),
    ("JS", "scheduler_app.E021", "scheduler_app.E022"),
    ("HOOKS", "scheduler_app.E026", None),
    ("HANDLERS", "scheduler_app.E029", None),
    ("FUNCTIONS", "scheduler_app.E036", None),
)


def message(check_id: str, **values: Any) -> CheckMessage:
    """The message of one condition, its template filled with ``values``."""
    check = CHECKS[check_id]
    return check.level(check.message.format(**values), hint=check.hint, id=check_id)


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report each problem of SCHEDULER_APP under the id of its condition."""
    user = getattr(settings, "SCHEDULER_APP", {})
    if not isinstance(user, dict):
        return [message("scheduler_app.E001")]
    return [message(check_id, **values) for check_id, values in _problems(user)]


def _problems(user: dict[str, Any]) -> Iterator[Problem]:
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        yield "scheduler_app.E005", {"keys": ", ".join(unknown)}
    yield from _dict_problems()
    yield from _value_problems()
    yield from _network_problems()
    yield from _hook_problems()
    yield from _path_problems()
    yield from _task_module_problems()
    yield from _task_problems()
    yield from _permission_problems()
    yield from _timing_problems()
    yield from _retention_problems()
    for name, paths in jobs.clashes().items():
        yield "scheduler_app.E038", {"name": name, "paths": ", ".join(paths)}
    if not settings.USE_TZ:
        yield "scheduler_app.E032", {}
    yield from _sqlite_problems()
    alias = scheduler_settings.LOG_DATABASE
    if alias not in settings.DATABASES:
        yield "scheduler_app.E004", {"alias": alias}
    redis_url = scheduler_settings.REDIS_URL
    if redis_url and not str(redis_url).startswith(("redis://", "rediss://", "unix://")):
        yield "scheduler_app.W001", {}


def _dict_problems() -> Iterator[Problem]:
    for name, not_dict, unknown_keys in DICT_SETTINGS:
        value = getattr(scheduler_settings, name)
        if not isinstance(value, dict):
            yield not_dict, {}
        elif unknown_keys is not None:
            unknown = sorted(str(key) for key in set(value) - set(DEFAULTS[name]))
            if unknown:
                yield unknown_keys, {"keys": ", ".join(unknown)}


def _value_problems() -> Iterator[Problem]:
    for check_id, name, key, valid in VALUE_RULES:
        value = getattr(scheduler_settings, name)
        if key is not None:
            # A setting that is not a dict is reported once, by _dict_problems.
            if not isinstance(value, dict):
                continue
            value = value[key]
        if not valid(value):
            yield check_id, {}


def _timing_problems() -> Iterator[Problem]:
    tick, lease = scheduler_settings.TICK_INTERVAL, scheduler_settings.LEASE_SECONDS
    # Values that are wrong on their own are reported by _value_problems.
    if not (_is_positive_number(tick) and _is_positive_number(lease)):
        return
    if tick >= lease / 3:
        yield "scheduler_app.E033", {"tick": tick, "third": lease / 3}
    elif tick > lease / 6:
        yield "scheduler_app.W002", {"tick": tick, "third": lease / 3}


def _retention_problems() -> Iterator[Problem]:
    days, grace = scheduler_settings.JOURNAL_RETENTION_DAYS, scheduler_settings.MISFIRE_GRACE_SECONDS
    # Values that are wrong on their own are reported by _value_problems.
    if _is_positive_int(days) and is_number(grace) and days * 86400 <= grace:
        yield "scheduler_app.E045", {"days": days, "grace": grace}


def _sqlite_problems() -> Iterator[Problem]:
    aliases = dict.fromkeys(["default", scheduler_settings.LOG_DATABASE])
    for alias in aliases:
        database = settings.DATABASES.get(alias)
        if not isinstance(database, dict) or "sqlite" not in str(database.get("ENGINE", "")):
            continue
        options = database.get("OPTIONS") or {}
        mode = options.get("transaction_mode") if isinstance(options, dict) else None
        if str(mode or "").upper() != "IMMEDIATE":
            yield "scheduler_app.W003", {"alias": alias}


def _network_problems() -> Iterator[Problem]:
    http = scheduler_settings.HTTP
    networks = http.get("ALLOWED_NETWORKS") if isinstance(http, dict) else None
    if isinstance(networks, (list, tuple)):
        for entry in networks:
            if not _is_network_or_host(entry):
                yield "scheduler_app.E020", {"entry": entry}


def _is_network_or_host(entry: Any) -> bool:
    if not isinstance(entry, str):
        return False
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return len(entry.strip()) <= 253 and bool(HOST_NAME.match(entry.strip()))
    return True


def _hook_problems() -> Iterator[Problem]:
    hooks = scheduler_settings.HOOKS
    if isinstance(hooks, dict):
        unknown = sorted(set(hooks) - set(HOOK_NAMES))
        if unknown:
            yield "scheduler_app.E027", {"names": ", ".join(unknown)}


def _path_problems() -> Iterator[Problem]:
    groups = (
        ("HOOKS", "scheduler_app.E028"),
        ("HANDLERS", "scheduler_app.E003"),
        ("FUNCTIONS", "scheduler_app.E037"),
    )
    for group, check_id in groups:
        entries = getattr(scheduler_settings, group)
        if not isinstance(entries, dict):
            continue
        for name, path in entries.items():
            if callable(path):
                continue
            error = _import_error(path)
            if error is not None:
                yield check_id, {"name": name, "path": path, "error": error}


def _task_module_problems() -> Iterator[Problem]:
    modules = scheduler_settings.TASK_MODULES
    if not isinstance(modules, (list, tuple)) or not all(isinstance(name, str) and name for name in modules):
        yield "scheduler_app.E041", {}
        return
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            yield "scheduler_app.E042", {"module": module, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _import(path: Any) -> Any:
    """What a dotted path names, or None when it names nothing importable."""
    if not isinstance(path, str):
        return None
    try:
        return import_string(path)
    except Exception:
        return None


def _import_error(path: Any) -> str | None:
    """Why a dotted path cannot be imported (the error its module raised, say), or None when it can."""
    if not isinstance(path, str):
        return "not a dotted path"
    try:
        import_string(path)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def _task_problems() -> Iterator[Problem]:
    from scheduler_app.services import validate_settings_tasks

    try:
        validate_settings_tasks(scheduler_settings.TASKS)
    except InvalidDefinition as exc:
        detail = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.errors.items())
        yield "scheduler_app.E002", {"detail": detail}


def _permission_problems() -> Iterator[Problem]:
    configured = scheduler_settings.API_PERMISSION_CLASSES
    if configured is None:
        return
    if not isinstance(configured, (list, tuple)):
        yield "scheduler_app.E030", {}
        return
    for entry in configured:
        target = _import(entry) if isinstance(entry, str) else entry
        if not _is_permission_class(target):
            yield "scheduler_app.E031", {"entry": entry}


def _is_permission_class(target: Any) -> bool:
    # Imported here: only a project that sets API_PERMISSION_CLASSES needs DRF for its checks.
    from rest_framework.permissions import BasePermission, OperandHolder, SingleOperandHolder

    # DRF also takes composed classes (IsAuthenticated & IsAdminUser), which are not types.
    if isinstance(target, (OperandHolder, SingleOperandHolder)):
        return True
    return isinstance(target, type) and issubclass(target, BasePermission)


# How many task ids a message names before it says "...".
SHOWN_IDS = 5


def _listed(ids: list[str]) -> str:
    return ", ".join(ids[:SHOWN_IDS]) + (", ..." if len(ids) > SHOWN_IDS else "")


@register(TAG)
def check_javascript_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W005: js tasks declared in TASKS where mini-racer (the js extra) is not installed."""
    declared = getattr(settings, "SCHEDULER_APP", {})
    tasks = declared.get("TASKS", []) if isinstance(declared, dict) else []
    if not isinstance(tasks, (list, tuple)) or v8_available():
        return []
    ids = [str(task.get("id")) for task in tasks if isinstance(task, dict) and _is_js(task.get("handler"))]
    return [message("scheduler_app.W005", ids=_listed(ids))] if ids else []


def _is_js(handler: Any) -> bool:
    return isinstance(handler, dict) and handler.get("kind") == "js"


@register(TAG, Tags.database)
def check_javascript_tasks(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """W004: enabled js tasks in the database where mini-racer is not installed; one query, only then."""
    from scheduler_app.models import Task

    alias = router.db_for_read(Task)
    if not databases or alias not in databases or v8_available():
        return []
    tasks = Task.objects.using(alias).filter(enabled=True, handler__kind="js").order_by("id")
    try:
        ids = list(tasks.values_list("id", flat=True)[: SHOWN_IDS + 1])
    except DatabaseError:
        # Not migrated yet (manage.py migrate runs the database checks first): no tasks to run.
        return []
    return [message("scheduler_app.W004", ids=_listed(ids))] if ids else []


@register(TAG)
def check_job_declarations(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E040: @job declarations with invalid fields, or with an id TASKS declares too."""
    from scheduler_app import declarations
    from scheduler_app.services import settings_ids

    try:
        declarations.validate(settings_ids(scheduler_settings.TASKS))
    except InvalidDefinition as exc:
        detail = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.errors.items())
        return [message("scheduler_app.E040", detail=detail)]
    return []


@register(TAG, Tags.database)
def check_declared_collisions(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """E039: declared ids (TASKS or @job) held by tasks that register(), the admin or the API created."""
    from scheduler_app import declarations
    from scheduler_app.models import NO_LONGER_DECLARED, Task
    from scheduler_app.services import settings_ids

    alias = router.db_for_read(Task)
    if not databases or alias not in databases:
        return []
    ids = settings_ids(scheduler_settings.TASKS) | {d.task_id for d in declarations.declared()}
    if not ids:
        return []
    tasks = Task.objects.using(alias).filter(id__in=sorted(ids), declared_in="")
    try:
        taken = list(
            tasks.exclude(disabled_reason=NO_LONGER_DECLARED)
            .order_by("id")
            .values_list("id", flat=True)[: SHOWN_IDS + 1]
        )
    except DatabaseError:
        return []  # not migrated yet, as in check_javascript_tasks
    return [message("scheduler_app.E039", ids=_listed(taken))] if taken else []
