"""The admin as an operator uses it: pages, the task form, actions, the resolve confirmation and permissions."""

from __future__ import annotations

import html
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.db import connection, models
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from scheduler_app import scheduler
from scheduler_app.admin import resolve
from scheduler_app.definitions import MAX_JSON_BYTES
from scheduler_app.exceptions import StorageError, TaskAlreadyExists, TaskNotFound
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Runner, Task
from scheduler_app.services import Scheduler
from tests import hooks
from tests.factories import definition, nested, task_form

pytestmark = pytest.mark.django_db

TOKEN = "tok-3f9a1c77d0e24b5b"
EXECUTIONS = reverse("admin:scheduler_app_execution_changelist")
TASKS = reverse("admin:scheduler_app_task_changelist")
SECRET_HANDLER = {
    "kind": "api",
    "url": "https://robot:pa55word@example.com/hook?token=s3cr3t-query",
    "method": "POST",
    "headers": {"Authorization": "Bearer top-s3cret"},
}
SECRETS = ("pa55word", "s3cr3t-query", "top-s3cret")


def make_execution(task_id: str = "report", status: str = "unknown", **fields: Any) -> Execution:
    """A journal row with its history, written directly: claimed by node-a, then ``status``."""
    now = timezone.now()
    values: dict[str, Any] = {
        "occurrence_id": uuid.uuid4(),
        "task_id": task_id,
        "trigger_type": "scheduled",
        "scheduled_for": now.replace(second=0, microsecond=0) - timedelta(minutes=10),
        "due_at": now - timedelta(minutes=10),
        "status": status,
        "attempt": 1,
        "owner": "node-a",
        "execution_token": TOKEN,
        "lease_expires_at": now - timedelta(minutes=1),
        "created_at": now - timedelta(minutes=10),
        "started_at": now - timedelta(minutes=9),
        "updated_at": now,
        "log_persistence": "persisted",
    }
    values.update(fields)
    execution = Execution.objects.create(**values)
    steps = [("", "pending", "scheduled", "", 0), ("pending", "claimed", "claimed", "node-a", 1)]
    if status != "pending":
        steps.append(("claimed", "running", "started", "node-a", 1))
    reasons = {"unknown": "lease expired while running; outcome unknown", "success": "succeeded"}
    if status not in ("pending", "claimed", "running"):
        steps.append(("running", status, reasons.get(status, status), "node-b", 1))
    for minute, (before, after, reason, node, attempt) in enumerate(steps):
        ExecutionEvent.objects.create(
            execution=execution,
            at=now - timedelta(minutes=10 - minute),
            from_status=before,
            to_status=after,
            reason=reason,
            node=node,
            attempt=attempt,
            result={"sent": 3} if after == "success" else None,
        )
    return execution


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="scheduler_app", codename__in=codenames)
    )
    return user


@pytest.fixture
def operator_client() -> Client:
    """A staff user who may view and operate executions but not resolve unknown ones."""
    client = Client()
    client.force_login(staff("olga", "view_execution", "change_execution", "view_task", "view_executionlog"))
    return client


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def action(name: str, *executions: Execution, **extra: Any) -> dict[str, Any]:
    return {"action": name, "_selected_action": [e.pk for e in executions], "index": "0", **extra}


def confirm(name: str, *executions: Execution, expected: dict[int, str] | None = None) -> dict[str, Any]:
    """The POST the confirmation page sends."""
    data: dict[str, Any] = {"action": name, "_selected_action": [e.pk for e in executions], "post": "yes"}
    for execution in executions:
        value = (expected or {}).get(execution.pk, execution.updated_at.isoformat())
        data[f"expected_{execution.pk}"] = value
    return data


# -- tasks -------------------------------------------------------------------


def test_the_task_list_reads_the_cron_shows_both_zones_and_the_last_outcome(admin_client):
    scheduler.register(definition("report", cron="0 2 * * *", timezone="Europe/Berlin"))
    scheduler.register(definition("sweep", cron="*/5 * * * *"))
    make_execution("report", "success")
    response = admin_client.get(TASKS)
    page = response.content.decode()
    assert "at 02:00 every day" in page
    assert "every 5 minutes" in page
    task = Task.objects.get(id="report")
    berlin = task.next_run_at.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert f"{berlin:%Y-%m-%d %H:%M} CE" in page
    assert f"{task.next_run_at:%Y-%m-%d %H:%M} UTC" in page
    rows = {row.id: row for row in response.context["cl"].result_list}
    assert rows["report"].last_status == "success"
    assert rows["sweep"].last_status is None


def test_the_task_list_searches_and_filters(admin_client):
    scheduler.register(definition("report", name="Nightly report"))
    scheduler.register(definition("sweep", enabled=False))
    make_execution("sweep", "unknown")

    def ids(query: str) -> list[str]:
        return [task.id for task in admin_client.get(f"{TASKS}?{query}").context["cl"].result_list]

    assert ids("q=nightly") == ["report"]
    assert ids("enabled__exact=0") == ["sweep"]
    assert ids("last_outcome=unknown") == ["sweep"]


def test_a_new_task_is_registered_through_the_service(admin_client):
    response = admin_client.post(
        reverse("admin:scheduler_app_task_add"),
        task_form(cron="0  3 * * *", timezone="Europe/Paris", retry_max_attempts=3, retry_backoff="[10, 60]"),
    )
    assert response.status_code == 302
    task = Task.objects.get(id="report")
    assert task.cron == "0 3 * * *"
    assert (task.retry_max_attempts, task.retry_backoff) == (3, [10, 60])
    assert task.next_run_at is not None
    assert LogEntry.objects.get(object_id="report").is_addition()


