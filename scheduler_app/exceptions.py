"""
Exceptions raised by scheduler_app.

Every error carries a stable ``code``. None of them carries SQL, driver
messages or connection parameters. Do not raise ``SchedulerError`` directly.

    SchedulerError
     +-- InvalidDefinition (ValueError)      scheduler:012
     |    +-- InvalidCron                    scheduler:022
     +-- TaskNotFound (LookupError)          scheduler:020
     +-- TaskAlreadyExists                   scheduler:021
     +-- StorageError                        scheduler:026
     +-- ExecutionNotFound (LookupError)     scheduler:040
     +-- Conflict                            scheduler:041
     +-- InvalidState                        scheduler:042
     |    +-- TaskDeclared                   scheduler:044
     +-- TaskSkipped                         (raised by hooks to end an attempt as interrupted)
"""

from __future__ import annotations

from typing import Any


class SchedulerError(Exception):
    """Base class of every scheduler error; carries a stable ``code``."""

    code = "scheduler:000"
    default_message = "Scheduler error."

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or self.default_message
        self.details = details
        super().__init__(self.message)

    def explained(self) -> str:
        """The message with what is wrong with each field, in one line for a person to read."""
        errors = self.details.get("errors") or {}
        parts = [
            f"{field}: {' '.join(messages)}" if field else " ".join(messages)
            for field, messages in errors.items()
        ]
        return " ".join([self.message, *parts])

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        data.update(self.details)
        return data


class InvalidDefinition(SchedulerError, ValueError):
    code = "scheduler:012"
    default_message = "The task definition is invalid."

    def __init__(self, message: str | None = None, errors: dict[str, list[str]] | None = None) -> None:
        self.errors = errors or {}
        super().__init__(message, errors=self.errors)


class InvalidCron(InvalidDefinition):
    code = "scheduler:022"
    default_message = "The cron expression or timezone is invalid."


class TaskNotFound(SchedulerError, LookupError):
    code = "scheduler:020"
    default_message = "No task with that id."


class TaskAlreadyExists(SchedulerError):
    code = "scheduler:021"
    default_message = "A task with that id already exists."


class StorageError(SchedulerError):
    code = "scheduler:026"
    default_message = "The database refused the write."


class ExecutionNotFound(SchedulerError, LookupError):
    code = "scheduler:040"
    default_message = "No execution with that occurrence id."


class Conflict(SchedulerError):
    code = "scheduler:041"
    default_message = "The request conflicts with the current state."


class InvalidState(SchedulerError):
    code = "scheduler:042"
    default_message = "The execution is not in a state that allows this."


class TaskDeclared(InvalidState):
    """The task is declared in code (TASKS or @job): its definition fields are changed there."""

    code = "scheduler:044"
    default_message = "The task is declared in code; change its declaration instead."


class TaskSkipped(SchedulerError):
    """Raised by a hook to end the attempt as interrupted, without retry."""

    code = "scheduler:043"
    default_message = "The task skipped this attempt."
