"""Schemathesis against the served OpenAPI schema, as a staff user: no 5xx, no response off the schema.

Bounded and deterministic: a few derandomized examples per operation, positive
and negative. Runs on SQLite and PostgreSQL (MariaDB adds time, not coverage).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from scheduler_app import scheduler
from scheduler_app.models import Execution
from tests.factories import definition

pytestmark = pytest.mark.skipif(
    django_settings.DATABASES["default"]["ENGINE"].endswith("mysql"),
    reason="the schema run is backend-independent; SQLite and PostgreSQL cover it",
)

USER, PASSWORD = "schema-staff", "schema-pw"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
EXAMPLES = 10
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


@pytest.fixture
def keep_connections() -> Any:
    """Keep the test's connection open across WSGI requests, as Django's test client does."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def api_schema(db: Any, settings: Any, keep_connections: Any) -> Any:
    """The schema served at api/scheduler/schema/, with a staff user and some data to find."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    User.objects.create_superuser(USER, password=PASSWORD)
    scheduler.register(definition("report", cron="0 0 1 1 *", params={"a": 1}))
    scheduler.register(definition("other", cron="0 0 1 1 *", handler={"kind": "fake"}))
    scheduler.register(definition("doomed", cron="0 0 1 1 *"))
    scheduler.trigger("report", idempotency_key="seeded")
    stopped = scheduler.trigger("other")
    scheduler.executions.request_stop(stopped.occurrence_id)
    assert Execution.objects.count() == 2
    return schemathesis.openapi.from_wsgi("/api/scheduler/schema/", get_wsgi_application(), headers=AUTH)


def off_other_routes(case: Any) -> bool:
    """Whether the case stays on its route: executions/unknown/ is a list, not an execution called unknown."""
    return (case.path_parameters or {}).get("occurrence_id") not in ("unknown", "log-failures")


def known_ids(operation: Any, seeded: dict[str, str]) -> dict[str, str]:
    """Path parameters that exist, so that examples get past the lookup."""
    names = {parameter.name for parameter in operation.path_parameters}
    known = {name: seeded[name] for name in names}
    if operation.method.upper() == "DELETE":
        known["id"] = "doomed"
    return known


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_schema(api_schema: Any, mode: GenerationMode) -> None:
    seeded = {
        "id": "report",
        "occurrence_id": str(Execution.objects.get(idempotency_key="seeded").occurrence_id),
    }
    failures: dict[str, str] = {}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) == 22
    for operation in operations:
        for path_parameters in ({}, known_ids(operation, seeded)) if operation.path_parameters else ({},):
            cases = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters or None)

            @given(case=cases.filter(off_other_routes))
            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                case.call_and_validate(headers=AUTH, checks=CHECKS)

            try:
                run()
            except Exception as exc:
                failures[f"{operation.label} {path_parameters}"] = str(exc)[:3000]
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
