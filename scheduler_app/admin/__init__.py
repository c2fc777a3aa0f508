"""Admin pages: tasks, the execution journal with its history and repairs, logs, runners.

Each module registers one admin; every change goes through scheduler_app.services.
"""

from scheduler_app.admin import executions, logs, runners, tasks

__all__ = ["executions", "logs", "runners", "tasks"]
