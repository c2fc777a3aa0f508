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


class Resumable(Exception):
    """Raised by a cancelled handler whose work goes on elsewhere (a task it enqueued and follows).

    Cancelled by the runner's shutdown, the attempt goes back to pending without an outcome and the
    next claim resumes it as the same attempt; any other cancellation ends it as usual.
    """


class Handler:
    """Runs one attempt. ``run`` returns a JSON-serialisable result or raises."""

    kind: ClassVar[str] = ""

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        """Field errors of a handler config (``kind`` included); empty when valid."""
        return {}

    def mask(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as it may be displayed: secrets replaced by a mask. Override when it holds secrets."""
        return dict(config)

    def unmask(self, submitted: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
        """``submitted`` (of this kind) with each value sent back as ``mask`` shows it replaced
        by the stored one. Override to keep secrets in fewer cases."""
        restored: dict[str, Any] = restore_masked(submitted, stored, self.mask(stored))
        return restored

    def secrets(self, config: dict[str, Any]) -> list[str]:
        """The config's secret values in every form a response may echo them (plain, percent-encoded,
        base64): each is replaced by ``***`` in the results and errors stored. Override when it holds secrets."""
        return []

    def time_limit(self, config: dict[str, Any]) -> float | None:
        """Seconds one attempt may run before the runner cancels it (see docs/concepts.md, Time limits).

        None: no limit beyond those the handler enforces itself, as ``api`` and ``js`` do.
        Hook-run tasks pass an empty ``config``.
        """
        return None

    def run(self, event: TaskEvent) -> Any:
        raise NotImplementedError


def restore_masked(submitted: Any, stored: Any, masked: Any) -> Any:
    """``submitted`` where each value equal to its masked form takes the stored value, key by key."""
    if masked == stored:
        return submitted
    if isinstance(submitted, dict) and isinstance(stored, dict) and isinstance(masked, dict):
        return {
            key: restore_masked(value, stored.get(key), masked.get(key)) if key in stored else value
            for key, value in submitted.items()
        }
    return stored if submitted == masked else submitted