def test_an_edit_goes_through_update_task(admin_client):
    task = scheduler.register(definition("report", cron="0 2 * * *"))
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    response = admin_client.post(url, task_form(task, cron="30 4 * * *", name="Renamed"))
    assert response.status_code == 302
    task.refresh_from_db()
    assert (task.cron, task.name, task.revision) == ("30 4 * * *", "Renamed", 2)
    assert task.next_run_at.hour == 4 and task.next_run_at.minute == 30
    assert LogEntry.objects.get(object_id="report").is_change()


@pytest.mark.parametrize(
    ("service", "error"),
    [("update_task", StorageError()), ("update_task", TaskNotFound()), ("register", TaskAlreadyExists())],
)
def test_a_save_the_service_refuses_is_a_form_error_not_a_success(admin_client, monkeypatch, service, error):
    task = scheduler.register(definition("report", cron="0 2 * * *"))
    before = Task.objects.values().get(id="report")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(Scheduler, service, refuse)
    if service == "register":
        url, data = reverse("admin:scheduler_app_task_add"), task_form(id="other", cron="0 3 * * *")
    else:
        url, data = (
            reverse("admin:scheduler_app_task_change", args=["report"]),
            task_form(task, cron="0 3 * * *"),
        )
    response = admin_client.post(url, data, follow=True)
    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors() == [
        f"The task was not saved: {error.message}"
    ]
    assert not any("success" in message for message in messages_of(response))
    assert not LogEntry.objects.exists()
    assert list(Task.objects.values()) == [before]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"cron": "61 * * * *"}, "cron", "out of range"),
        ({"timezone": "Mars/Olympus"}, "timezone", "timezone"),
        ({"retry_max_attempts": "0"}, "retry_max_attempts", "from 1 to 100"),
        ({"misfire_grace_seconds": "0"}, "misfire_grace_seconds", "from 1 to 31 days"),
    ],
)
def test_form_errors_are_shown_per_field_and_save_nothing(admin_client, change, field, message):
    task = scheduler.register(definition("report", cron="0 2 * * *"))
    before = Task.objects.values().get(id="report")
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    response = admin_client.post(url, task_form(task, **change))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors[field])
    assert Task.objects.values().get(id="report") == before
    assert not LogEntry.objects.exists()


def test_bad_handler_fields_are_shown_and_save_nothing(admin_client):
    user = User.objects.get(username="admin")
    assert user.has_perm("scheduler_app.change_task_handler")
    task = scheduler.register(definition("report"))
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    bad = json.dumps({"kind": "api", "url": "ftp://example.com/x", "method": "BREW"})
    response = admin_client.post(url, task_form(task, handler=bad))
    assert response.status_code == 200
    errors = " ".join(response.context["adminform"].form.errors["handler"])
    assert "url:" in errors and "method:" in errors
    assert Task.objects.get(id="report").handler is None
    response = admin_client.post(url, task_form(task, handler=json.dumps({"kind": "nope"})))
    assert "Unknown handler kind" in " ".join(response.context["adminform"].form.errors["handler"])
    assert Task.objects.get(id="report").revision == 1


def test_the_change_page_previews_the_next_five_fire_times(admin_client):
    scheduler.register(definition("report", cron="0 9 * * *", timezone="America/New_York"))
    page = admin_client.get(reverse("admin:scheduler_app_task_change", args=["report"])).content.decode()
    preview = re.search(r"<ol>(.*?)</ol>", page, re.S)
    assert preview is not None
    items = re.findall(r"<li>(.*?)</li>", preview.group(1), re.S)
    assert len(items) == 5
    assert all("09:00 E" in item and "UTC" in item for item in items)


def test_handler_secrets_are_masked_on_every_task_page(admin_client):
    scheduler.register(definition("report", handler=SECRET_HANDLER))
    viewer = Client()
    viewer.force_login(staff("vera", "view_task"))
    for client in (admin_client, viewer):
        for url in (TASKS, reverse("admin:scheduler_app_task_change", args=["report"])):
            page = client.get(url).content.decode()
            assert not any(secret in page for secret in SECRETS), url
    page = admin_client.get(reverse("admin:scheduler_app_task_change", args=["report"])).content.decode()
    assert "robot:***@example.com/hook?token=***" in page


def test_saving_the_form_keeps_the_masked_secrets(admin_client):
    task = scheduler.register(definition("report", handler=SECRET_HANDLER))
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    shown = admin_client.get(url).context["adminform"].form.initial["handler"]
    assert shown["headers"] == {"Authorization": "***"}
    edited = {**shown, "method": "PUT"}
    response = admin_client.post(url, task_form(task, handler=json.dumps(edited)))
    assert response.status_code == 302
    assert Task.objects.get(id="report").handler == {**SECRET_HANDLER, "method": "PUT"}


def test_changing_a_handler_needs_its_own_permission(admin_client):
    task = scheduler.register(definition("report", cron="0 2 * * *", handler=SECRET_HANDLER))
    scheduler_only = Client()
    scheduler_only.force_login(staff("sam", "view_task", "change_task"))
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    page = scheduler_only.get(url).content.decode()
    assert 'name="handler"' not in page
    assert not any(secret in page for secret in SECRETS)
    crafted = task_form(task, cron="0 5 * * *", handler=json.dumps({"kind": "js", "code": "() => 1"}))
    response = scheduler_only.post(url, crafted)
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.cron == "0 5 * * *"
    assert task.handler == SECRET_HANDLER
    assert 'name="handler"' in admin_client.get(url).content.decode()


def test_adding_a_task_without_the_handler_permission_gives_a_hook_task():
    client = Client()
    client.force_login(staff("sam", "view_task", "add_task", "change_task"))
    data = task_form(handler=json.dumps({"kind": "fake"}))
    response = client.post(reverse("admin:scheduler_app_task_add"), data)
    assert response.status_code == 302
    assert Task.objects.get(id="report").handler is None


