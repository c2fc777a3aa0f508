"""The one interface every handler kind implements."""

from __future__ import annotations

from typing import Any, ClassVar

from scheduler_app.events import TaskEvent


class HandlerError(Exception):
    """A handler failed; ``code`` and ``message`` are stored on the execution as they are."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


class MissingHandler(Exception):
    """The task has nothing to run: the attempt ends interrupted, never retried."""


class Handler:
    """Runs one attempt. ``run`` returns a JSON-serialisable result or raises."""

    kind: ClassVar[str] = ""

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        """Field errors of a handler config (``kind`` included); empty when valid."""
        return {}

    def mask(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as it may be displayed: secrets replaced by a mask. Override when it holds secrets."""
        return dict(config)

    def run(self, event: TaskEvent) -> Any:
        raise NotImplementedError
