"""The ``python`` handler kind: a function the project registered by name (scheduler_app.jobs)."""

from __future__ import annotations

from typing import Any

from scheduler_app import jobs
from scheduler_app.conf import scheduler_settings
from scheduler_app.events import TaskEvent
from scheduler_app.handlers.base import Handler, HandlerError
from scheduler_app.values import is_number, short_text

KEYS = frozenset({"kind", "function", "timeout"})
MAX_TIMEOUT = 7 * 86400
NOT_REGISTERED = "scheduler:035"


class PythonHandler(Handler):
    """Calls the registered function with the attempt's event; its return value is the result."""

    kind = "python"

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        unknown = sorted(str(key) for key in set(config) - KEYS)
        if unknown:
            errors[""] = [f"Unknown keys: {', '.join(unknown)}."]
        name = config.get("function")
        if not isinstance(name, str) or not name:
            errors["function"] = ["Must be the name of a registered function."]
        elif name not in jobs.names():
            registered = ", ".join(jobs.names()) or "none"
            errors["function"] = [
                f"No function is registered under {short_text(name)} (registered: {registered}). "
                "Register it with @job in an app's jobs module, or in the FUNCTIONS setting."
            ]
        timeout = config.get("timeout")
        if timeout is not None and not (is_number(timeout) and 0 < timeout <= MAX_TIMEOUT):
            errors["timeout"] = [f"Must be a number of seconds above 0 and at most {MAX_TIMEOUT}."]
        return errors

    def time_limit(self, config: dict[str, Any]) -> float | None:
        timeout = config.get("timeout")
        return float(timeout if timeout is not None else scheduler_settings.HOOK_TIMEOUT)

    def run(self, event: TaskEvent) -> Any:
        name = str((event.task.handler or {}).get("function", ""))
        function = jobs.get(name)
        if function is None:
            raise HandlerError(
                NOT_REGISTERED,
                f"No function is registered under {short_text(name)} on this node: "
                "is its app installed here, or its FUNCTIONS entry set?",
            )
        return function(event)
