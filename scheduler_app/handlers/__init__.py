"""The handler registry: built-in kinds plus those a project adds in HANDLERS."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.utils.module_loading import import_string

from scheduler_app.conf import scheduler_settings
from scheduler_app.handlers.base import Handler, restore_masked
from scheduler_app.handlers.hooks import HookHandler

logger = logging.getLogger("scheduler_app")

BUILTIN: dict[str, str] = {
    "api": "scheduler_app.handlers.http.HttpHandler",
    "django_task": "scheduler_app.handlers.django_task.DjangoTaskHandler",
    "js": "scheduler_app.handlers.javascript.JavaScriptHandler",
    "python": "scheduler_app.handlers.python.PythonHandler",
}


class HandlerRegistry:
    """Maps a handler ``kind`` to its Handler instance, each kind loaded on its first use.

    A kind's module is imported only when a task of that kind is validated or run, so a
    runner that runs only python tasks never imports requests (api) or the js pool.
    """

    def __init__(self) -> None:
        # Kinds loaded so far; None for a kind whose path cannot be imported (logged once).
        self._handlers: dict[str, Handler | None] = {}
        self._lock = threading.RLock()  # a handler module may use the registry as it loads
        self._hook_handler = HookHandler()

    def _paths(self) -> dict[str, Any]:
        return {**BUILTIN, **scheduler_settings.HANDLERS}

    def _load(self, kind: str, target: Any) -> Handler | None:
        with self._lock:
            if kind not in self._handlers:
                try:
                    factory = import_string(target) if isinstance(target, str) else target
                except ImportError:
                    # Reported by check scheduler_app.E003; tasks of this kind are refused or interrupted.
                    logger.error("handler kind %r cannot be imported from %r", kind, target)
                    self._handlers[kind] = None
                else:
                    self._handlers[kind] = factory()
            return self._handlers[kind]

    def kinds(self) -> list[str]:
        return sorted(kind for kind in self._paths() if self.get(kind) is not None)

    def get(self, kind: str) -> Handler | None:
        try:
            return self._handlers[kind]
        except KeyError:
            target = self._paths().get(kind)
            return None if target is None else self._load(kind, target)

    def for_config(self, config: dict[str, Any] | None) -> Handler | None:
        """The handler for a task's handler config; None config means the hooks."""
        if config is None:
            return self._hook_handler
        return self.get(config.get("kind", ""))

    def masked(self, config: dict[str, Any] | None) -> dict[str, Any] | None:
        """A handler config safe to display (admin, API, logs)."""
        if config is None:
            return None
        handler = self.get(config.get("kind", ""))
        return handler.mask(config) if handler is not None else {"kind": config.get("kind")}

    def unmask(self, submitted: Any, stored: dict[str, Any] | None) -> Any:
        """The submitted handler with each value sent back as shown masked replaced by the stored secret.

        The admin form and the API both use it: changing one field of a handler and sending
        the rest as read keeps the stored secrets. A kind may narrow where they are kept.
        """
        if (
            isinstance(submitted, dict)
            and isinstance(stored, dict)
            and submitted.get("kind") == stored.get("kind")
        ):
            handler = self.get(str(stored.get("kind", "")))
            if handler is not None:
                return handler.unmask(submitted, stored)
        return restore_masked(submitted, stored, self.masked(stored))

    def reset(self) -> None:
        self._handlers = {}


registry = HandlerRegistry()
