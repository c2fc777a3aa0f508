"""The task form: validated by scheduler_app.definitions, saved through the services, secrets masked."""

from __future__ import annotations

from typing import Any

from django import forms

from scheduler_app import definitions
from scheduler_app.exceptions import InvalidDefinition, SchedulerError
from scheduler_app.handlers import registry
from scheduler_app.models import Task
from scheduler_app.services import scheduler

# Where an error of definitions.validate_definition() is shown on the form.
ERROR_FIELDS = {
    "retry": "retry_backoff",
    "retry.max_attempts": "retry_max_attempts",
    "retry.backoff": "retry_backoff",
}


class TaskForm(forms.ModelForm):
    """Edits a definition; ``definition`` holds the validated dict once the form is valid.

    A bound form is saved through the services as the last step of its validation: a
    refusal there (a concurrent change, a storage failure) is a form error, so the admin
    neither reports success nor records a change that did not happen.
    """

    class Meta:
        model = Task
        fields = ("id", *definitions.MODEL_FIELDS)
        labels = {"retry_max_attempts": "Retry: max attempts", "retry_backoff": "Retry: backoff (seconds)"}
        help_texts = {
            "cron": "Five fields: minute hour day-of-month month day-of-week.",
            "retry_backoff": 'A JSON list of seconds to wait before attempt 2, 3, ..., e.g. "[10, 60]".',
            "params": "A JSON object passed to the handler.",
            "misfire_grace_seconds": "Empty uses the MISFIRE_GRACE_SECONDS setting.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.definition: dict[str, Any] = {}
        # The admin leaves "handler" out of the form for users without CHANGE_HANDLER_PERMISSION.
        if "handler" in self.fields:
            self.fields["handler"].required = False
            self.fields["handler"].help_text = (
                'A JSON object with a "kind", or empty for the on_task_execute hook. Secrets are shown '
                "as ***; leave a *** as it is to keep the stored value."
            )
            self.initial["handler"] = registry.masked(self.instance.handler)
        for name in ("params", "retry_backoff"):
            if name in self.fields:
                self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None
        if self.errors:
            return data
        data["params"] = data.get("params") if data.get("params") is not None else {}
        data["retry_backoff"] = data.get("retry_backoff") if data.get("retry_backoff") is not None else []
        stored = self.instance.handler if self.instance.pk else None
        if "handler" in self.fields:
            handler = registry.unmask(data.get("handler"), stored)
            data["handler"] = handler
        else:
            handler = stored
        definition = {
            "id": data.get("id", self.instance.id),
            "name": data["name"],
            "description": data["description"],
            "cron": data["cron"],
            "timezone": data["timezone"],
            "enabled": data["enabled"],
            "delete_after_run": data["delete_after_run"],
            "idempotent": data["idempotent"],
            "retry": {"max_attempts": data["retry_max_attempts"], "backoff": data["retry_backoff"]},
            "params": data["params"],
            "handler": handler,
            "max_concurrency": data["max_concurrency"],
            "overlap": data["overlap"],
            "misfire_grace_seconds": data["misfire_grace_seconds"],
        }
        try:
            definitions.validate_definition(definition)
        except InvalidDefinition as exc:
            for key, messages in exc.errors.items():
                self._add_definition_error(key, messages)
            return data
        self.definition = definition
        return data

    def full_clean(self) -> None:
        super().full_clean()
        if not self.is_bound or self.errors:
            return
        try:
            self._save_definition()
        except SchedulerError as exc:
            # Validated a moment ago: only a concurrent change or a database failure ends here.
            self.add_error(None, f"The task was not saved: {exc.message}")

    def _save_definition(self) -> None:
        """Register a new task, or update an existing one with the fields that were changed."""
        if self.instance._state.adding:
            scheduler.register(self.definition)
            return
        keys = {"retry" if name.startswith("retry_") else name for name in self.changed_data}
        changes = {key: self.definition[key] for key in keys if key in self.definition}
        scheduler.update_task(self.instance.id, **changes)

    def _add_definition_error(self, key: str, messages: list[str]) -> None:
        field, _, sub = key.partition(".")
        name = ERROR_FIELDS.get(key, field) or None
        if name is not None and name not in self.fields:
            name = None
        prefix = f"{sub}: " if field == "handler" and sub else ""
        for message in messages:
            self.add_error(name, f"{prefix}{message}")