def test_deleting_a_task_unregisters_it_and_keeps_its_journal(admin_client):
    scheduler.register(definition("report"))
    execution = make_execution("report", "success")
    url = reverse("admin:scheduler_app_task_delete", args=["report"])
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Task.objects.exists()
    assert Execution.objects.filter(pk=execution.pk).exists()


def test_run_now_triggers_with_the_admin_as_source(admin_client):
    scheduler.register(definition("report"))
    scheduler.register(definition("sweep", enabled=False))
    response = admin_client.post(
        TASKS, action("run_now") | {"_selected_action": ["report", "sweep"]}, follow=True
    )
    runs = Execution.objects.filter(trigger_type="manual").order_by("task_id")
    assert [(e.task_id, e.trigger_source, e.status) for e in runs] == [
        ("report", "admin", "pending"),
        ("sweep", "admin", "pending"),
    ]
    assert runs[0].events.get().reason == "triggered by admin"
    assert messages_of(response) == ["Triggered 2 tasks; their executions are pending: report, sweep."]
    assert LogEntry.objects.filter(object_id="report", change_message__contains="Run now").exists()


def test_pause_and_resume_name_what_changed_and_what_already_was(admin_client):
    scheduler.register(definition("report"))
    scheduler.register(definition("sweep", enabled=False))
    response = admin_client.post(
        TASKS, action("pause", post="yes", reason="") | {"_selected_action": ["report", "sweep"]}, follow=True
    )
    assert not Task.objects.filter(enabled=True).exists()
    assert messages_of(response) == ["Paused 1 task: report.", "Changed the pause of 1 task: sweep."]
    response = admin_client.post(
        TASKS, action("resume") | {"_selected_action": ["report", "sweep"]}, follow=True
    )
    assert Task.objects.filter(enabled=True).count() == 2
    assert messages_of(response) == ["Resumed 2 tasks: report, sweep."]
    response = admin_client.post(TASKS, action("resume") | {"_selected_action": ["report"]}, follow=True)
    assert messages_of(response) == ["1 task was not paused: report."]
    assert Task.objects.get(id="report").revision == 3
    assert LogEntry.objects.filter(object_id="report").count() == 2


def test_task_actions_need_the_change_permission():
    scheduler.register(definition("report"))
    viewer = Client()
    viewer.force_login(staff("vera", "view_task"))
    page = viewer.get(TASKS).content.decode()
    assert 'value="run_now"' not in page and 'value="pause"' not in page
    response = viewer.post(
        TASKS, action("pause", post="yes", reason="") | {"_selected_action": ["report"]}, follow=True
    )
    assert response.status_code == 200
    assert Task.objects.get(id="report").enabled


def test_run_now_needs_add_execution_as_the_api_trigger_does():
    scheduler.register(definition("report"))
    editor = Client()
    editor.force_login(staff("sam", "view_task", "change_task"))
    assert 'value="run_now"' not in editor.get(TASKS).content.decode()
    response = editor.post(TASKS, action("run_now") | {"_selected_action": ["report"]}, follow=True)
    assert response.status_code == 200
    assert not Execution.objects.exists()
    trigger_only = Client()
    trigger_only.force_login(staff("tom", "view_task", "add_execution"))
    page = trigger_only.get(TASKS).content.decode()
    assert 'value="run_now"' in page and 'value="pause"' not in page
    response = trigger_only.post(TASKS, action("run_now") | {"_selected_action": ["report"]}, follow=True)
    assert messages_of(response) == ["Triggered 1 task; its execution is pending: report."]
    assert Execution.objects.get().trigger_source == "tom"


# -- executions ----------------------------------------------------------------


def test_the_execution_list_offers_unknown_first_and_shows_the_columns(admin_client):
    make_execution("report", "unknown", trigger_source="")
    page = admin_client.get(EXECUTIONS).content.decode()
    filters = re.findall(r'href="\?status=(\w+)"', page)
    assert filters[:2] == ["unknown", "pending"]
    assert "node-a" in page
    assert "1 of 1" in page
    assert TOKEN not in page
    unknown = admin_client.get(f"{EXECUTIONS}?status=unknown").context["cl"].result_list
    assert [e.status for e in unknown] == ["unknown"]


def test_executions_are_found_by_exact_task_id_and_by_occurrence_id(admin_client):
    wanted, other = make_execution("report"), make_execution("sweep")

    def found(**query: str) -> list[int]:
        return [e.pk for e in admin_client.get(EXECUTIONS, query).context["cl"].result_list]

    assert found(q="report") == [wanted.pk]
    assert found(q="repo") == []  # exact: a part of an id would read every row of the journal
    assert found(task_id="sweep") == [other.pk]
    assert found(occurrence_id=str(other.occurrence_id)) == [other.pk]
    assert found(occurrence_id=str(other.occurrence_id).upper()) == [other.pk]


def test_the_execution_page_shows_the_history_and_attempt_outcomes_never_the_token(admin_client):
    execution = make_execution("report", "success", result={"sent": 3})
    page = admin_client.get(
        reverse("admin:scheduler_app_execution_change", args=[execution.pk])
    ).content.decode()
    for reason in ("scheduled", "claimed", "started", "succeeded"):
        assert reason in page
    assert "node-b" in page
    assert "{&quot;sent&quot;: 3}" in page
    assert TOKEN not in page
    assert "execution_token" not in page


def test_the_token_and_handler_secrets_cannot_be_guessed_through_list_filters(admin_client):
    make_execution("report", "unknown")
    scheduler.register(definition("report", handler=SECRET_HANDLER))
    viewer = Client()
    viewer.force_login(staff("vera", "view_execution", "view_task"))
    for client in (admin_client, viewer):
        for url in (
            f"{EXECUTIONS}?execution_token__startswith={TOKEN[:5]}",
            f"{EXECUTIONS}?execution_token={TOKEN}",
            f"{TASKS}?handler__icontains=top-s3cret",
            f"{TASKS}?handler__isnull=False",
        ):
            assert client.get(url).status_code == 400, url
    assert admin_client.get(f"{EXECUTIONS}?owner=node-a").context["cl"].result_count == 1


