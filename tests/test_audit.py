"""The audit trail of definitions: every change of a task, who made it, when, old -> new, secrets
masked, kept after the task is deleted; in the Python API, the REST API and the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition, TaskDeclared, TaskNotFound
from scheduler_app.models import Task, TaskChange
from tests.factories import definition, inline_runner, task_form

pytestmark = pytest.mark.django_db

API = "/api/scheduler/"
SECRET_HANDLER = {
    "kind": "api",
    "url": "https://example.com/hook",
    "method": "POST",
    "headers": {"Authorization": "Bearer s3cret-token"},
}


def history(task_id: str) -> list[tuple[str, str, str, list[str]]]:
    """(action, via, by, changed fields) of each change, oldest first."""
    return [
        (change.action, change.via, change.by, sorted(change.changes))
        for change in TaskChange.objects.filter(task_id=task_id).order_by("id")
    ]


def user(name: str, *codenames: str) -> User:
    created = User.objects.create_user(name, password="pw", is_staff=True)
    created.user_permissions.set(
        Permission.objects.filter(content_type__app_label="scheduler_app", codename__in=codenames)
    )
    return User.objects.get(pk=created.pk)


def api_as(*codenames: str, name: str = "ci-bot") -> APIClient:
    client = APIClient()
    client.force_login(user(name, *codenames))
    return client


# -- the Python API ------------------------------------------------------------


def test_register_records_every_field_as_new_with_the_handler_masked():
    scheduler.register(definition(handler=SECRET_HANDLER, retry={"max_attempts": 3, "backoff": [5]}))
    (change,) = TaskChange.objects.all()
    assert (change.task_id, change.action, change.via, change.by, change.revision) == (
        "report",
        "create",
        "python",
        "",
        1,
    )
    assert change.changes["cron"] == [None, "* * * * *"]
    assert change.changes["retry_max_attempts"] == [None, 3]
    assert change.changes["handler"][1]["headers"] == {"Authorization": "***"}
    assert "s3cret" not in str(change.changes)


def test_an_update_records_only_the_fields_it_changed_old_and_new_and_who():
    scheduler.register(definition(cron="0 2 * * *"))
    with scheduler.acting_as("deploy-bot"):
        scheduler.update_task("report", cron="30 4 * * *", name="Report")  # the name is unchanged
    scheduler.update_task("report", name="Report")  # no change, no record
    change = TaskChange.objects.latest("id")
    assert (change.action, change.via, change.by, change.revision) == ("update", "python", "deploy-bot", 2)
    assert change.changes == {"cron": ["0 2 * * *", "30 4 * * *"]}
    assert len(history("report")) == 2


def test_enabling_and_disabling_are_named_as_such():
    scheduler.register(definition())
    scheduler.update_task("report", enabled=False)
    scheduler.replace_task("report", {**definition(), "enabled": True})
    assert [entry[:1] + entry[3:] for entry in history("report")[1:]] == [
        ("disable", ["enabled"]),
        ("enable", ["enabled"]),
    ]


def test_a_changed_secret_is_recorded_without_showing_it():
    scheduler.register(definition(handler=SECRET_HANDLER))
    headers = {"Authorization": "Bearer rotated-token"}
    scheduler.update_task("report", handler={**SECRET_HANDLER, "headers": headers})
    change = TaskChange.objects.latest("id")
    assert list(change.changes) == ["handler"]
    old, new = change.changes["handler"]
    assert old == new and new["headers"] == {"Authorization": "***"}
    assert "rotated" not in str(change.changes) and "s3cret" not in str(change.changes)


def test_a_refused_change_records_nothing():
    scheduler.register(definition())
    with pytest.raises(InvalidDefinition):
        scheduler.update_task("report", cron="61 * * * *")
    assert history("report") == [("create", "python", "", history("report")[0][3])]


def test_the_history_outlives_the_task_and_pages_newest_first():
    scheduler.register(definition())
    for minute in range(5):
        scheduler.update_task("report", cron=f"{minute} * * * *")
    with scheduler.acting_as("ops"):
        scheduler.unregister("report")
    assert not Task.objects.exists()
    deleted, *older = scheduler.task_history("report")
    assert (deleted.action, deleted.by, deleted.revision) == ("delete", "ops", 6)
    assert deleted.changes["cron"] == ["4 * * * *", None]
    assert [change.revision for change in older] == [6, 5, 4, 3, 2, 1]
    assert [c.action for c in scheduler.task_history("report", limit=2, offset=5)] == ["update", "create"]
    with pytest.raises(TaskNotFound):
        scheduler.task_history("never-existed")
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.task_history("report", limit=0)
    assert refused.value.errors == {"limit": ["Must be an integer from 1 to 100."]}


def test_a_sync_from_code_records_creations_changes_and_removals_as_the_code():
    declared = {"id": "nightly", "cron": "0 2 * * *"}
    with override_settings(SCHEDULER_APP={"TASKS": [declared]}):
        scheduler.refresh_tasks()
        scheduler.refresh_tasks()  # nothing changed: nothing recorded
    with override_settings(SCHEDULER_APP={"TASKS": [{**declared, "cron": "0 3 * * *"}]}):
        scheduler.refresh_tasks()
    with override_settings(SCHEDULER_APP={"TASKS": []}):
        scheduler.refresh_tasks()
    assert [entry[:2] for entry in history("nightly")] == [
        ("create", "code"),
        ("update", "code"),
        ("disable", "code"),
    ]
    changes = [change.changes for change in TaskChange.objects.filter(task_id="nightly").order_by("id")]
    assert changes[1] == {"cron": ["0 2 * * *", "0 3 * * *"]}
    assert changes[2]["enabled"] == [True, False] and changes[2]["declared_in"] == ["settings", ""]


def test_delete_after_run_is_recorded_as_the_runner(clock):
    scheduler.register(definition(delete_after_run=True))
    runner = inline_runner(clock, node_id="node-7")
    clock.advance(60)
    runner.tick()
    assert not Task.objects.exists()
    assert history("report")[-1][:3] == ("delete", "runner", "node-7")


# -- REST --------------------------------------------------------------------


def test_api_changes_are_recorded_as_the_client_and_listed_by_history():
    client = api_as("view_task", "add_task", "change_task", "delete_task")
    assert client.post(API + "tasks/", definition(), format="json").status_code == 201
    assert client.patch(API + "tasks/report/", {"enabled": False}, format="json").status_code == 200
    assert client.delete(API + "tasks/report/").status_code == 204
    assert [entry[:3] for entry in history("report")] == [
        ("create", "api", "ci-bot"),
        ("disable", "api", "ci-bot"),
        ("delete", "api", "ci-bot"),
    ]
    response = client.get(API + "tasks/report/history/", {"limit": 2})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 3 and body["previous"] is None and "offset=2" in body["next"]
    assert [row["action"] for row in body["results"]] == ["delete", "disable"]
    assert body["results"][1]["changes"] == {"enabled": [True, False]}
    assert set(body["results"][0]) == {"id", "task_id", "at", "action", "via", "by", "revision", "changes"}


def test_api_history_needs_view_task_and_answers_404_for_an_unknown_id():
    scheduler.register(definition())
    assert api_as("view_execution").get(API + "tasks/report/history/").status_code == 403
    response = api_as("view_task", name="viewer").get(API + "tasks/nope/history/")
    assert response.status_code == 404 and response.json()["code"] == "scheduler:020"


def test_api_history_masks_the_handler():
    scheduler.register(definition(handler=SECRET_HANDLER))
    body = api_as("view_task").get(API + "tasks/report/history/").json()
    assert body["results"][0]["changes"]["handler"][1]["headers"] == {"Authorization": "***"}
    assert b"s3cret" not in api_as("view_task", name="other").get(API + "tasks/report/history/").content


# -- the admin ---------------------------------------------------------------


def test_admin_edits_actions_and_deletes_are_recorded_as_the_admin_user(admin_client: Client):
    task = scheduler.register(definition(cron="0 2 * * *"))
    change_url = reverse("admin:scheduler_app_task_change", args=["report"])
    assert admin_client.post(change_url, task_form(task, cron="30 4 * * *")).status_code == 302
    changelist = reverse("admin:scheduler_app_task_changelist")
    admin_client.post(
        changelist,
        {"action": "pause", "post": "yes", "reason": "", "_selected_action": ["report"], "index": "0"},
    )
    delete_url = reverse("admin:scheduler_app_task_delete", args=["report"])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 302
    assert [entry[:3] for entry in history("report")] == [
        ("create", "python", ""),
        ("update", "admin", "admin"),
        ("disable", "admin", "admin"),
        ("delete", "admin", "admin"),
    ]


def test_the_task_page_and_its_history_show_the_changes(admin_client: Client):
    scheduler.register(definition(cron="0 2 * * *", handler=SECRET_HANDLER))
    with scheduler.acting_as("deploy-bot"):
        scheduler.update_task("report", cron="30 4 * * *")
    page = admin_client.get(reverse("admin:scheduler_app_task_change", args=["report"])).content.decode()
    assert "deploy-bot" in page and "&quot;30 4 * * *&quot;" in page
    response = admin_client.get(reverse("admin:scheduler_app_task_history", args=["report"]))
    assert response.status_code == 200
    text = response.content.decode()
    assert text.count("<tr>") >= 1 + len(TaskChange.objects.first().changes) and "deploy-bot" in text
    assert "s3cret" not in text and "s3cret" not in page


def test_the_audit_list_keeps_deleted_tasks_and_needs_its_own_view_permission(admin_client: Client):
    scheduler.register(definition())
    scheduler.unregister("report")
    url = reverse("admin:scheduler_app_taskchange_changelist")
    page = admin_client.get(url, {"task_id": "report"}).content.decode()
    assert "report <small>(deleted)</small>" in page and "delete" in page
    detail = admin_client.get(
        reverse("admin:scheduler_app_taskchange_change", args=[TaskChange.objects.first().pk])
    )
    assert detail.status_code == 200 and "&quot;* * * * *&quot;" in detail.content.decode()
    viewer = Client()
    viewer.force_login(user("viewer", "view_task"))
    assert viewer.get(url).status_code == 403


def test_a_declared_task_refused_by_unregister_records_nothing():
    declared = {"id": "nightly", "cron": "0 2 * * *"}
    with override_settings(SCHEDULER_APP={"TASKS": [declared]}):
        scheduler.refresh_tasks()
        with pytest.raises(TaskDeclared):
            scheduler.unregister("nightly")
    assert [entry[0] for entry in history("nightly")] == ["create"]
