"""Receivers that keep the app's loaded state in step with settings; connected in apps.ready()."""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from scheduler_app import alerts, signals
from scheduler_app.handlers import registry

# The mail receiver asks ALERTS at each signal: connected always, it sends nothing unless asked to.
signals.execution_unknown.connect(alerts.mail_the_admins, dispatch_uid="scheduler_app.mail_unknown")
signals.execution_failed.connect(alerts.mail_the_admins, dispatch_uid="scheduler_app.mail_failed")


@receiver(setting_changed)
def reset_handler_registry(*, setting: str, **kwargs: Any) -> None:
    """Load the handlers again after SCHEDULER_APP changes, so a new HANDLERS takes effect."""
    if setting == "SCHEDULER_APP":
        registry.reset()