def test_the_resolve_confirmation_lists_the_evidence_and_the_values_it_read(admin_client):
    execution = make_execution("report", "unknown")
    response = admin_client.post(EXECUTIONS, action("resolve_as_discarded", execution))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Resolve unknown executions as discarded?" in page
    assert "lease expired while running; outcome unknown" in page
    assert "node-a" in page
    assert f'name="expected_{execution.pk}" value="{execution.updated_at.isoformat()}"' in page
    assert TOKEN not in page
    assert Execution.objects.get(pk=execution.pk).status == "unknown"


def test_the_resolve_confirmation_shows_the_state_changes_of_the_last_attempt(admin_client):
    execution = make_execution("report", "unknown", attempt=2)
    execution.events.filter(to_status="unknown").delete()
    now = timezone.now()
    for minutes, before, after, reason in (
        (3, "running", "pending", "retry after failure"),
        (2, "pending", "claimed", "retry claimed"),
        (1, "claimed", "unknown", "lease expired while claimed"),
    ):
        ExecutionEvent.objects.create(
            execution=execution,
            at=now - timedelta(minutes=minutes),
            from_status=before,
            to_status=after,
            reason=reason,
            node="node-c",
            attempt=1 if after == "pending" else 2,
        )
    page = admin_client.post(EXECUTIONS, action("resolve_as_success", execution)).content.decode()
    assert "Last attempt (2)" in page
    table = re.search(r'<table class="scheduler-last-attempt">(.*?)</table>', page, re.S)
    assert table is not None
    rows = [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)
        if "<td>" in row
    ]
    assert [row[1:] for row in rows] == [
        ["pending", "claimed", "retry claimed", "node-c"],
        ["claimed", "unknown", "lease expired while claimed", "node-c"],
    ]
    assert rows[0][0] == f"{now - timedelta(minutes=2):%Y-%m-%d %H:%M:%S} UTC"


@pytest.mark.parametrize(("minutes", "label"), [(-1, "Lease expired"), (5, "Lease expires"), (None, "Lease")])
def test_the_resolve_confirmation_says_whether_the_lease_has_expired(admin_client, minutes, label):
    lease = None if minutes is None else timezone.now() + timedelta(minutes=minutes)
    execution = make_execution("report", "unknown", lease_expires_at=lease)
    page = admin_client.post(EXECUTIONS, action("resolve_as_success", execution)).content.decode()
    assert re.findall(r'<th scope="row">(Lease[^<]*)</th>', page) == [label]


def test_every_static_file_the_confirmation_page_links_is_shipped(admin_client):
    # A missing file is a 404 with plain storage and a 500 with ManifestStaticFilesStorage.
    execution = make_execution("report", "unknown")
    page = admin_client.post(EXECUTIONS, action("resolve_as_success", execution)).content.decode()
    linked = re.findall(r'(?:src|href)="/static/([^"]+)"', page)
    assert "admin/js/cancel.js" in linked
    assert [path for path in linked if finders.find(path) is None] == []


def test_confirming_resolves_each_row_and_records_it(admin_client):
    first, second = make_execution("report"), make_execution("sweep")
    response = admin_client.post(EXECUTIONS, confirm("resolve_as_success", first, second), follow=True)
    assert {e.status for e in Execution.objects.all()} == {"success"}
    assert first.events.last().reason == "resolved as success by admin"
    names = f"report {str(first.occurrence_id)[:8]}, sweep {str(second.occurrence_id)[:8]}"
    assert messages_of(response) == [f"Resolved 2 unknown executions as success: {names}."]
    entries = LogEntry.objects.filter(change_message="Resolved unknown as success.")
    assert {entry.object_id for entry in entries} == {str(first.pk), str(second.pk)}
    assert ExecutionLog.objects.get(occurrence_id=first.occurrence_id).status == "success"


def test_resolve_messages_have_one_message_id_whatever_the_status(admin_client, monkeypatch):
    asked: list[str] = []

    def recording_ngettext(singular: str, plural: str, number: int) -> str:
        asked.append(singular)
        return singular if number == 1 else plural

    monkeypatch.setattr(resolve, "ngettext", recording_ngettext)
    for name, execution in (
        ("resolve_as_success", make_execution()),
        ("resolve_as_discarded", make_execution()),
    ):
        response = admin_client.post(EXECUTIONS, confirm(name, execution), follow=True)
        assert messages_of(response)[0].startswith("Resolved 1 unknown execution as ")
    resolved = [text for text in asked if text.startswith("Resolved")]
    assert resolved == ["Resolved %(count)d unknown execution as %(status)s: %(items)s."] * 2


def test_a_row_changed_after_the_confirmation_page_is_a_conflict_and_left_alone(admin_client):
    stale, fresh = make_execution("report"), make_execution("sweep")
    shown = confirm("resolve_as_discarded", stale, fresh)
    Execution.objects.filter(pk=stale.pk).update(updated_at=stale.updated_at + timedelta(seconds=1))
    response = admin_client.post(EXECUTIONS, shown, follow=True)
    assert Execution.objects.get(pk=stale.pk).status == "unknown"
    assert Execution.objects.get(pk=fresh.pk).status == "discarded"
    assert messages_of(response) == [
        f"Resolved 1 unknown execution as discarded: sweep {str(fresh.occurrence_id)[:8]}.",
        f"1 execution changed after the confirmation page was shown and was left alone "
        f"(conflict; review it again): report {str(stale.occurrence_id)[:8]}.",
    ]
    assert not LogEntry.objects.filter(object_id=str(stale.pk)).exists()


