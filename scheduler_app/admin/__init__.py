"""Admin pages: tasks and their changes, the execution journal with its history and repairs, logs, runners.

Each module registers one admin; every change goes through scheduler_app.services.
"""

from scheduler_app.admin import changes, executions, logs, runners, tasks

__all__ = ["changes", "executions", "logs", "runners", "tasks"]
