"""The task form: validated by scheduler_app.definitions, saved through the services, secrets masked."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput, JSONString

from scheduler_app import definitions, jobs
from scheduler_app.exceptions import InvalidDefinition, SchedulerError
from scheduler_app.handlers import registry
from scheduler_app.models import MisfirePolicy, Task
from scheduler_app.services import scheduler

# Where an error of definitions.validate_definition() is shown on the form.
ERROR_FIELDS = {
    "handler.function": "function",
    "retry": "retry_backoff",
    "retry.max_attempts": "retry_max_attempts",
    "retry.backoff": "retry_backoff",
}
# Fields holding JSON: an error deeper inside one names its place ("headers.X: ...").
JSON_FIELDS = ("params", "handler", "retry_backoff")
ASCII_INTEGER = re.compile(r"[-+]?[0-9]+")


class JSONText(forms.JSONField):
    """JSON typed into a text box, read and checked as the REST API reads a body.

    A refused value is shown back as it was typed: reading it again could exhaust the
    stack, and re-encoding an unpaired surrogate (``"\\ud800"``) would make a page that
    cannot be sent.
    """

    def to_python(self, value: Any) -> Any:
        if self.disabled or not isinstance(value, str) or isinstance(value, JSONString):
            return super().to_python(value)
        if value in self.empty_values:
            return None
        try:
            converted = definitions.parse_json(value)
        except json.JSONDecodeError:
            raise ValidationError(
                self.error_messages["invalid"], code="invalid", params={"value": value}
            ) from None
        except ValueError as exc:
            # NaN, Infinity, nesting past the stack.
            raise ValidationError(str(exc), code="invalid") from None
        errors: dict[str, list[str]] = {}
        definitions.check_json(converted, "", errors)
        if errors:
            raise ValidationError(
                [
                    f"{path}: {message}" if path else message
                    for path, messages in errors.items()
                    for message in messages
                ]
            )
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or data is None:
            return super().bound_data(data, initial)
        return InvalidJSONInput(data)

    def prepare_value(self, value: Any) -> Any:
        text = super().prepare_value(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A value stored before it was checked: escaped, so that the page can be sent.
            return json.dumps(value, cls=self.encoder)
        return text


class ASCIIIntegerField(forms.IntegerField):
    """An integer in ASCII digits: int() alone would also read "١٢" as 12."""

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and value.strip() and not ASCII_INTEGER.fullmatch(value.strip()):
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return super().to_python(value)


class TaskForm(forms.ModelForm):
    """Edits a definition; ``definition`` holds the validated dict once the form is valid.

    A bound form is saved through the services as the last step of its validation: a
    refusal there (a concurrent change, a storage failure) is a form error, so the admin
    neither reports success nor records a change that did not happen.
    """

    # Replaced in __init__ by the registered names; here so that the admin may list it in fieldsets.
    function = forms.ChoiceField(required=False)

    class Meta:
        model = Task
        fields = ("id", *definitions.MODEL_FIELDS)
        field_classes = {
            "params": JSONText,
            "handler": JSONText,
            "retry_backoff": JSONText,
            "retry_max_attempts": ASCIIIntegerField,
            "max_concurrency": ASCIIIntegerField,
            "misfire_grace_seconds": ASCIIIntegerField,
            "jitter_seconds": ASCIIIntegerField,
        }
        labels = {"retry_max_attempts": "Retry: max attempts", "retry_backoff": "Retry: backoff (seconds)"}
        help_texts = {
            "cron": "Five fields: minute hour day-of-month month day-of-week; or a macro such as @daily. "
            "Empty for a one-shot task (run at).",
            "run_at": "A one-shot task fires once at this instant, instead of on a cron expression.",
            "starts_at": "Empty: no start. No fire time before this instant.",
            "ends_at": "Empty: no end. No fire time at or after this instant.",
            "jitter_seconds": "Each scheduled occurrence comes due up to this many seconds after its "
            "fire time (the same offset on every node), shorter than the shortest interval.",
            "misfire_policy": "What a runner that was down does with the fire times missed within "
            "the grace: run the latest once, or run each.",
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
            self.fields["function"] = self._function_field()
        else:
            self.fields.pop("function", None)
        for name in ("params", "retry_backoff", "jitter_seconds", "misfire_policy"):
            if name in self.fields:
                self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None
        if self.errors:
            return data
        # A declared task's code-owned fields are read-only, out of the form: they keep their values.
        for name in definitions.MODEL_FIELDS:
            if name not in self.fields and name != "handler":
                data[name] = getattr(self.instance, name)
        data["params"] = data.get("params") if data.get("params") is not None else {}
        data["retry_backoff"] = data.get("retry_backoff") if data.get("retry_backoff") is not None else []
        # Left out of a form posted without them: their defaults.
        data["jitter_seconds"] = data.get("jitter_seconds") or 0
        data["misfire_policy"] = data.get("misfire_policy") or MisfirePolicy.COALESCE
        stored = self.instance.handler if self.instance.pk else None
        if "handler" in self.fields:
            handler = self._chosen_function(registry.unmask(data.get("handler"), stored), data)
            data["handler"] = handler
        else:
            handler = stored
        definition = {
            "id": data.get("id", self.instance.id),
            "name": data["name"],
            "description": data["description"],
            "cron": data["cron"],
            "run_at": data["run_at"],
            "timezone": data["timezone"],
            "starts_at": data["starts_at"],
            "ends_at": data["ends_at"],
            "jitter_seconds": data["jitter_seconds"],
            "enabled": data["enabled"],
            "delete_after_run": data["delete_after_run"],
            "idempotent": data["idempotent"],
            "retry": {"max_attempts": data["retry_max_attempts"], "backoff": data["retry_backoff"]},
            "params": data["params"],
            "handler": handler,
            "max_concurrency": data["max_concurrency"],
            "overlap": data["overlap"],
            "misfire_grace_seconds": data["misfire_grace_seconds"],
            "misfire_policy": data["misfire_policy"],
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
        keys = {
            "retry" if name.startswith("retry_") else "handler" if name == "function" else name
            for name in self.changed_data
        }
        changes = {key: self.definition[key] for key in keys if key in self.definition}
        scheduler.update_task(self.instance.id, **changes)

    def _function_field(self) -> forms.ChoiceField:
        """The registered Python functions to choose from: the python handler kind, without JSON."""
        stored = self.instance.handler or {}
        current = stored.get("function") if stored.get("kind") == "python" else None
        names = jobs.names()
        if isinstance(current, str) and current not in names:
            names.append(current)  # shown, so that the form says it is no longer registered
        self.initial.setdefault("function", current or "")
        return forms.ChoiceField(
            choices=[("", "---------"), *((name, name) for name in names)],
            required=False,
            label="Python function",
            help_text="Runs this function, registered with @job or in FUNCTIONS (the python handler kind); "
            "it takes the place of the handler above. Leave empty to use the handler above.",
        )

    def _chosen_function(self, handler: Any, data: dict[str, Any]) -> Any:
        """The handler with the chosen function, keeping a python handler's timeout."""
        function = data.get("function")
        if not function:
            return handler
        if isinstance(handler, dict) and handler.get("kind") not in (None, "python"):
            self.add_error("function", "Choose a Python function or a handler of another kind, not both.")
            return handler
        chosen: dict[str, Any] = {"kind": "python", "function": function}
        if isinstance(handler, dict) and "timeout" in handler:
            chosen["timeout"] = handler["timeout"]
        return chosen

    def _add_definition_error(self, key: str, messages: list[str]) -> None:
        parts = key.split(".")
        heads = (".".join(parts[:size]) for size in range(len(parts), 1, -1))
        head = next((head for head in heads if head in ERROR_FIELDS), parts[0])
        sub = key[len(head) + 1 :]
        field = ERROR_FIELDS.get(head, head)
        name = field if field in self.fields else None
        prefix = f"{sub}: " if sub and field in JSON_FIELDS else ""
        for message in messages:
            self.add_error(name, f"{prefix}{message}")