def test_a_row_resolved_by_someone_else_meanwhile_is_a_conflict(admin_client):
    execution = make_execution("report")
    shown = confirm("resolve_as_discarded", execution)
    scheduler.executions.resolve_unknown(execution.occurrence_id, "success", execution.updated_at, by="bob")
    response = admin_client.post(EXECUTIONS, shown, follow=True)
    assert Execution.objects.get(pk=execution.pk).status == "success"
    assert "conflict" in messages_of(response)[0]


def test_rows_that_are_not_unknown_are_refused(admin_client):
    unknown, done = make_execution("report"), make_execution("sweep", "success")
    page = admin_client.post(EXECUTIONS, action("resolve_as_success", unknown, done)).content.decode()
    assert "1 selected execution is not unknown and will be refused." in page
    response = admin_client.post(EXECUTIONS, confirm("resolve_as_success", unknown, done), follow=True)
    assert Execution.objects.get(pk=unknown.pk).status == "success"
    assert done.events.count() == Execution.objects.get(pk=done.pk).events.count() == 4
    assert messages_of(response)[1] == (
        f"Refused to resolve 1 execution: sweep {str(done.occurrence_id)[:8]} (success, not unknown)."
    )


def test_without_the_resolve_permission_neither_the_action_nor_a_crafted_post_resolves(operator_client):
    execution = make_execution("report")
    page = operator_client.get(EXECUTIONS).content.decode()
    assert "resolve_as_success" not in page
    assert "repair_logs" in page
    for data in (action("resolve_as_success", execution), confirm("resolve_as_success", execution)):
        response = operator_client.post(EXECUTIONS, data, follow=True)
        assert messages_of(response) == ["No action selected."]
    assert Execution.objects.get(pk=execution.pk).status == "unknown"
    assert not LogEntry.objects.exists()


def test_the_resolve_permission_lets_a_staff_user_resolve():
    execution = make_execution("report")
    client = Client()
    client.force_login(staff("rita", "view_execution", "resolve_unknown"))
    response = client.post(EXECUTIONS, confirm("resolve_as_discarded", execution), follow=True)
    assert Execution.objects.get(pk=execution.pk).status == "discarded"
    assert execution.events.last().reason == "resolved as discarded by rita"
    assert len(messages_of(response)) == 1


def test_csrf_is_enforced_on_the_confirmation():
    execution = make_execution("report")
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.post(EXECUTIONS, confirm("resolve_as_success", execution))
    assert response.status_code == 403
    assert Execution.objects.get(pk=execution.pk).status == "unknown"
    page = client.post(EXECUTIONS, action("resolve_as_success", execution))
    assert page.status_code == 403


def test_a_confirmation_without_expected_values_is_refused(admin_client):
    execution = make_execution("report")
    data = confirm("resolve_as_success", execution)
    del data[f"expected_{execution.pk}"]
    response = admin_client.post(EXECUTIONS, data, follow=True)
    assert Execution.objects.get(pk=execution.pk).status == "unknown"
    assert "not confirmed on the confirmation page" in messages_of(response)[0]


def test_repair_logs_rebuilds_rows_is_safe_twice_and_runs_no_handler(operator_client):
    execution = make_execution("report", "success", log_persistence="pending")
    assert not ExecutionLog.objects.exists()
    for _ in range(2):
        response = operator_client.post(EXECUTIONS, action("repair_logs", execution), follow=True)
        assert messages_of(response) == [
            f"Rebuilt the log rows of 1 execution: report {str(execution.occurrence_id)[:8]}."
        ]
    row = ExecutionLog.objects.get()
    assert (row.status, row.attempt, row.result) == ("success", 1, {"sent": 3})
    assert Execution.objects.get(pk=execution.pk).log_persistence == "persisted"
    assert hooks.CALLS == []
    assert LogEntry.objects.filter(change_message__contains="Log rows rebuilt").count() == 2


def test_request_stop_ends_pending_flags_running_and_refuses_finished(operator_client):
    pending = make_execution("a", "pending", attempt=0, owner="", lease_expires_at=None, started_at=None)
    running = make_execution("b", "running")
    finished = make_execution("c", "success")
    response = operator_client.post(
        EXECUTIONS, action("request_stop", pending, running, finished), follow=True
    )
    pending.refresh_from_db()
    running.refresh_from_db()
    assert pending.status == "interrupted"
    assert pending.events.last().reason == "stop requested: by olga"
    assert (running.status, running.stop_requested) == ("running", True)
    assert Execution.objects.get(pk=finished.pk).status == "success"
    text = messages_of(response)
    assert text[0] == f"Stopped 1 pending execution: a {str(pending.occurrence_id)[:8]}."
    assert text[1].startswith("Asked the runner to stop 1 execution within about a tick: b ")
    assert text[2].startswith("Refused to stop 1 execution: c ")


def test_the_execution_pages_are_read_only(admin_client):
    execution = make_execution("report")
    url = reverse("admin:scheduler_app_execution_change", args=[execution.pk])
    admin_client.post(url, {"status": "success"})
    assert Execution.objects.get(pk=execution.pk).status == "unknown"
    assert admin_client.get(reverse("admin:scheduler_app_execution_add")).status_code == 403


# -- logs, runners, dashboard --------------------------------------------------


def log_row(task_id: str, status: str, started: datetime, source: str = "") -> ExecutionLog:
    occurrence = uuid.uuid4()
    return ExecutionLog.objects.create(
        id=uuid.uuid5(occurrence, "1"),
        occurrence_id=occurrence,
        task_id=task_id,
        trigger_type="manual" if source else "scheduled",
        trigger_source=source,
        status=status,
        attempt=1,
        started_at=started,
        finished_at=started + timedelta(seconds=1),
        duration_ms=1000,
    )


