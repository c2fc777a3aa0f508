"""The SCHEDULER_APP settings with their defaults, read lazily."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "TICK_INTERVAL": 1.0,
    "LEASE_SECONDS": 300,
    # Worker threads per runner; None: DEFAULT_WORKERS, or SQLITE_WORKERS on SQLite (runner/loop.py).
    "WORKERS": None,
    "NODE_ID": None,
    "MISFIRE_GRACE_SECONDS": 60,
    "DRAIN_SECONDS": 30,
    "MAX_LOGS": None,
    "RETENTION_DAYS": None,
    # Days an ended execution (and its events and log rows) is kept; None: for ever.
    "JOURNAL_RETENTION_DAYS": None,
    "LOG_DATABASE": "default",
    "HTTP": {
        "TIMEOUT": 30,
        "MAX_RESPONSE_BYTES": 1024 * 1024,
        "RESULT_MAX_BYTES": 64 * 1024,
        "ALLOW_PRIVATE_NETWORKS": False,
        "ALLOWED_NETWORKS": [],
    },
    "JS": {"TIMEOUT": 30, "MEMORY_LIMIT_MB": 128, "RESULT_MAX_BYTES": 64 * 1024},
    "REDIS_URL": None,
    "HOOKS": {},
    # Seconds an on_task_execute hook may run before its attempt is cancelled (see HOOK_TIMEOUT).
    "HOOK_TIMEOUT": 3600,
    # Python functions run by the python handler kind: name -> dotted path (beside @job).
    "FUNCTIONS": {},
    # Modules outside the installed apps whose tasks django_task handlers may name (and their submodules).
    "TASK_MODULES": [],
    "HANDLERS": {},
    "TASKS": [],
    # Dotted paths of the REST API's DRF permission classes; None: staff with model permissions.
    "API_PERMISSION_CLASSES": None,
    # PostgreSQL: prepare the runner's and triggers' fixed statements. None: yes, unless the
    # database's DISABLE_SERVER_SIDE_CURSORS says a transaction-mode pooler is in between.
    "PREPARED_STATEMENTS": None,
    # Mail to the ADMINS for executions recorded "unknown" and/or "failed" (for good), at most one
    # per status every EVERY_SECONDS across the cluster; BASE_URL makes the admin link absolute.
    "ALERTS": {"MAIL_ADMINS": [], "EVERY_SECONDS": 300, "BASE_URL": ""},
}


class SchedulerSettings:
    """Attribute access to SCHEDULER_APP merged over DEFAULTS; dicts merge one level deep."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, "SCHEDULER_APP", None) or {}
        return value if isinstance(value, dict) else {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown scheduler setting: {name}")
        if name not in self._cache:
            value = self.user_settings.get(name, DEFAULTS[name])
            if isinstance(DEFAULTS[name], dict) and isinstance(value, dict):
                value = {**DEFAULTS[name], **value}
            self._cache[name] = value
        return self._cache[name]

    def reload(self) -> None:
        self._cache.clear()


scheduler_settings = SchedulerSettings()


@receiver(setting_changed)
def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    """Forget the cached values when SCHEDULER_APP changes (override_settings in tests)."""
    if setting == "SCHEDULER_APP":
        scheduler_settings.reload()
