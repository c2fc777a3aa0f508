"""Tasks declared in code (TASKS and @job): synced at start, owned by their declaration, never taking over."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler_app import declarations, job, jobs, scheduler
from scheduler_app.checks import check_declared_collisions, check_job_declarations, check_settings
from scheduler_app.exceptions import InvalidDefinition, TaskAlreadyExists, TaskDeclared
from scheduler_app.models import NO_LONGER_DECLARED, Task
from tests.factories import definition
from tests.test_checks import as_pattern, documented

pytestmark = pytest.mark.django_db

SETTINGS_TASK = {"id": "from-settings", "cron": "0 4 * * *"}


@pytest.fixture
def declare() -> Iterator[Callable[..., Callable[..., Any]]]:
    """Declare ``@job(name, **fields)`` on a fresh function; forgotten at teardown."""
    names: list[str] = []

    def declare(name: str, /, **fields: Any) -> Callable[..., Any]:
        @job(name, **fields)
        def function(event: Any) -> str:
            return name

        names.append(name)
        return function

    yield declare
    for name in names:
        jobs.forget(name)


def with_tasks(*tasks: dict[str, Any]) -> Any:
    return override_settings(SCHEDULER_APP={"TASKS": list(tasks)})


# -- @job declarations -----------------------------------------------------------


def test_a_job_with_a_cron_declares_its_task_with_the_python_handler(declare):
    declare(
        "nightly-report-test",
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        retry={"max_attempts": 3, "backoff": [10, 60]},
        idempotent=True,
        max_concurrency=2,
        overlap="buffer_one",
        timeout=30,
        name="Nightly report",
        description="Sends the report.",
        params={"channel": "ops"},
    )
    [task] = scheduler.refresh_tasks()
    task = Task.objects.get(id="nightly-report-test")
    assert task.declared_in == "code"
    assert task.handler == {"kind": "python", "function": "nightly-report-test", "timeout": 30}
    assert (task.cron, task.timezone, task.retry_max_attempts, task.retry_backoff) == (
        "0 2 * * *",
        "Europe/Berlin",
        3,
        [10, 60],
    )
    assert (task.idempotent, task.max_concurrency, task.overlap) == (True, 2, "buffer_one")
    assert (task.name, task.description, task.params) == (
        "Nightly report",
        "Sends the report.",
        {"channel": "ops"},
    )
    scheduler.refresh_tasks()
    assert Task.objects.get(id="nightly-report-test").revision == 1


def test_a_job_without_timeout_has_none_in_its_handler(declare):
    declare("no-timeout-test", cron="0 2 * * *")
    scheduler.refresh_tasks()
    assert Task.objects.get().handler == {"kind": "python", "function": "no-timeout-test"}


def test_a_job_without_cron_is_a_plain_registration(declare):
    declare("plain-test")
    assert "plain-test" in jobs.names()
    assert declarations.declared() == []
    assert scheduler.refresh_tasks() == []
    assert not Task.objects.exists()


def test_job_refuses_the_fields_it_sets_itself():
    with pytest.raises(TypeError, match="handler"):
        job("x", cron="0 * * * *", handler={"kind": "js"})


def test_an_invalid_declaration_is_e040_with_its_field_errors_and_the_runner_refuses_to_start(declare):
    declare("bad-test", cron="99 * * * *", retry={"max_attempts": 0})
    [message] = check_job_declarations()
    level, documented_message, documented_hint = documented()["scheduler_app.E040"]
    assert (message.id, type(message).__name__, message.hint) == (
        "scheduler_app.E040",
        level,
        documented_hint,
    )
    assert re.fullmatch(as_pattern(documented_message), message.msg)
    assert "@job('bad-test').cron:" in message.msg and "@job('bad-test').retry.max_attempts:" in message.msg
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.refresh_tasks()
    assert set(caught.value.errors) == {"@job('bad-test').cron", "@job('bad-test').retry.max_attempts"}
    with pytest.raises(CommandError, match=r"scheduler:012: @job declarations are invalid\..*bad-test"):
        call_command("run_scheduler", "--once")
    assert not Task.objects.exists()


def test_a_job_id_also_declared_in_tasks_is_e040(declare):
    declare("from-settings", cron="0 5 * * *")
    with with_tasks(SETTINGS_TASK):
        [message] = check_job_declarations()
        assert "@job('from-settings').id: Also declared in SCHEDULER_APP['TASKS']" in message.msg
        assert [m.id for m in check_settings()] == []  # TASKS itself is valid: no E002
        with pytest.raises(InvalidDefinition):
            scheduler.refresh_tasks()
    assert not Task.objects.exists()


def test_refresh_tasks_syncs_both_sources_all_or_nothing(declare):
    declare("code-test", cron="0 3 * * *")
    with with_tasks(SETTINGS_TASK):
        synced = scheduler.refresh_tasks()
    assert [task.id for task in synced] == ["from-settings", "code-test"]
    assert dict(Task.objects.values_list("id", "declared_in")) == {
        "from-settings": "settings",
        "code-test": "code",
    }
    declare("broken-test", cron="bad")
    with with_tasks({**SETTINGS_TASK, "cron": "0 6 * * *"}), pytest.raises(InvalidDefinition):
        scheduler.refresh_tasks()
    assert Task.objects.get(id="from-settings").cron == "0 4 * * *"


# -- a removed declaration ----------------------------------------------------------


@pytest.mark.parametrize("source", ["settings", "code"])
def test_a_removed_declaration_disables_its_task_with_the_reason_and_coming_back_enables_it(declare, source):
    def declared() -> Any:
        if source == "code":
            declare("gone-test", cron="0 4 * * *")
            return with_tasks()
        return with_tasks({"id": "gone-test", "cron": "0 4 * * *"})

    with declared():
        scheduler.refresh_tasks()
    jobs.forget("gone-test")
    with with_tasks():
        scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.enabled, task.disabled_reason, task.declared_in) == (False, NO_LONGER_DECLARED, "")
    # No longer owned by a declaration: it can be edited or deleted like any task.
    scheduler.update_task("gone-test", name="Kept for the record")
    with declared():
        scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.enabled, task.disabled_reason, task.declared_in, task.name) == (
        True,
        "",
        source,
        "gone-test",
    )


def test_enabling_a_task_clears_the_reason_it_was_disabled_for():
    scheduler.register(definition())
    Task.objects.update(enabled=False, disabled_reason=NO_LONGER_DECLARED)
    task = scheduler.update_task("report", enabled=True)
    assert (task.enabled, task.disabled_reason) == (True, "")


# -- the declaration owns its fields --------------------------------------------------


@pytest.mark.parametrize(
    ("source", "where"),
    [("settings", "SCHEDULER_APP['TASKS']"), ("code", "@job in tests.test_declared_tasks.")],
)
def test_the_services_refuse_changes_to_the_fields_a_declaration_owns(declare, source, where):
    if source == "code":
        declare("owned-test", cron="0 4 * * *")
    with with_tasks(*([{"id": "owned-test", "cron": "0 4 * * *"}] if source == "settings" else [])):
        scheduler.refresh_tasks()
    with pytest.raises(TaskDeclared) as caught:
        scheduler.update_task("owned-test", cron="0 5 * * *", retry={"max_attempts": 2})
    assert caught.value.code == "scheduler:044"
    assert where in caught.value.message and "cron, retry" in caught.value.message
    with pytest.raises(TaskDeclared):
        scheduler.replace_task("owned-test", {"cron": "0 5 * * *"})
    with pytest.raises(TaskDeclared, match="remove the declaration"):
        scheduler.unregister("owned-test")
    task = Task.objects.get()
    assert (task.cron, task.retry_max_attempts, task.revision) == ("0 4 * * *", 1, 1)
    # Pausing, running now and sending the same values back stay allowed.
    assert scheduler.update_task("owned-test", enabled=False).enabled is False
    assert scheduler.update_task("owned-test", cron="0 4 * * *").cron == "0 4 * * *"
    scheduler.replace_task("owned-test", {**task.to_definition(), "enabled": True})
    assert scheduler.trigger("owned-test").task_id == "owned-test"


@pytest.mark.parametrize("source", ["settings", "code"])
def test_an_operators_pause_of_a_declared_task_survives_the_next_runner_start(declare, source):
    if source == "code":
        declare("paused-test", cron="0 4 * * *")
    with with_tasks(*([{"id": "paused-test", "cron": "0 4 * * *"}] if source == "settings" else [])):
        scheduler.refresh_tasks()
        scheduler.update_task("paused-test", enabled=False)
        scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.enabled, task.revision, task.declared_in) == (False, 2, source)


@pytest.mark.parametrize("source", ["settings", "code"])
def test_a_pause_of_a_declared_task_keeps_its_reason_and_end_across_runner_starts(declare, source):
    if source == "code":
        declare("paused-test", cron="0 4 * * *")
    until = timezone.now() + timedelta(days=1)
    with with_tasks(*([{"id": "paused-test", "cron": "0 4 * * *"}] if source == "settings" else [])):
        scheduler.refresh_tasks()
        with scheduler.acting_as("oncall"):
            scheduler.pause("paused-test", reason="upstream down", until=until)
        scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.enabled, task.disabled_reason, task.disabled_by, task.disabled_until, task.declared_in) == (
        False,
        "upstream down",
        "oncall",
        until,
        source,
    )
    assert scheduler.resume("paused-test").enabled is True


def test_a_removed_declaration_ends_the_pause_of_its_task_for_good(declare):
    """No longer declared, it is disabled with that reason: a runner does not enable it at the old until."""
    declare("gone-test", cron="0 4 * * *")
    with with_tasks():
        scheduler.refresh_tasks()
        scheduler.pause("gone-test", reason="incident", until=timezone.now() + timedelta(hours=1))
    jobs.forget("gone-test")
    with with_tasks():
        scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.enabled, task.disabled_reason, task.disabled_until) == (False, NO_LONGER_DECLARED, None)


def test_tasks_created_by_register_stay_editable():
    scheduler.register(definition())
    assert scheduler.update_task("report", cron="0 5 * * *").cron == "0 5 * * *"
    scheduler.unregister("report")


@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_login(admin_user)
    return client


def test_the_rest_api_shows_a_declared_task_and_refuses_edits_with_409(api, declare):
    declare("api-test", cron="0 4 * * *")
    scheduler.refresh_tasks()
    scheduler.register(definition())
    listed = {task["id"]: task for task in api.get("/api/scheduler/tasks/").json()["results"]}
    assert (listed["api-test"]["declared_in"], listed["report"]["declared_in"]) == ("code", "")
    assert api.get("/api/scheduler/tasks/api-test/").json()["declared_in"] == "code"
    response = api.patch("/api/scheduler/tasks/api-test/", {"cron": "0 5 * * *"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "scheduler:044"
    assert "@job in tests.test_declared_tasks" in response.json()["message"]
    response = api.put("/api/scheduler/tasks/api-test/", {"cron": "0 5 * * *"}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "scheduler:044")
    response = api.delete("/api/scheduler/tasks/api-test/")
    assert (response.status_code, response.json()["code"]) == (409, "scheduler:044")
    response = api.patch("/api/scheduler/tasks/api-test/", {"enabled": False}, format="json")
    assert (response.status_code, response.json()["enabled"]) == (200, False)
    assert api.post("/api/scheduler/tasks/api-test/trigger/", {}, format="json").status_code == 202


def test_the_admin_shows_a_declared_task_with_its_code_owned_fields_read_only(admin_client, declare):
    declare("admin-test", cron="0 4 * * *")
    scheduler.refresh_tasks()
    listing = admin_client.get(reverse("admin:scheduler_app_task_changelist")).content.decode()
    assert "code (@job)" in listing
    url = reverse("admin:scheduler_app_task_change", args=["admin-test"])
    page = admin_client.get(url).content.decode()
    assert 'name="enabled"' in page
    assert (
        'name="cron"' not in page and 'name="handler"' not in page and 'name="retry_max_attempts"' not in page
    )
    assert "code (@job)" in page
    # Posting cron anyway changes nothing but what the form holds: enabled.
    response = admin_client.post(url, {"cron": "0 5 * * *", "_save": "Save"})
    assert response.status_code == 302
    task = Task.objects.get()
    assert (task.enabled, task.cron) == (False, "0 4 * * *")
    deleting = admin_client.post(
        reverse("admin:scheduler_app_task_delete", args=["admin-test"]), {"post": "yes"}
    )
    assert deleting.status_code == 403
    assert Task.objects.filter(id="admin-test").exists()


# -- never taking over a task register() created ------------------------------------------


def test_a_declared_id_of_a_registered_task_is_e039_and_the_runner_does_not_start():
    scheduler.register(definition("taken", cron="0 1 * * *"))
    with with_tasks({"id": "taken", "cron": "0 4 * * *"}):
        [message] = check_declared_collisions(databases=["default"])
        level, documented_message, documented_hint = documented()["scheduler_app.E039"]
        assert (message.id, type(message).__name__, message.hint) == (
            "scheduler_app.E039",
            level,
            documented_hint,
        )
        assert re.fullmatch(as_pattern(documented_message), message.msg) and "(taken)" in message.msg
        assert check_declared_collisions(databases=None) == []
        with pytest.raises(TaskAlreadyExists, match="taken"):
            scheduler.refresh_tasks()
        with pytest.raises(CommandError, match=r"cannot start: scheduler:021: .*taken"):
            call_command("run_scheduler", "--once", "--skip-checks")
    task = Task.objects.get()
    assert (task.cron, task.declared_in, task.revision) == ("0 1 * * *", "", 1)


def test_no_collision_without_declarations_or_with_declared_tasks(declare):
    scheduler.register(definition())
    assert check_declared_collisions(databases=["default"]) == []
    declare("mine-test", cron="0 4 * * *")
    scheduler.refresh_tasks()
    assert check_declared_collisions(databases=["default"]) == []


# -- runners starting together ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite serialises the syncs (IMMEDIATE)")
def test_syncs_started_together_all_succeed_and_insert_the_task_once(declare):
    declare("together-test", cron="0 4 * * *")
    barrier = threading.Barrier(4)
    failures: list[BaseException] = []

    def sync() -> None:
        try:
            barrier.wait()
            scheduler.refresh_tasks()
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert list(Task.objects.values_list("id", "revision")) == [("together-test", 1)]