def test_the_logs_filter_like_get_logs():
    day = datetime(2026, 3, 2, tzinfo=UTC)
    log_row("report", "success", day)
    log_row("report", "failed", day + timedelta(days=1), source="billing")
    log_row("sweep", "success", day + timedelta(days=2))
    client = Client()
    client.force_login(staff("lena", "view_executionlog"))
    url = reverse("admin:scheduler_app_executionlog_changelist")

    def found(query: str) -> list[tuple[str, str]]:
        response = client.get(f"{url}?{query}")
        return sorted((row.task_id, row.status) for row in response.context["cl"].result_list)

    assert found("task_id=report") == [("report", "failed"), ("report", "success")]
    assert found("status__exact=success") == [("report", "success"), ("sweep", "success")]
    assert found("trigger_type__exact=manual") == [("report", "failed")]
    assert found("trigger_source=billing") == [("report", "failed")]
    assert found("started_after=2026-03-03&started_before=2026-03-04") == [("report", "failed")]
    response = client.get(f"{url}?started_after=yesterday")
    assert messages_of(response) == ["Ignored the started after filter: not a date or date and time."]
    assert len(response.context["cl"].result_list) == 3


def test_runners_show_who_is_alive_and_what_they_hold(admin_client):
    now = timezone.now()
    Runner.objects.create(
        node_id="node-a",
        host="h1",
        pid=1,
        started_at=now - timedelta(hours=1),
        last_seen_at=now,
        silent_after=now + timedelta(seconds=61),
        version="1",
    )
    Runner.objects.create(
        node_id="node-old",
        host="h2",
        pid=2,
        started_at=now - timedelta(days=1),
        last_seen_at=now - timedelta(hours=2),
        silent_after=now - timedelta(hours=2) + timedelta(seconds=61),
        version="1",
    )
    make_execution("report", "running")
    make_execution("sweep", "success")
    response = admin_client.get(reverse("admin:scheduler_app_runner_changelist"))
    rows = {runner.node_id: runner for runner in response.context["cl"].result_list}
    assert (rows["node-a"].state, rows["node-a"].held) == ("alive", 1)
    assert (rows["node-old"].state, rows["node-old"].held) == ("silent", 0)
    assert "owner=node-a&amp;status__in=claimed%2Crunning" in response.content.decode()
    alive = admin_client.get(reverse("admin:scheduler_app_runner_changelist") + "?state=alive")
    assert [runner.node_id for runner in alive.context["cl"].result_list] == ["node-a"]


def test_an_operator_marks_a_silent_runner_stopped_and_its_heartbeat_would_revive_it(clock):
    """A runner killed without a clean stop is silent for a day of scheduler_status alerts until an
    operator with change_runner says it is gone; alive and stopped runners are left as they are."""
    from scheduler_app import health
    from scheduler_app.db import probe
    from tests.factories import inline_runner

    now = probe().now  # runners write their heartbeats on the database clock
    for node_id, silent_after, stopped_at in [
        ("gone", now - timedelta(minutes=5), None),
        ("alive", now + timedelta(minutes=5), None),
        ("done", now - timedelta(minutes=5), now - timedelta(minutes=6)),
    ]:
        Runner.objects.create(
            node_id=node_id,
            host="h",
            pid=1,
            started_at=now - timedelta(hours=1),
            last_seen_at=silent_after - timedelta(seconds=61),
            silent_after=silent_after,
            stopped_at=stopped_at,
        )
    url = reverse("admin:scheduler_app_runner_changelist")
    selected = {
        "action": "mark_stopped",
        "_selected_action": list(Runner.objects.values_list("pk", flat=True)),
    }
    viewer = Client()
    viewer.force_login(staff("vera", "view_runner"))
    assert "mark_stopped" not in viewer.get(url).content.decode()
    viewer.post(url, selected)
    assert Runner.objects.get(node_id="gone").stopped_at is None
    operator = Client()
    operator.force_login(staff("otto", "view_runner", "change_runner"))
    response = operator.post(url, selected, follow=True)
    assert messages_of(response) == [
        "Marked 1 silent runner as stopped: gone.",
        "Left 2 runners as they are (alive or already stopped): alive, done.",
    ]
    states = {r.node_id: r.state for r in Runner.objects.with_state(probe().now)}
    assert states == {"gone": "stopped", "alive": "alive", "done": "stopped"}
    assert "silent_runners" not in {c.name for c in health.check(probe().now).conditions}
    runner = inline_runner(clock, node_id="gone")
    Runner.objects.filter(node_id="gone").update(stopped_at=now)
    runner.renew_leases()
    assert Runner.objects.get(node_id="gone").stopped_at is None


def test_the_dashboard_counts_states_and_draws_runs_per_hour(admin_client):
    make_execution("a", "unknown")
    make_execution("b", "success", log_persistence="pending")
    make_execution("c", "success")
    ended = timezone.now() - timedelta(minutes=1)
    for task_id in ("b", "c"):
        log_row(task_id, "success", ended - timedelta(seconds=1))
    page = admin_client.get(reverse("admin:app_list", args=["scheduler_app"])).content.decode()
    assert re.search(
        r'id="scheduler-unknown"[^>]*class="scheduler-alert">\s*<strong>1</strong> unknown', page
    )
    assert re.search(r'id="scheduler-log-failures"[^>]*class="scheduler-warn">\s*<strong>1</strong>', page)
    hour = ended.astimezone(UTC)
    assert f"{hour:%Y-%m-%d %H}:00 UTC: 2 success, 0 failed, 0 interrupted, 0 unknown" in page
    start = page.index('id="scheduler-dashboard"')
    dashboard = page[start : page.index("</svg>", start)]
    assert "<svg" in dashboard and "<script" not in dashboard


