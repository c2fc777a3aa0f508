"""The REST API: each endpoint, each permission and each error mapping."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import DatabaseError, connection
from django.test import override_settings
from rest_framework.test import APIClient

from scheduler_app import scheduler
from scheduler_app.api.parsers import MAX_BODY_BYTES
from scheduler_app.definitions import MAX_JSON_DEPTH
from scheduler_app.exceptions import InvalidDefinition, StorageError
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Task
from scheduler_app.services import Executions, Scheduler
from tests.factories import definition, expire_lease, inline_runner, run_one_by_one

pytestmark = pytest.mark.django_db

BASE = "/api/scheduler/"
ALL_PERMISSIONS = (
    "view_task",
    "add_task",
    "change_task",
    "change_task_handler",
    "delete_task",
    "view_execution",
    "add_execution",
    "change_execution",
    "view_executionlog",
    "resolve_unknown",
    "view_runner",
)
SECRET_HANDLER = {
    "kind": "api",
    "url": "https://user:hunter2@example.com/hook?token=abc123",
    "method": "POST",
    "headers": {"Authorization": "Bearer s3cret-token"},
}
PROJECTION = {
    "occurrence_id",
    "sequence",
    "task_id",
    "task_revision",
    "trigger_type",
    "trigger_source",
    "idempotency_key",
    "scheduled_for",
    "missed_fire_times",
    "due_at",
    "status",
    "attempt",
    "max_attempts",
    "owner",
    "lease_expires_at",
    "stop_requested",
    "result",
    "error",
    "created_at",
    "started_at",
    "finished_at",
    "updated_at",
    "log_persistence",
}


def make_user(name: str = "alice", *codenames: str, staff: bool = True) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="scheduler_app", codename__in=codenames)
    )
    return User.objects.get(pk=user.pk)


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def api() -> APIClient:
    """A staff user holding every scheduler permission, logged in with a session."""
    return client_for(make_user("alice", *ALL_PERMISSIONS))


def post(client: APIClient, path: str, body: Any = None) -> Any:
    return client.post(BASE + path, body, format="json")


def raw(
    client: APIClient, method: str, path: str, body: bytes | str, content_type: str = "application/json"
) -> Any:
    return getattr(client, method)(BASE + path, body, content_type=content_type)


def assert_error(response: Any, status: int, code: str, fields: set[str] | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]
    if fields is not None:
        assert set(body["fields"]) == fields, body
    return body


def unknown_execution(clock: Any) -> Execution:
    """A manual execution whose runner died while running it: state unknown."""
    if not Task.objects.filter(id="report").exists():
        scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    runner = inline_runner(clock)
    expire_lease(clock)
    runner.tick()
    execution.refresh_from_db()
    assert execution.status == "unknown"
    return execution


# -- tasks ------------------------------------------------------------------------


def test_create_task_answers_201_with_the_definition(api):
    response = post(api, "tasks/", definition(retry={"max_attempts": 3, "backoff": [10]}, params={"a": 1}))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] == "report" and body["revision"] == 1 and body["params"] == {"a": 1}
    assert body["retry"] == {"max_attempts": 3, "backoff": [10]}
    assert body["next_run_at"].endswith("Z")
    task = Task.objects.get()
    assert (task.retry_max_attempts, task.retry_backoff) == (3, [10])


def test_create_an_invalid_task_answers_400_with_field_errors_and_writes_nothing(api):
    response = post(api, "tasks/", definition(cron="61 * * * *", retry={"max_attempts": 0}, overlap="x"))
    assert_error(response, 400, "scheduler:012", {"cron", "retry.max_attempts", "overlap"})
    assert not Task.objects.exists()


def test_a_bad_cron_alone_answers_invalid_cron(api):
    response = post(api, "tasks/", definition(cron="* * *", timezone="Mars/Base"))
    assert_error(response, 400, "scheduler:022", {"cron", "timezone"})


def test_create_an_existing_id_answers_409(api):
    assert post(api, "tasks/", definition()).status_code == 201
    assert_error(post(api, "tasks/", definition(name="Other")), 409, "scheduler:021")
    assert Task.objects.get().name == "Report"


def test_list_filters_searches_and_paginates(api):
    for task_id, name, enabled in (
        ("alpha", "Billing run", True),
        ("beta", "Cleanup", False),
        ("gamma", "Bill", True),
    ):
        scheduler.register(definition(task_id, name=name, enabled=enabled))
    body = api.get(BASE + "tasks/").json()
    assert body["count"] == 3 and [t["id"] for t in body["results"]] == ["alpha", "beta", "gamma"]
    assert [t["id"] for t in api.get(BASE + "tasks/?enabled=false").json()["results"]] == ["beta"]
    assert [t["id"] for t in api.get(BASE + "tasks/?search=bill").json()["results"]] == ["alpha", "gamma"]
    assert [t["id"] for t in api.get(BASE + "tasks/?search=BET").json()["results"]] == ["beta"]
    page = api.get(BASE + "tasks/?page_size=2&page=2").json()
    assert page["count"] == 3 and [t["id"] for t in page["results"]] == ["gamma"] and page["next"] is None
    assert "page_size=2" in page["previous"]
    assert_error(api.get(BASE + "tasks/?enabled=maybe"), 400, "scheduler:012", {"enabled"})
    assert_error(api.get(BASE + "tasks/?page=99"), 404, "not_found")


def test_retrieve_a_task_and_unknown_ids(api):
    scheduler.register(definition())
    assert api.get(BASE + "tasks/report/").json()["name"] == "Report"
    assert_error(api.get(BASE + "tasks/nope/"), 404, "scheduler:020")
    assert_error(api.get(BASE + "tasks/bad%00id/"), 404, "scheduler:020")
    assert_error(api.get(BASE + "tasks/" + "x" * 200 + "/"), 404, "scheduler:020")


def test_patch_changes_the_given_fields_and_null_clears_retry_handler_and_timezone(api):
    scheduler.register(
        definition(
            timezone="Europe/Berlin", retry={"max_attempts": 3, "backoff": [5]}, handler={"kind": "fake"}
        )
    )
    response = api.patch(BASE + "tasks/report/", {"name": "Renamed"}, format="json")
    assert response.status_code == 200 and response.json()["revision"] == 2
    response = api.patch(
        BASE + "tasks/report/", {"retry": None, "handler": None, "timezone": None}, format="json"
    )
    assert response.status_code == 200, response.content
    task = Task.objects.get()
    assert (task.name, task.timezone, task.handler, task.retry_max_attempts, task.retry_backoff) == (
        "Renamed",
        "",
        None,
        1,
        [],
    )
    assert task.revision == 3


def test_an_invalid_patch_changes_nothing(api):
    scheduler.register(definition())
    response = api.patch(BASE + "tasks/report/", {"name": "New", "max_concurrency": 0}, format="json")
    assert_error(response, 400, "scheduler:012", {"max_concurrency"})
    response = api.patch(BASE + "tasks/report/", {"name": "New", "colour": "red"}, format="json")
    assert_error(response, 400, "scheduler:012", {""})
    response = api.patch(BASE + "tasks/report/", {"id": "other"}, format="json")
    assert_error(response, 400, "scheduler:012", {"id"})
    task = Task.objects.get()
    assert (task.name, task.revision) == ("Report", 1)


def test_put_replaces_the_definition_and_left_out_fields_take_their_defaults(api):
    scheduler.register(definition(description="old", retry={"max_attempts": 3}, params={"a": 1}))
    body = api.get(BASE + "tasks/report/").json()
    assert (
        api.put(BASE + "tasks/report/", {**body, "name": "Same otherwise"}, format="json").status_code == 200
    )
    assert Task.objects.get().retry_max_attempts == 3
    response = api.put(BASE + "tasks/report/", {"cron": "5 * * * *"}, format="json")
    assert response.status_code == 200, response.content
    task = Task.objects.get()
    assert (task.cron, task.name, task.description, task.retry_max_attempts, task.params) == (
        "5 * * * *",
        "report",
        "",
        1,
        {},
    )
    assert_error(
        api.put(BASE + "tasks/report/", {"name": "no cron"}, format="json"), 400, "scheduler:022", {"cron"}
    )
    assert_error(
        api.put(BASE + "tasks/report/", definition("other"), format="json"), 400, "scheduler:012", {"id"}
    )
    assert_error(api.put(BASE + "tasks/nope/", definition("nope"), format="json"), 404, "scheduler:020")
    assert Task.objects.get().cron == "5 * * * *"


def test_delete_removes_the_task(api):
    scheduler.register(definition())
    assert api.delete(BASE + "tasks/report/").status_code == 204
    assert not Task.objects.exists()
    assert_error(api.delete(BASE + "tasks/report/"), 404, "scheduler:020")


def test_handler_secrets_are_masked_on_output_and_stored_as_written(api):
    response = post(api, "tasks/", definition(handler=SECRET_HANDLER))
    assert response.status_code == 201, response.content
    for text in (response.content.decode(), api.get(BASE + "tasks/report/").content.decode()):
        for secret in ("hunter2", "abc123", "s3cret-token"):
            assert secret not in text
    assert Task.objects.get().handler == SECRET_HANDLER
    shown = api.get(BASE + "tasks/report/").json()
    assert shown["handler"]["headers"] == {"Authorization": "***"}


def test_the_masked_handler_sent_back_keeps_the_stored_secrets(api):
    scheduler.register(definition(handler=SECRET_HANDLER))
    shown = api.get(BASE + "tasks/report/").json()
    assert api.put(BASE + "tasks/report/", {**shown, "name": "Renamed"}, format="json").status_code == 200
    assert api.patch(BASE + "tasks/report/", {"handler": shown["handler"]}, format="json").status_code == 200
    task = Task.objects.get()
    assert (task.name, task.handler) == ("Renamed", SECRET_HANDLER)
    changed = {**SECRET_HANDLER, "headers": {"Authorization": "Bearer new"}}
    assert api.patch(BASE + "tasks/report/", {"handler": changed}, format="json").status_code == 200
    assert Task.objects.get().handler == changed


def test_a_patch_changing_one_handler_field_keeps_the_secrets_sent_back_masked(api):
    scheduler.register(definition(handler=SECRET_HANDLER))
    shown = api.get(BASE + "tasks/report/").json()["handler"]
    assert shown["headers"] == {"Authorization": "***"}
    assert "hunter2" not in shown["url"] and "abc123" not in shown["url"]
    response = api.patch(BASE + "tasks/report/", {"handler": {**shown, "method": "PUT"}}, format="json")
    assert response.status_code == 200, response.content
    assert Task.objects.get().handler == {**SECRET_HANDLER, "method": "PUT"}


def test_a_masked_secret_sent_to_another_host_is_refused_and_changes_nothing(api):
    scheduler.register(definition(handler=SECRET_HANDLER))
    shown = api.get(BASE + "tasks/report/").json()["handler"]
    moved = {**shown, "url": shown["url"].replace("example.com", "attacker.example")}
    body = assert_error(
        api.patch(BASE + "tasks/report/", {"handler": moved}, format="json"), 400, "scheduler:012"
    )
    assert "hunter2" not in json.dumps(body) and "s3cret-token" not in json.dumps(body)
    assert Task.objects.get().handler == SECRET_HANDLER
    edited = {**shown, "url": shown["url"].replace("/hook", "/v2/hook")}
    assert api.patch(BASE + "tasks/report/", {"handler": edited}, format="json").status_code == 200
    assert Task.objects.get().handler == {
        **SECRET_HANDLER,
        "url": SECRET_HANDLER["url"].replace("/hook", "/v2/hook"),
    }


# -- triggers ----------------------------------------------------------------------


def test_trigger_answers_202_then_200_for_the_same_key_and_409_for_other_params(api):
    scheduler.register(definition(params={"a": 1}))
    first = post(
        api, "tasks/report/trigger/", {"source": "billing", "idempotency_key": "2026-10", "params": {"b": 2}}
    )
    assert first.status_code == 202, first.content
    body = first.json()
    assert set(body) == PROJECTION
    assert (body["status"], body["trigger_type"], body["trigger_source"]) == ("pending", "manual", "billing")
    again = post(
        api, "tasks/report/trigger/", {"source": "billing", "idempotency_key": "2026-10", "params": {"b": 2}}
    )
    assert again.status_code == 200 and again.json()["occurrence_id"] == body["occurrence_id"]
    other = post(api, "tasks/report/trigger/", {"idempotency_key": "2026-10", "params": {"b": 3}})
    assert_error(other, 409, "scheduler:041")
    execution = Execution.objects.get()
    assert str(execution.occurrence_id) == body["occurrence_id"] and execution.params == {"a": 1, "b": 2}


def test_trigger_without_key_creates_each_time_with_the_user_as_source(api):
    scheduler.register(definition())
    responses = [post(api, "tasks/report/trigger/") for _ in range(2)]
    assert [r.status_code for r in responses] == [202, 202]
    assert responses[0].json()["occurrence_id"] != responses[1].json()["occurrence_id"]
    assert set(Execution.objects.values_list("trigger_source", flat=True)) == {"alice"}


def test_trigger_errors(api):
    scheduler.register(definition())
    assert_error(post(api, "tasks/nope/trigger/", {}), 404, "scheduler:020")
    response = post(api, "tasks/report/trigger/", {"params": [1], "idempotency_key": "", "source": 5})
    assert_error(response, 400, "scheduler:012", {"params", "idempotency_key", "source"})
    assert_error(post(api, "tasks/report/trigger/", {"wait": 5}), 400, "scheduler:012", {""})
    assert not Execution.objects.exists()


# -- logs ----------------------------------------------------------------------------


def test_logs_filter_and_paginate_newest_first(api, clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = inline_runner(clock)
    for n, source in enumerate(("billing", "ops", "billing")):
        scheduler.trigger("report", source=source, params={"result": n})
        runner.tick()
        clock.advance(10)
    body = api.get(BASE + "logs/?task_id=report&status=success").json()
    assert body["count"] == 3 and [row["result"] for row in body["results"]] == [2, 1, 0]
    assert set(body["results"][0]) == {
        "id",
        "occurrence_id",
        "task_id",
        "task_name",
        "trigger_type",
        "trigger_source",
        "status",
        "result",
        "error",
        "attempt",
        "started_at",
        "finished_at",
        "duration_ms",
    }
    page = api.get(BASE + "logs/?trigger_source=billing&page_size=1").json()
    assert (page["count"], page["count_exact"]) == (2, True)
    assert [row["result"] for row in page["results"]] == [2]
    assert "page=2" in page["next"] and page["previous"] is None
    second = api.get(page["next"]).json()
    assert [row["result"] for row in second["results"]] == [0] and second["next"] is None
    after = (clock.now() - timedelta(seconds=15)).isoformat()
    body = api.get(BASE + "logs/", {"started_after": after}).json()
    assert [row["result"] for row in body["results"]] == [2]
    assert api.get(BASE + "logs/?trigger_type=scheduled").json()["count"] == 0


def test_the_logs_count_stops_at_its_bound_and_says_so_and_the_next_page_is_linked(api, clock, monkeypatch):
    from scheduler_app import services

    scheduler.register(definition(cron="0 0 1 1 *"))
    run_one_by_one(clock, 3, seconds_apart=10)
    monkeypatch.setattr(services, "LOG_COUNT_AHEAD", 1)
    page = api.get(BASE + "logs/?page_size=1").json()
    assert (page["count"], page["count_exact"], len(page["results"])) == (1, False, 1)
    assert "page=2" in page["next"]


def test_bad_log_filters_answer_400(api):
    response = api.get(BASE + "logs/?status=done&page=0&page_size=501&started_after=yesterday&task_id=a%00b")
    assert_error(response, 400, "scheduler:012", {"status", "page", "page_size", "started_after", "task_id"})


# -- executions ----------------------------------------------------------------------


def test_retrieve_an_execution_shows_the_safe_projection_with_its_history(api):
    scheduler.register(definition(handler=SECRET_HANDLER, params={"password": "p4ss"}))
    execution = scheduler.trigger("report", source="billing")
    response = api.get(BASE + f"executions/{execution.occurrence_id}/")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {*PROJECTION, "events"}
    assert [(e["from_status"], e["to_status"], e["reason"]) for e in body["events"]] == [
        ("", "pending", "triggered by billing")
    ]
    text = response.content.decode()
    for secret in ("p4ss", "hunter2", "example.com", execution.execution_token or "no-token-yet"):
        assert secret not in text
    assert_error(api.get(BASE + f"executions/{uuid.uuid4()}/"), 404, "scheduler:040")
    assert_error(api.get(BASE + "executions/not-a-uuid/"), 404, "scheduler:040")


def test_the_execution_token_never_appears(api, clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report")
    claim = expire_lease(clock)
    execution = Execution.objects.get()
    assert execution.status == "running" and execution.execution_token == claim.token
    for path in (f"executions/{execution.occurrence_id}/", f"logs/?task_id={execution.task_id}"):
        response = api.get(BASE + path)
        assert response.status_code == 200 and claim.token not in response.content.decode()


def test_unknown_executions_are_listed_and_resolved_with_their_updated_at(api, clock):
    execution = unknown_execution(clock)
    body = api.get(BASE + "executions/unknown/").json()
    assert body["count"] == 1 and body["results"][0]["occurrence_id"] == str(execution.occurrence_id)
    listed = body["results"][0]
    path = f"executions/{execution.occurrence_id}/resolve/"
    stale = (execution.updated_at - timedelta(microseconds=1)).isoformat()
    assert_error(post(api, path, {"status": "success", "expected_updated_at": stale}), 409, "scheduler:041")
    response = post(api, path, {"status": "discarded", "expected_updated_at": listed["updated_at"]})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "discarded"
    assert Execution.objects.get().status == "discarded"
    assert ExecutionEvent.objects.filter(reason="resolved as discarded by alice").exists()
    again = post(api, path, {"status": "success", "expected_updated_at": response.json()["updated_at"]})
    assert_error(again, 409, "scheduler:042")
    assert api.get(BASE + "executions/unknown/").json()["count"] == 0


def test_resolve_validates_its_body(api, clock):
    execution = unknown_execution(clock)
    path = f"executions/{execution.occurrence_id}/resolve/"
    response = post(api, path, {"status": "failed", "expected_updated_at": execution.updated_at.isoformat()})
    assert_error(response, 400, "scheduler:012", {"status"})
    response = post(api, path, {"status": "success", "expected_updated_at": "yesterday"})
    assert_error(response, 400, "scheduler:012", {"expected_updated_at"})
    assert_error(post(api, path, {"status": "success"}), 400, "scheduler:012", {"expected_updated_at"})
    assert_error(post(api, path, [1]), 400, "scheduler:012", {""})
    assert Execution.objects.get().status == "unknown"


def test_a_bad_resolve_body_has_its_own_message_not_the_task_definitions(api, clock):
    execution = unknown_execution(clock)
    path = f"executions/{execution.occurrence_id}/resolve/"
    read = execution.updated_at.isoformat()
    refused_by_the_service = [
        {"expected_updated_at": read},
        {"status": "failed", "expected_updated_at": read},
        {"status": 5, "expected_updated_at": read},
        {"status": ["success"], "expected_updated_at": read},
        {"status": "success"},
    ]
    refused_by_the_serializer = [
        {"status": "success", "expected_updated_at": None},
        {"status": "success", "expected_updated_at": 5},
        {"status": "success", "expected_updated_at": read, "resolution": "success"},
        [1],
    ]
    for body in refused_by_the_service + refused_by_the_serializer:
        error = assert_error(post(api, path, body), 400, "scheduler:012")
        assert "definition" not in error["message"], (body, error)
    for body in refused_by_the_service:
        assert post(api, path, body).json()["message"] == "The resolution is invalid.", body
    with pytest.raises(InvalidDefinition, match=r"^The resolution is invalid\.$"):
        scheduler.executions.resolve_unknown(execution.occurrence_id, "failed", execution.updated_at)
    assert Execution.objects.get().status == "unknown"


def test_stop_a_pending_execution_then_stopping_again_is_refused(api):
    scheduler.register(definition())
    execution = scheduler.trigger("report")
    response = post(api, f"executions/{execution.occurrence_id}/stop/")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "interrupted"
    assert_error(post(api, f"executions/{execution.occurrence_id}/stop/"), 409, "scheduler:042")
    assert_error(post(api, f"executions/{uuid.uuid4()}/stop/"), 404, "scheduler:040")


def test_repair_log_rebuilds_the_rows_and_log_failures_lists_what_needs_it(api, clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"result": 7})
    inline_runner(clock).tick()
    ExecutionLog.objects.all().delete()
    Execution.objects.update(log_persistence="pending")
    body = api.get(BASE + "executions/log-failures/").json()
    assert [row["occurrence_id"] for row in body["results"]] == [str(execution.occurrence_id)]
    response = post(api, f"executions/{execution.occurrence_id}/repair-log/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["occurrence_id"] == str(execution.occurrence_id)
    assert [(row["attempt"], row["status"], row["result"]) for row in body["logs"]] == [(1, "success", 7)]
    assert ExecutionLog.objects.count() == 1
    assert post(api, f"executions/{execution.occurrence_id}/repair-log/").status_code == 200
    assert ExecutionLog.objects.count() == 1
    assert api.get(BASE + "executions/log-failures/").json()["count"] == 0


def test_repair_log_reads_the_execution_once_and_answers_the_canonical_id(api, clock, monkeypatch):
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    reads: list[Any] = []
    real_get = Executions.get

    def counting_get(self: Executions, occurrence_id: Any) -> Execution:
        reads.append(occurrence_id)
        return real_get(self, occurrence_id)

    monkeypatch.setattr(Executions, "get", counting_get)
    response = post(api, f"executions/{str(execution.occurrence_id).upper()}/repair-log/")
    assert response.status_code == 200, response.content
    assert response.json()["occurrence_id"] == str(execution.occurrence_id)
    assert len(reads) == 1


# -- permissions ---------------------------------------------------------------------


def test_anonymous_users_are_refused():
    scheduler.register(definition())
    client = client_for(None)
    assert_error(client.get(BASE + "tasks/"), 403, "not_authenticated")
    assert_error(client.post(BASE + "tasks/report/trigger/", {}, format="json"), 403, "not_authenticated")
    assert not Execution.objects.exists()


def test_users_who_are_not_staff_are_refused_even_with_permissions():
    client = client_for(make_user("bob", *ALL_PERMISSIONS, staff=False))
    assert_error(client.get(BASE + "tasks/"), 403, "permission_denied")


def test_each_call_needs_its_model_permission():
    scheduler.register(definition())
    execution = scheduler.trigger("report")
    viewer = client_for(make_user("viewer", "view_task"))
    assert viewer.get(BASE + "tasks/").status_code == 200
    assert viewer.get(BASE + "tasks/report/").status_code == 200
    refused = [
        viewer.post(BASE + "tasks/", definition("new"), format="json"),
        viewer.patch(BASE + "tasks/report/", {"name": "x"}, format="json"),
        viewer.put(BASE + "tasks/report/", definition(), format="json"),
        viewer.delete(BASE + "tasks/report/"),
        viewer.post(BASE + "tasks/report/trigger/", {}, format="json"),
        viewer.get(BASE + "logs/"),
        viewer.get(BASE + "executions/"),
        viewer.get(BASE + "runners/"),
        viewer.get(BASE + "executions/unknown/"),
        viewer.get(BASE + "executions/log-failures/"),
        viewer.get(BASE + f"executions/{execution.occurrence_id}/"),
        viewer.post(BASE + f"executions/{execution.occurrence_id}/stop/"),
        viewer.post(BASE + f"executions/{execution.occurrence_id}/repair-log/"),
    ]
    for response in refused:
        assert_error(response, 403, "permission_denied")
    assert Execution.objects.count() == 1 and Task.objects.get().name == "Report"
    nothing = client_for(make_user("nothing"))
    assert_error(nothing.get(BASE + "tasks/"), 403, "permission_denied")
    trigger_only = client_for(make_user("machine", "add_execution"))
    assert trigger_only.post(BASE + "tasks/report/trigger/", {}, format="json").status_code == 202
    assert_error(trigger_only.get(BASE + "tasks/"), 403, "permission_denied")


def test_trigger_needs_add_execution_as_run_now_in_the_admin_does():
    scheduler.register(definition())
    editor = client_for(make_user("sam", "view_task", "change_task", "change_task_handler"))
    assert_error(post(editor, "tasks/report/trigger/", {}), 403, "permission_denied")
    assert not Execution.objects.exists()
    trigger_only = client_for(make_user("tom", "add_execution"))
    assert post(trigger_only, "tasks/report/trigger/", {}).status_code == 202


def test_options_is_refused_and_cannot_tell_whether_an_id_exists(api):
    scheduler.register(definition())
    execution = scheduler.trigger("report")
    nothing = client_for(make_user("nothing"))
    machine = client_for(make_user("machine", staff=False))
    paths = ["tasks/", "tasks/report/", "tasks/missing/", f"executions/{execution.occurrence_id}/"]
    paths += [f"executions/{uuid.uuid4()}/", "tasks/report/trigger/", "logs/"]
    for path in paths:
        assert_error(nothing.options(BASE + path), 403, "permission_denied")
        assert_error(api.options(BASE + path), 403, "permission_denied")
    with override_settings(
        SCHEDULER_APP={"API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}
    ):
        for path in ("tasks/report/", "tasks/missing/"):
            assert_error(machine.options(BASE + path), 403, "permission_denied")


def test_there_is_no_root_view_to_answer_with_the_hosts_default_permissions():
    assert_error(client_for(None).get(BASE), 404, "not_found")
    assert_error(client_for(make_user("nothing")).get(BASE), 404, "not_found")


def test_changing_a_handler_needs_the_handler_permission():
    scheduler.register(definition(handler=SECRET_HANDLER))
    schedules_only = client_for(make_user("sam", "view_task", "add_task", "change_task"))
    shown = schedules_only.get(BASE + "tasks/report/").json()
    js = {"kind": "js", "code": "() => 1"}
    refused = [
        schedules_only.post(BASE + "tasks/", definition("new", handler=js), format="json"),
        schedules_only.patch(BASE + "tasks/report/", {"handler": js}, format="json"),
        schedules_only.patch(BASE + "tasks/report/", {"handler": None}, format="json"),
        schedules_only.put(BASE + "tasks/report/", {**shown, "handler": js}, format="json"),
        schedules_only.put(
            BASE + "tasks/report/", {k: v for k, v in shown.items() if k != "handler"}, format="json"
        ),
    ]
    for response in refused:
        assert_error(response, 403, "permission_denied")
    assert not Task.objects.filter(id="new").exists()
    assert Task.objects.get(id="report").handler == SECRET_HANDLER
    allowed = [
        schedules_only.post(BASE + "tasks/", definition("new"), format="json"),
        schedules_only.patch(BASE + "tasks/report/", {"cron": "0 5 * * *"}, format="json"),
        schedules_only.patch(BASE + "tasks/report/", {"handler": shown["handler"]}, format="json"),
        schedules_only.put(BASE + "tasks/report/", {**shown, "name": "Renamed"}, format="json"),
    ]
    assert [response.status_code for response in allowed] == [201, 200, 200, 200]
    task = Task.objects.get(id="report")
    assert (task.name, task.handler) == ("Renamed", SECRET_HANDLER)
    assert Task.objects.get(id="new").handler is None


def test_resolve_needs_the_dedicated_permission(clock):
    execution = unknown_execution(clock)
    everything_else = [name for name in ALL_PERMISSIONS if name != "resolve_unknown"]
    client = client_for(make_user("operator", *everything_else))
    body = {"status": "success", "expected_updated_at": execution.updated_at.isoformat()}
    assert_error(
        post(client, f"executions/{execution.occurrence_id}/resolve/", body), 403, "permission_denied"
    )
    assert Execution.objects.get().status == "unknown"
    trusted = client_for(make_user("trusted", "view_execution", "resolve_unknown"))
    assert post(trusted, f"executions/{execution.occurrence_id}/resolve/", body).status_code == 200


def test_api_permission_classes_replace_the_default_but_resolve_still_needs_its_permission(clock):
    execution = unknown_execution(clock)
    machine = client_for(make_user("machine", staff=False))
    body = {"status": "success", "expected_updated_at": execution.updated_at.isoformat()}
    with override_settings(
        SCHEDULER_APP={
            "HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"},
            "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
        }
    ):
        assert machine.get(BASE + "tasks/").status_code == 200
        response = post(machine, f"executions/{execution.occurrence_id}/resolve/", body)
        assert_error(response, 403, "permission_denied")
    assert_error(machine.get(BASE + "tasks/"), 403, "permission_denied")


def test_a_refusal_names_the_missing_permissions():
    scheduler.register(definition(handler=SECRET_HANDLER))
    occurrence = uuid.uuid4()
    resolve = {"status": "success", "expected_updated_at": "2026-03-02T09:00:00.123456Z"}
    viewer = client_for(make_user("viewer", "view_task", "change_task"))
    body = assert_error(post(viewer, "tasks/report/trigger/", {}), 403, "permission_denied")
    assert body["message"] == "Missing permission: scheduler_app.add_execution."
    body = assert_error(post(viewer, f"executions/{occurrence}/resolve/", resolve), 403, "permission_denied")
    assert (
        body["message"] == "Missing permissions: scheduler_app.view_execution, scheduler_app.resolve_unknown."
    )
    response = viewer.patch(BASE + "tasks/report/", {"handler": None}, format="json")
    body = assert_error(response, 403, "permission_denied")
    assert body["message"].startswith("Missing permission: scheduler_app.change_task_handler.")
    outsider = client_for(make_user("outsider", *ALL_PERMISSIONS, staff=False))
    body = assert_error(outsider.get(BASE + "tasks/"), 403, "permission_denied")
    assert body["message"] == "Only staff users may call the scheduler API."
    machine = client_for(make_user("machine", "view_execution", staff=False))
    with override_settings(
        SCHEDULER_APP={"API_PERMISSION_CLASSES": ["scheduler_app.api.permissions.HasModelPermissions"]}
    ):
        body = assert_error(machine.get(BASE + "logs/"), 403, "permission_denied")
        assert body["message"] == "Missing permission: scheduler_app.view_executionlog."
    with override_settings(
        SCHEDULER_APP={"API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}
    ):
        response = post(machine, f"executions/{occurrence}/resolve/", resolve)
        body = assert_error(response, 403, "permission_denied")
        assert body["message"] == "Missing permission: scheduler_app.resolve_unknown."
    body = assert_error(viewer.options(BASE + "tasks/"), 403, "permission_denied")
    assert "refuses this method" in body["message"]


def test_basic_authentication_follows_the_drf_settings(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    make_user("alice", *ALL_PERMISSIONS)
    client = APIClient()
    good = base64.b64encode(b"alice:pw").decode()
    assert client.get(BASE + "tasks/", HTTP_AUTHORIZATION=f"Basic {good}").status_code == 200
    bad = base64.b64encode(b"alice:wrong").decode()
    assert_error(client.get(BASE + "tasks/", HTTP_AUTHORIZATION=f"Basic {bad}"), 403, "authentication_failed")


def test_session_authentication_needs_the_csrf_token():
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(make_user("alice", *ALL_PERMISSIONS))
    response = client.post(BASE + "tasks/", definition(), format="json")
    body = assert_error(response, 403, "permission_denied")
    assert "CSRF" in body["message"]
    assert not Task.objects.exists()


# -- paths the API does not have --------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["", "nope/", "tasks/report/nope/", "executions/unknown/nope/", "schema/docs/x/", "a//b/"]
)
def test_a_path_under_the_mount_that_names_no_endpoint_answers_404_in_the_error_shape(path, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware"]
    scheduler.register(definition())
    # Anonymous, and without a CSRF token on the writes: there is nothing to authorise.
    client = APIClient(enforce_csrf_checks=True)
    for method in ("get", "post", "put", "patch", "delete", "options", "head"):
        response = getattr(client, method)(BASE + path)
        assert response.status_code == 404, (method, response.content)
        assert response["Content-Type"] == "application/json", method
        if method != "head":
            assert response.json() == {"code": "not_found", "message": "No endpoint at this path."}


def test_a_wrong_method_on_a_right_path_keeps_drfs_405(api):
    scheduler.register(definition())
    execution = scheduler.trigger("report")
    assert_error(api.delete(BASE + "tasks/"), 405, "method_not_allowed")
    assert_error(api.get(BASE + "tasks/report/trigger/"), 405, "method_not_allowed")
    assert_error(api.put(BASE + "logs/"), 405, "method_not_allowed")
    assert_error(api.get(BASE + f"executions/{execution.occurrence_id}/stop/"), 405, "method_not_allowed")
    assert_error(api.post(BASE + "executions/unknown/"), 405, "method_not_allowed")


def test_the_hosts_other_paths_keep_the_hosts_404():
    client = client_for(None)
    for path in ("/nope/", "/api/", "/api/other/", "/api/schedulerx/", "/apischeduler/"):
        response = client.get(path)
        assert response.status_code == 404 and response["Content-Type"].startswith("text/html"), path


def test_a_path_without_its_trailing_slash_follows_append_slash(settings):
    client = client_for(None)
    assert client.get(BASE + "tasks").headers["Location"] == BASE + "tasks/"
    response = client.get(BASE + "nope", follow=True)
    assert response.redirect_chain == [(BASE + "nope/", 301)]
    assert_error(response, 404, "not_found")
    settings.APPEND_SLASH = False
    for path in ("tasks", "nope", "tasks/report/trigger"):
        assert_error(client.get(BASE + path), 404, "not_found")


# -- error mapping and input hardening ---------------------------------------------------


def test_a_storage_error_answers_503_with_a_correlation_id_and_no_driver_text(api, monkeypatch, caplog):
    def refuse(self: Scheduler, definition: Any) -> Any:
        raise StorageError() from DatabaseError('relation "secret_table" password=hunter2')

    monkeypatch.setattr(Scheduler, "register", refuse)
    with caplog.at_level(logging.ERROR, logger="scheduler_app.api"):
        response = post(api, "tasks/", definition())
    body = assert_error(response, 503, "scheduler:026")
    assert "secret_table" not in response.content.decode() and "hunter2" not in response.content.decode()
    assert body["correlation_id"] in caplog.text and "secret_table" in caplog.text


def test_an_unexpected_error_answers_a_generic_500_and_rolls_back(api, monkeypatch, caplog):
    def crash(self: Scheduler, definition: Any) -> Any:
        Task.objects.create(id="half-written", cron="* * * * *")
        raise RuntimeError("SELECT secret FROM passwords")

    monkeypatch.setattr(Scheduler, "register", crash)
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    with caplog.at_level(logging.ERROR, logger="scheduler_app.api"):
        response = post(api, "tasks/", definition())
    body = assert_error(response, 500, "server_error")
    assert "secret" not in response.content.decode() and "Traceback" not in response.content.decode()
    assert body["correlation_id"] in body["message"]
    assert body["correlation_id"] in caplog.text and "SELECT secret FROM passwords" in caplog.text
    assert not Task.objects.filter(id="half-written").exists()


def test_http_level_errors_keep_the_json_shape(api):
    scheduler.register(definition())
    assert_error(api.post(BASE + "tasks/report/"), 405, "method_not_allowed")
    response = api.post(BASE + "tasks/", "id=x&cron=*", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "unsupported_media_type")
    body = assert_error(raw(api, "post", "tasks/", b'{"id": "x",'), 400, "scheduler:012")
    assert body["message"] == "The request body is not valid JSON."
    assert_error(raw(api, "post", "tasks/", b'{"id": "x", "max_concurrency": NaN}'), 400, "scheduler:012")
    assert_error(raw(api, "post", "tasks/", b"null"), 400, "scheduler:012", {""})
    assert_error(raw(api, "post", "tasks/", b"[1, 2]"), 400, "scheduler:012", {""})
    assert not Task.objects.filter(id="x").exists()


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ('{"id": "x", "cron": "* * * * *", "name": "a\\u0000b"}', {"name"}),
        ('{"id": "x", "cron": "* * * * *", "params": {"k": ["ok", "a\\u0000"]}}', {"params.k.1"}),
        ('{"id": "x", "cron": "* * * * *", "params": {"k\\u0000": 1}}', {"params.k\\x00"}),
        ('{"id": "x", "cron": "* * * * *", "description": "\\ud800"}', {"description"}),
        ('{"id": "x", "cron": "* * * * *", "params": {"\\udfff": 1}}', {"params.\\udfff"}),
        ('{"id": "x", "cron": "* * * * *", "params": {"n": 1e999}}', {"params.n"}),
    ],
)
def test_strings_and_numbers_no_database_can_store_are_refused(api, body, fields):
    assert_error(raw(api, "post", "tasks/", body.encode()), 400, "scheduler:012", fields)
    assert not Task.objects.exists()


def test_oversized_bodies_strings_and_nesting_are_refused(api):
    huge = json.dumps(definition(description="x" * MAX_BODY_BYTES))
    body = assert_error(raw(api, "post", "tasks/", huge.encode()), 400, "scheduler:012")
    assert str(MAX_BODY_BYTES) in body["message"]
    assert_error(post(api, "tasks/", definition(name="n" * 201)), 400, "scheduler:012", {"name"})
    assert_error(post(api, "tasks/", definition("x" * 129)), 400, "scheduler:012", {"id"})
    nested: Any = 1
    for _ in range(MAX_JSON_DEPTH + 5):
        nested = [nested]
    response = post(api, "tasks/", definition(params={"deep": nested}))
    assert_error(response, 400, "scheduler:012")
    assert "Nested too deeply" in json.dumps(response.json())
    assert_error(raw(api, "post", "tasks/", b"[" * 5000 + b"]" * 5000), 400, "scheduler:012")
    assert not Task.objects.exists()


def test_a_body_past_djangos_upload_limit_is_refused_as_too_large_and_changes_nothing(api):
    scheduler.register(definition())
    before = list(Task.objects.values())
    body = json.dumps(definition(description="x" * 3 * 1024 * 1024)).encode()
    assert len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    for method, path in (("post", "tasks/"), ("put", "tasks/report/"), ("patch", "tasks/report/")):
        error = assert_error(raw(api, method, path, body), 400, "scheduler:012")
        assert error["message"] == f"The request body is larger than {MAX_BODY_BYTES} bytes.", method
    assert list(Task.objects.values()) == before


def test_wrong_types_answer_400_with_field_errors(api):
    response = post(
        api,
        "tasks/",
        definition(enabled="yes", max_concurrency="5", retry="x", params=[1], handler="js", timezone=3),
    )
    assert_error(
        response,
        400,
        "scheduler:012",
        {"enabled", "max_concurrency", "retry", "params", "handler", "timezone"},
    )
    scheduler.register(definition())
    response = api.patch(
        BASE + "tasks/report/", {"params": "x", "misfire_grace_seconds": "60"}, format="json"
    )
    assert_error(response, 400, "scheduler:012", {"params", "misfire_grace_seconds"})
    assert Task.objects.get().revision == 1


# -- schema ----------------------------------------------------------------------------


def test_the_schema_describes_the_trigger_contract_and_the_error_shape(api):
    response = api.get(BASE + "schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["servers"] == [{"url": "/api/scheduler"}]
    assert {"/tasks/", "/tasks/{id}/trigger/", "/logs/", "/executions/unknown/"} <= set(schema["paths"])
    trigger = schema["paths"]["/tasks/{id}/trigger/"]["post"]["responses"]
    assert {"200", "202", "400", "404", "409"} <= set(trigger)
    assert trigger["409"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Error"
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"code", "message"}
    execution = schema["components"]["schemas"]["Execution"]["properties"]
    assert "params" not in execution and "execution_token" not in execution


def test_the_schema_is_not_public():
    response = client_for(None).get(BASE + "schema/", HTTP_ACCEPT="application/json")
    assert_error(response, 403, "not_authenticated")


# -- the services behind the API ---------------------------------------------------------


def test_get_or_trigger_says_whether_it_created_the_execution():
    scheduler.register(definition())
    first, created = scheduler.get_or_trigger("report", idempotency_key="k", params={"a": 1})
    again, created_again = scheduler.get_or_trigger("report", idempotency_key="k", params={"a": 1})
    assert (created, created_again) == (True, False) and first.sequence == again.sequence


def test_replace_task_resets_left_out_fields_and_refuses_another_id():
    scheduler.register(definition(description="old", max_concurrency=3))
    task = scheduler.replace_task("report", {"cron": "5 * * * *"})
    assert (task.description, task.max_concurrency, task.name, task.revision) == ("", 1, "report", 2)
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.replace_task("report", definition("other"))
    assert set(caught.value.errors) == {"id"}
    assert Task.objects.get().revision == 2
