"""A handler for tests: succeeds, fails or skips as its config says."""

from __future__ import annotations

from typing import Any

from scheduler_app.events import TaskEvent
from scheduler_app.exceptions import TaskSkipped
from scheduler_app.handlers.base import Handler, HandlerError

OUTCOMES = ("success", "fail", "skip")


class FakeHandler(Handler):
    kind = "fake"

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        unknown = set(config) - {"kind", "outcome", "result"}
        if unknown:
            errors[""] = [f"Unknown keys: {', '.join(sorted(unknown))}."]
        if config.get("outcome", "success") not in OUTCOMES:
            errors["outcome"] = [f"Must be one of: {', '.join(OUTCOMES)}."]
        return errors

    def run(self, event: TaskEvent) -> Any:
        handler = event.task.handler or {}
        outcome = handler.get("outcome", "success")
        if outcome == "fail":
            raise HandlerError("scheduler:023", "The fake handler failed as configured.")
        if outcome == "skip":
            raise TaskSkipped("The fake handler skipped as configured.")
        return handler.get("result")