def test_the_dashboard_says_when_no_runner_is_alive_and_names_the_silent_ones(admin_client):
    url = reverse("admin:app_list", args=["scheduler_app"])
    page = admin_client.get(url).content.decode()
    assert re.search(
        r'id="scheduler-runners"[^>]*class="scheduler-alert">\s*<strong>0</strong> no live runner', page
    )
    now = timezone.now()
    Runner.objects.create(
        node_id="dead", host="h", pid=1, started_at=now, last_seen_at=now, silent_after=now, version="1"
    )
    Runner.objects.create(
        node_id="up",
        host="h",
        pid=2,
        started_at=now,
        last_seen_at=now,
        silent_after=now + timedelta(minutes=5),
        version="1",
    )
    page = admin_client.get(url).content.decode()
    assert re.search(
        r'id="scheduler-runners"[^>]*class="scheduler-warn">\s*<strong>1</strong> live runner; silent: dead',
        page,
    )


def test_a_failed_attempt_that_will_be_retried_counts_as_failed_on_the_dashboard_and_the_task_list(
    admin_client, clock
):
    from django.test import override_settings

    from tests.factories import definition, inline_runner

    scheduler.register(definition("flaky", cron="0 0 1 1 *", retry={"max_attempts": 3, "backoff": [60]}))
    scheduler.trigger("flaky", params={"fail": True})
    with override_settings(SCHEDULER_APP={"HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"}}):
        inline_runner(clock).tick()
    assert Execution.objects.get().status == "pending"  # its retry waits 60 s
    page = admin_client.get(reverse("admin:app_list", args=["scheduler_app"])).content.decode()
    assert "1 failed, 0 interrupted, 0 unknown" in page and re.search(r"failed: 1\b", page)
    tasks = admin_client.get(reverse("admin:scheduler_app_task_changelist") + "?last_outcome=failed")
    assert [task.id for task in tasks.context["cl"].result_list] == ["flaky"]
    assert tasks.context["cl"].result_list[0].last_status == "failed"


def test_the_dashboard_is_hidden_from_users_who_cannot_see_executions():
    client = Client()
    client.force_login(staff("tom", "view_task"))
    page = client.get(reverse("admin:app_list", args=["scheduler_app"])).content.decode()
    assert "scheduler-dashboard" not in page


# -- every admin of the app: query-string filters, NUL, the form's input checks --------------

APP_MODELS = sorted(
    (model for model in apps.get_app_config("scheduler_app").get_models() if admin.site.is_registered(model)),
    key=lambda model: model._meta.model_name,
)
# Filters other scheduler pages link to (the runner list links to the executions a runner holds,
# a task's history page to its changes, tasks and log rows to executions, executions to log rows).
LINKED = {
    "execution": {"owner", "status__in", "task_id"},
    "taskchange": {"task_id"},
}
SUFFIXES = ("", "__exact", "__iexact", "__startswith", "__icontains", "__isnull", "__in", "__gte", "__regex")
# Guesses that must be among those tried.
NAMED_GUESSES = {
    "task": {"params__token__startswith", "params__has_key", "handler__icontains"},
    "execution": {
        "params__token__startswith",
        "params__has_key",
        "result__token",
        "error__code__startswith",
        "execution_token__startswith",
        "payload_hash__startswith",
        "events__reason__startswith",
        "events__result",
    },
    "executionlog": {"result__token", "error__code__startswith"},
}
JSON_PATHS = ("token", "token__startswith", "has_key", "has_keys", "contains", "0", "code__startswith")


def rows_of_every_kind() -> None:
    """A row for each admin, holding values the pages never show."""
    scheduler.register(definition("report", params={"token": "p4ram-secret"}, handler=SECRET_HANDLER))
    make_execution(
        "report",
        "failed",
        params={"token": "p4ram-secret"},
        payload_hash="9f86d081884c7d659a2feaa0c55ad015",
        result={"token": "r3sult"},
        error={"code": "scheduler:023", "message": "secret-ish"},
    )
    log_row("report", "success", timezone.now())
    now = timezone.now()
    Runner.objects.create(
        node_id="node-a", host="h1", pid=1, started_at=now, last_seen_at=now, silent_after=now, version="1"
    )


def guesses(model: type[models.Model]) -> set[str]:
    """Lookups a curious viewer could try: every field, JSON key paths, spans over relations."""
    found: set[str] = set()
    for field in model._meta.get_fields():
        found.update(f"{field.name}{suffix}" for suffix in SUFFIXES)
        if isinstance(field, models.JSONField):
            found.update(f"{field.name}__{path}" for path in JSON_PATHS)
        if field.related_model is not None:
            for related in field.related_model._meta.get_fields():
                found.update((f"{field.name}__{related.name}", f"{field.name}__{related.name}__startswith"))
    return found


def changelist(model: type[models.Model]) -> str:
    return reverse(f"admin:scheduler_app_{model._meta.model_name}_changelist")


def offered(page: Any) -> set[str]:
    """The query-string parameters the filters of a rendered list read."""
    return {name for spec in page.context["cl"].filter_specs for name in spec.expected_parameters()}


def viewer() -> Client:
    client = Client()
    client.force_login(
        staff("vic", "view_task", "view_taskchange", "view_execution", "view_executionlog", "view_runner")
    )
    return client


def test_every_admin_of_the_app_is_covered():
    assert {model._meta.model_name for model in APP_MODELS} >= {"task", "execution", "executionlog", "runner"}


@pytest.mark.parametrize("model", APP_MODELS, ids=lambda model: model._meta.model_name)
def test_a_list_accepts_only_the_filters_it_offers(model):
    rows_of_every_kind()
    client = viewer()
    url = changelist(model)
    page = client.get(url)
    assert page.status_code == 200
    own = offered(page) | LINKED.get(model._meta.model_name, set())
    answered = {}
    for lookup in sorted(guesses(model) - own):
        response = client.get(url, {lookup: "1"})
        # 400 (DisallowedModelAdminLookup), and not a figure on the page: no count to compare.
        count_free = set(re.findall(rb"\b\d+\b", response.content)) <= {b"400"}
        if response.status_code != 400 or "cl" in (response.context or {}) or not count_free:
            answered[lookup] = response.status_code
    assert answered == {}
    assert NAMED_GUESSES.get(model._meta.model_name, set()) <= guesses(model) - own
    links = {html.unescape(link) for link in re.findall(r'href="(\?[^"]*)"', page.content.decode())}
    tried = [*links, *(f"?{name}=1" for name in sorted(own))]
    if model_admin_searches(model):
        tried.append("?q=report")
    for query in tried:
        response = client.get(url + query)
        assert response.status_code == 200 and "cl" in response.context, query
    assert len(client.get(url).context["cl"].result_list) == 1


def model_admin_searches(model: type[models.Model]) -> bool:
    return bool(admin.site.get_model_admin(model).search_fields)


@pytest.mark.parametrize("model", APP_MODELS, ids=lambda model: model._meta.model_name)
def test_a_nul_in_a_filter_search_or_selection_is_a_400_on_every_admin(admin_client, model):
    rows_of_every_kind()
    admin_client.raise_request_exception = False
    url = changelist(model)
    names = sorted(offered(admin_client.get(url)) | LINKED.get(model._meta.model_name, set()))
    for name in [*names, "q"]:
        for value in ("\x00", "report\x00"):
            assert admin_client.get(url, {name: value}).status_code == 400, name
    assert admin_client.get(url, {"\x00": "1"}).status_code == 400
    selection = {"action": "delete_selected", "_selected_action": ["\x00"], "index": "0"}
    assert admin_client.post(url, selection).status_code == 400


@pytest.mark.parametrize("model", APP_MODELS, ids=lambda model: model._meta.model_name)
def test_an_object_url_with_a_nul_answers_as_for_a_missing_object(admin_client, model):
    rows_of_every_kind()
    admin_client.raise_request_exception = False
    base = changelist(model)

    def answer(object_id: str, suffix: str) -> tuple[int, str, list[str]]:
        """The final status, path and messages, with the id written as <id>."""
        response = admin_client.get(f"{base}{object_id}/{suffix}", follow=True)
        said = messages_of(response) if response.context else []
        shown = unquote(object_id)
        return (
            response.status_code,
            response.request["PATH_INFO"].replace(shown, "<id>"),
            [text.replace(shown, "<id>") for text in said],
        )

    for suffix in ("", "change/", "history/", "delete/"):
        missing = answer("missing", suffix)
        assert missing[0] in (200, 403)
        assert answer("%00", suffix) == answer("report%00", suffix) == missing, suffix


DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"params": '{"a": "\\ud800"}'}, "params", "a: Must not contain unpaired surrogates."),
        (
            {"handler": '{"kind": "fake", "result": "\\udfff"}'},
            "handler",
            "result: Must not contain unpaired",
        ),
        ({"params": DEEP}, "params", "Nested too deeply"),
        ({"handler": DEEP}, "handler", "Nested too deeply"),
        ({"retry_backoff": DEEP}, "retry_backoff", "Nested too deeply"),
        ({"params": '{"a": "x\\u0000"}'}, "params", "a: Must not contain NUL characters."),
        ({"handler": '{"kind": "fake", "result": {"k\\u0000": 1}}'}, "handler", "Key: Must not contain NUL"),
        ({"retry_backoff": '["\\u0000"]'}, "retry_backoff", "0: Must not contain NUL characters."),
        ({"params": json.dumps({"deep": nested(40)})}, "params", "Nested too deeply (at most 32 levels)."),
        ({"params": json.dumps({"blob": "x" * MAX_JSON_BYTES})}, None, f"larger than {MAX_JSON_BYTES} bytes"),
        ({"retry_max_attempts": "\u0661\u0662"}, "retry_max_attempts", "Enter a whole number."),
        ({"max_concurrency": "\u0663"}, "max_concurrency", "Enter a whole number."),
        ({"misfire_grace_seconds": "\u0666\u0660"}, "misfire_grace_seconds", "Enter a whole number."),
    ],
    ids=[
        "surrogate-in-params",
        "surrogate-in-handler",
        "10000-deep-params",
        "10000-deep-handler",
        "10000-deep-backoff",
        "nul-in-params",
        "nul-in-a-handler-key",
        "nul-in-backoff",
        "40-deep-params",
        "over-1-mib",
        "arabic-digits-retry",
        "arabic-digits-concurrency",
        "arabic-digits-misfire-grace",
    ],
)
def test_the_task_form_refuses_what_the_api_refuses_and_changes_nothing(admin_client, change, field, message):
    task = scheduler.register(definition("report", cron="0 2 * * *"))
    before = Task.objects.values().get(id="report")
    admin_client.raise_request_exception = False
    for url, data in (
        (reverse("admin:scheduler_app_task_change", args=["report"]), task_form(task, **change)),
        (reverse("admin:scheduler_app_task_add"), task_form(id="other", **change)),
    ):
        response = admin_client.post(url, data)
        assert response.status_code == 200, url
        form = response.context["adminform"].form
        errors = form.non_field_errors() if field is None else form.errors.get(field, [])
        assert any(message in error for error in errors), form.errors
    assert list(Task.objects.values()) == [before]
    assert not LogEntry.objects.exists()


def test_a_refused_json_field_is_shown_back_as_typed(admin_client):
    task = scheduler.register(definition("report"))
    typed = '{"a":   "\\ud800",\n "b": 1}'
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    page = admin_client.post(url, task_form(task, params=typed)).content.decode()
    assert re.search(rf'<textarea name="params"[^>]*>\s*{re.escape(html.escape(typed))}</textarea>', page)


def test_a_stored_unpaired_surrogate_does_not_break_the_change_page(admin_client):
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite stores an unpaired surrogate")
    scheduler.register(definition("report"))
    Task.objects.filter(id="report").update(params={"a": "\ud800"})
    response = admin_client.get(reverse("admin:scheduler_app_task_change", args=["report"]))
    assert response.status_code == 200
    assert "\\ud800" in response.content.decode()
