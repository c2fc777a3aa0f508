"""Pausing a task with a reason, and resuming it: paused is not enabled. Who, why, since and until
when are stored and cleared together; a runner ends a pause at its ``until``; the paused minutes
neither run nor count as missed. The Python API, the runner, the REST API and the admin."""

from __future__ import annotations

import threading
from datetime import timedelta, timezone
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection, connections, transaction
from django.test import Client
from rest_framework.test import APIClient

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition, InvalidState, TaskNotFound
from scheduler_app.models import NO_LONGER_DECLARED, Execution, Status, Task, TaskChange
from scheduler_app.runner import scheduling
from tests import hooks
from tests.factories import T0, definition, inline_runner

pytestmark = pytest.mark.django_db

PAUSE_FIELDS = ("enabled", "disabled_reason", "disabled_by", "disabled_at", "disabled_until")


def pause_state(task_id: str = "report") -> tuple:
    return Task.objects.values_list(*PAUSE_FIELDS).get(id=task_id)


def changes(task_id: str = "report") -> list[tuple[str, str, str, dict]]:
    """(action, via, by, changes) of each change after the task's creation, oldest first."""
    rows = TaskChange.objects.filter(task_id=task_id).exclude(action="create").order_by("id")
    return [(row.action, row.via, row.by, row.changes) for row in rows]


# -- the Python API ------------------------------------------------------------------------


def test_pause_disables_the_task_and_records_why_who_since_and_until(clock):
    scheduler.register(definition())
    until = T0 + timedelta(hours=2)
    with scheduler.acting_as("ops-bot"):
        task = scheduler.pause("report", reason="database migration", until=until)
    assert pause_state() == (False, "database migration", "ops-bot", T0, until)
    assert (task.enabled, task.disabled_until, task.revision) == (False, until, 2)
    assert changes() == [
        (
            "disable",
            "python",
            "ops-bot",
            {
                "enabled": [True, False],
                "disabled_reason": ["", "database migration"],
                "disabled_until": [None, "2026-03-02T11:00:00Z"],
            },
        )
    ]


def test_resume_enables_the_task_clears_the_pause_and_records_it(clock):
    scheduler.register(definition())
    scheduler.pause("report", reason="incident", until=T0 + timedelta(hours=2))
    clock.advance(600)
    with scheduler.acting_as("oncall"):
        task = scheduler.resume("report")
    assert pause_state() == (True, "", "", None, None)
    assert task.next_run_at == T0 + timedelta(minutes=11)
    assert changes()[-1] == (
        "enable",
        "python",
        "oncall",
        {
            "enabled": [False, True],
            "disabled_reason": ["incident", ""],
            "disabled_until": ["2026-03-02T11:00:00Z", None],
        },
    )


def test_resume_of_an_enabled_task_changes_nothing_and_records_nothing(clock):
    scheduler.register(definition())
    task = scheduler.resume("report")
    assert (task.enabled, task.revision) == (True, 1)
    assert changes() == []


def test_pausing_a_paused_task_changes_its_reason_and_until_and_keeps_who_and_since(clock):
    scheduler.register(definition())
    with scheduler.acting_as("first"):
        scheduler.pause("report", reason="incident")
    clock.advance(60)
    with scheduler.acting_as("second"):
        scheduler.pause("report", reason="incident, still", until=T0 + timedelta(days=1))
    assert pause_state() == (False, "incident, still", "first", T0, T0 + timedelta(days=1))
    assert changes()[-1] == (
        "update",
        "python",
        "second",
        {
            "disabled_reason": ["incident", "incident, still"],
            "disabled_until": [None, "2026-03-03T09:00:00Z"],
        },
    )


def test_pause_without_a_reason_or_an_end_stays_until_resumed(clock):
    scheduler.register(definition())
    scheduler.pause("report")
    assert pause_state() == (False, "", "", T0, None)
    clock.advance(86400 * 30)
    inline_runner(clock).tick()
    assert pause_state()[0] is False


def test_update_task_enabled_false_and_true_set_and_clear_the_pause_fields(clock):
    scheduler.register(definition())
    with scheduler.acting_as("deploy"):
        scheduler.update_task("report", enabled=False)
    assert pause_state() == (False, "", "deploy", T0, None)
    Task.objects.update(disabled_reason="set by hand", disabled_until=T0 + timedelta(hours=1))
    scheduler.update_task("report", enabled=True)
    assert pause_state() == (True, "", "", None, None)


def test_other_changes_of_a_paused_task_keep_its_pause(clock):
    scheduler.register(definition())
    scheduler.pause("report", reason="incident", until=T0 + timedelta(hours=1))
    scheduler.update_task("report", name="Renamed")
    assert pause_state() == (False, "incident", "", T0, T0 + timedelta(hours=1))
    # enabled=False on a paused task changes nothing, as the task form saved while it is paused
    # sends: the pause keeps its reason and its end (pause() again changes them).
    scheduler.update_task("report", enabled=False)
    assert pause_state() == (False, "incident", "", T0, T0 + timedelta(hours=1))


@pytest.mark.parametrize(
    ("arguments", "field", "message"),
    [
        ({"reason": "x" * 201}, "reason", "Must be a string of at most 200 characters."),
        ({"reason": 5}, "reason", "Must be a string of at most 200 characters."),
        ({"reason": "nul \x00"}, "reason", None),
        (
            {"until": T0.replace(tzinfo=None) + timedelta(hours=1)},
            "until",
            "Must be a timezone-aware datetime.",
        ),
        ({"until": "2026-03-02T10:00:00Z"}, "until", "Must be a timezone-aware datetime."),
        ({"until": T0}, "until", "Must be in the future."),
        ({"until": T0 - timedelta(seconds=1)}, "until", "Must be in the future."),
        ({"until": T0 + timedelta(days=366, seconds=1)}, "until", "Must be at most 366 days from now."),
    ],
)
def test_an_invalid_pause_is_refused_with_the_field_named_and_changes_nothing(
    clock, arguments, field, message
):
    scheduler.register(definition())
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.pause("report", **arguments)
    assert refused.value.code == "scheduler:012"
    assert list(refused.value.errors) == [field]
    if message is not None:
        assert refused.value.errors[field] == [message]
    assert pause_state() == (True, "", "", None, None)
    assert changes() == []


def test_a_pause_at_most_366_days_ahead_in_any_offset_is_accepted(clock):
    scheduler.register(definition())
    until = (T0 + timedelta(days=366)).astimezone(timezone(timedelta(hours=-5)))
    assert scheduler.pause("report", until=until).disabled_until == until


def test_pause_and_resume_of_an_unknown_task_raise_task_not_found():
    for call in (lambda: scheduler.pause("nope", reason="x"), lambda: scheduler.resume("nope")):
        with pytest.raises(TaskNotFound):
            call()
    with pytest.raises(TaskNotFound):
        scheduler.pause("bad\x00id")


def test_a_task_disabled_because_its_declaration_is_gone_is_not_paused_over(clock):
    """Its reason says it is no longer declared; a pause would make it look registered by hand."""
    scheduler.register(definition())
    Task.objects.update(enabled=False, disabled_reason=NO_LONGER_DECLARED)
    with pytest.raises(InvalidState):
        scheduler.pause("report", reason="mine now")
    assert pause_state()[:2] == (False, NO_LONGER_DECLARED)
    assert scheduler.resume("report").enabled is True


# -- the runner ------------------------------------------------------------------------------


def test_a_runner_resumes_a_task_at_its_until_and_the_paused_minutes_neither_run_nor_misfire(clock):
    scheduler.register(definition())
    runner = inline_runner(clock)
    scheduler.pause("report", reason="window", until=T0 + timedelta(minutes=10, seconds=30))
    clock.advance(10 * 60)
    runner.tick()
    assert pause_state()[0] is False
    clock.advance(30)
    runner.tick()
    task = Task.objects.get()
    assert (task.enabled, task.disabled_reason, task.disabled_until) == (True, "", None)
    assert task.next_run_at == T0 + timedelta(minutes=11)
    assert changes()[-1] == (
        "enable",
        "runner",
        "node-a",
        {
            "enabled": [False, True],
            "disabled_reason": ["window", ""],
            "disabled_until": ["2026-03-02T09:10:30Z", None],
        },
    )
    assert not Execution.objects.exists()  # no occurrence, no misfire record for minutes 1 to 10
    clock.advance(30)
    runner.tick()
    runner.tick()
    (execution,) = Execution.objects.all()
    assert (execution.scheduled_for, execution.status) == (T0 + timedelta(minutes=11), Status.SUCCESS)


def test_a_fire_time_at_the_end_of_a_pause_runs_and_a_late_runner_follows_the_misfire_grace(clock):
    scheduler.register(definition(cron="*/5 * * * *"))
    scheduler.register(definition("late", cron="* * * * *"))
    scheduler.pause("report", until=T0 + timedelta(minutes=10))
    scheduler.pause("late", until=T0 + timedelta(minutes=5))
    runner = inline_runner(clock)
    # The runner reaches both ends late: 09:10 is within the grace, 09:05 to 09:08 are not.
    clock.set(T0 + timedelta(minutes=10, seconds=0.5))
    runner.tick()
    runner.tick()
    runner.tick()
    ran = Execution.objects.exclude(status=Status.INTERRUPTED)
    assert sorted(ran.values_list("task_id", "scheduled_for")) == [
        ("late", T0 + timedelta(minutes=10)),
        ("report", T0 + timedelta(minutes=10)),
    ]
    missed = Execution.objects.get(status=Status.INTERRUPTED)
    assert (missed.task_id, missed.error["reason"]) == ("late", "misfire")
    assert missed.missed_fire_times["first"] == "2026-03-02T09:05:00Z"


def test_the_runner_wakes_for_the_end_of_a_pause(clock):
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.pause("report", until=T0 + timedelta(seconds=45))
    runner = inline_runner(clock)
    runner.tick()
    assert runner._next_event == pytest.approx(runner._local(T0 + timedelta(seconds=45)), abs=0.01)


def test_two_runners_resume_a_task_once(clock):
    scheduler.register(definition())
    scheduler.pause("report", until=T0 + timedelta(minutes=5))
    first, second = inline_runner(clock, node_id="node-a"), inline_runner(clock, node_id="node-b")
    clock.advance(5 * 60)
    first.tick()
    second.tick()
    assert [(action, by) for action, _, by, _ in changes()] == [("disable", ""), ("enable", "node-a")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no row locks: it serialises writers")
def test_a_task_another_runner_is_resuming_is_skipped_not_waited_for(clock):
    scheduler.register(definition())
    scheduler.pause("report", until=T0 + timedelta(minutes=5))
    clock.advance(5 * 60)
    resumed: list[bool] = []

    def other_runner() -> None:
        try:
            resumed.append(pauses_resume(clock.now(), "node-b"))
        finally:
            connections.close_all()

    with transaction.atomic():
        Task.objects.select_for_update().get(id="report")  # as another runner's resume holds it
        thread = threading.Thread(target=other_runner)
        thread.start()
        thread.join(30)
    assert resumed == [False]
    assert pause_state()[0] is False
    inline_runner(clock, node_id="node-a").tick()
    assert [(action, by) for action, _, by, _ in changes()] == [("disable", ""), ("enable", "node-a")]


def pauses_resume(now, node):
    from scheduler_app.runner import pauses

    return pauses.resume_ended(now, node)


def test_an_idle_tick_with_paused_tasks_is_one_statement(clock, django_assert_num_queries):
    scheduler.register(definition())
    scheduler.pause("report", until=T0 + timedelta(days=1))
    scheduler.register(definition("forever"))
    scheduler.pause("forever")
    runner = inline_runner(clock)
    runner.tick()
    clock.advance(3600)
    with django_assert_num_queries(1):
        runner.tick()


def test_a_pending_scheduled_occurrence_of_a_paused_task_is_interrupted_and_a_manual_one_runs(clock):
    scheduler.register(definition())
    runner = inline_runner(clock)
    clock.advance(60)
    scheduling.schedule_due(clock.now(), "node-a")
    scheduler.pause("report", reason="incident")
    manual = scheduler.trigger("report", source="ops")
    runner.tick()
    scheduled = Execution.objects.get(trigger_type="scheduled")
    assert (scheduled.status, scheduled.error["reason"]) == (Status.INTERRUPTED, "task disabled")
    manual.refresh_from_db()
    assert manual.status == Status.SUCCESS
    assert [call.context.trigger_type for call in hooks.CALLS] == ["manual"]


# -- the REST API ----------------------------------------------------------------------------

API = "/api/scheduler/tasks/"


def api_as(name: str, *codenames: str) -> APIClient:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="scheduler_app", codename__in=codenames)
    )
    client = APIClient()
    client.force_login(User.objects.get(pk=user.pk))
    return client


def test_rest_pause_answers_the_task_paused_with_who_why_since_and_until(clock):
    scheduler.register(definition())
    api = api_as("ops", "change_task")
    response = api.post(
        API + "report/pause/", {"reason": "incident 42", "until": "2026-03-02T12:30:00+02:00"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert {key: body[key] for key in ("enabled", *PAUSE_FIELDS[1:])} == {
        "enabled": False,
        "disabled_reason": "incident 42",
        "disabled_by": "ops",
        "disabled_at": "2026-03-02T09:00:00Z",
        "disabled_until": "2026-03-02T10:30:00Z",
    }
    assert pause_state() == (False, "incident 42", "ops", T0, T0 + timedelta(hours=1, minutes=30))
    assert [(action, via, by) for action, via, by, _ in changes()] == [("disable", "api", "ops")]


def test_rest_pause_without_a_body_pauses_until_resumed_and_resume_clears_it(clock):
    scheduler.register(definition())
    api = api_as("ops", "change_task")
    assert api.post(API + "report/pause/", format="json").json()["enabled"] is False
    assert pause_state() == (False, "", "ops", T0, None)
    body = api.post(API + "report/resume/", format="json").json()
    assert (body["enabled"], body["disabled_by"], body["disabled_at"], body["disabled_until"]) == (
        True,
        "",
        None,
        None,
    )
    assert [(action, via, by) for action, via, by, _ in changes()] == [
        ("disable", "api", "ops"),
        ("enable", "api", "ops"),
    ]


def test_a_task_as_answered_shows_its_pause_fields_read_only(clock):
    scheduler.register(definition())
    api = api_as("ops", "view_task", "change_task")
    body = api.get(API + "report/").json()
    assert {key: body[key] for key in PAUSE_FIELDS} == dict(
        zip(PAUSE_FIELDS, (True, "", "", None, None), strict=True)
    )
    sent = {"disabled_reason": "x", "disabled_by": "y", "disabled_until": "2026-03-03T00:00:00Z"}
    assert api.patch(API + "report/", {**sent, "name": "Renamed"}, format="json").status_code == 200
    assert pause_state() == (True, "", "", None, None)
    assert api.patch(API + "report/", {"enabled": False}, format="json").json()["disabled_by"] == "ops"


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"reason": "x" * 201}, {"reason"}),
        ({"reason": 7}, {"reason"}),
        ({"until": "2026-03-02T08:00:00Z"}, {"until"}),
        ({"until": "2027-03-04T09:00:00Z"}, {"until"}),
        ({"until": "tomorrow"}, {"until"}),
        ({"because": "x"}, {""}),
    ],
)
def test_rest_pause_refuses_bad_input_with_400_naming_the_field_and_changes_nothing(clock, body, fields):
    scheduler.register(definition())
    response = api_as("ops", "change_task").post(API + "report/pause/", body, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()["fields"]) == fields
    assert pause_state() == (True, "", "", None, None)


def test_rest_pause_and_resume_of_an_unknown_task_answer_404():
    api = api_as("ops", "change_task")
    for action in ("pause", "resume"):
        response = api.post(f"{API}nope/{action}/", {}, format="json")
        assert (response.status_code, response.json()["code"]) == (404, "scheduler:020")


def test_rest_pause_and_resume_need_the_permission_to_change_tasks(clock):
    scheduler.register(definition())
    viewer = api_as("viewer", "view_task", "add_execution")
    for action in ("pause", "resume"):
        response = viewer.post(f"{API}report/{action}/", {}, format="json")
        assert response.status_code == 403
        assert response.json()["message"] == "Missing permission: scheduler_app.change_task."
    assert pause_state()[0] is True


def test_rest_pause_of_a_task_whose_declaration_is_gone_answers_409(clock):
    scheduler.register(definition())
    Task.objects.update(enabled=False, disabled_reason=NO_LONGER_DECLARED)
    response = api_as("ops", "change_task").post(API + "report/pause/", {"reason": "x"}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "scheduler:042")


# -- the admin -------------------------------------------------------------------------------

TASKS = "/admin/scheduler_app/task/"


def chosen(action: str, *task_ids: str, **values: str) -> dict[str, Any]:
    return {"action": action, "_selected_action": list(task_ids), "index": "0", **values}


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_the_admin_pause_asks_for_a_reason_and_an_end_then_pauses_each_task(clock, admin_client):
    scheduler.register(definition("report"))
    scheduler.register(definition("sweep"))
    asked = admin_client.post(TASKS, chosen("pause", "report", "sweep"))
    assert asked.status_code == 200
    assert b'name="reason"' in asked.content and b'name="until"' in asked.content
    assert Task.objects.filter(enabled=True).count() == 2
    done = admin_client.post(
        TASKS,
        chosen(
            "pause", "report", "sweep", post="yes", reason="upstream down", until="2026-03-02T12:00:00+02:00"
        ),
        follow=True,
    )
    assert messages_of(done) == ["Paused 2 tasks: report, sweep."]
    assert pause_state("sweep") == (False, "upstream down", "admin", T0, T0 + timedelta(hours=1))
    assert [(action, via, by) for action, via, by, _ in changes("sweep")] == [("disable", "admin", "admin")]


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"reason": "x" * 201, "until": ""}, "reason"),
        ({"reason": "", "until": "2026-03-02T08:00:00Z"}, "until"),
        ({"reason": "", "until": "2027-06-01T00:00:00Z"}, "until"),
        ({"reason": "", "until": "next tuesday"}, "until"),
    ],
)
def test_the_admin_pause_shows_what_is_wrong_on_its_form_and_changes_nothing(
    clock, admin_client, values, field
):
    scheduler.register(definition("report"))
    response = admin_client.post(TASKS, chosen("pause", "report", post="yes", **values))
    assert response.status_code == 200
    assert response.context["form"].errors.keys() == {field}
    assert pause_state() == (True, "", "", None, None)


def test_the_admin_resume_enables_paused_tasks_and_clears_their_pause(clock, admin_client):
    scheduler.register(definition("report"))
    scheduler.pause("report", reason="incident", until=T0 + timedelta(hours=1))
    done = admin_client.post(TASKS, chosen("resume", "report"), follow=True)
    assert messages_of(done) == ["Resumed 1 task: report."]
    assert pause_state() == (True, "", "", None, None)
    assert changes()[-1][:3] == ("enable", "admin", "admin")


def test_the_task_list_says_paused_with_the_reason_on_hover_and_the_page_shows_the_pause(clock, admin_client):
    scheduler.register(definition("report"))
    with scheduler.acting_as("oncall"):
        scheduler.pause("report", reason="incident 42", until=T0 + timedelta(hours=2))
    listed = admin_client.get(TASKS)
    assert [task.health for task in listed.context["cl"].result_list] == ["paused"]
    title = "incident 42, by oncall, since 2026-03-02 09:00:00 UTC, until 2026-03-02 11:00:00 UTC"
    assert f'title="{title}"' in listed.content.decode()
    assert [t.id for t in admin_client.get(TASKS, {"health": "paused"}).context["cl"].result_list] == [
        "report"
    ]
    page = admin_client.get(f"{TASKS}report/change/").content.decode().lower()
    for shown in ("paused because", "incident 42", "paused by", "oncall", "paused since", "resumes at"):
        assert shown in page, shown
    assert "2026-03-02 11:00:00 utc" in page


def test_the_admin_pause_and_resume_need_the_change_permission(clock):
    from tests.test_admin import staff

    scheduler.register(definition("report"))
    viewer = Client()
    viewer.force_login(staff("vera", "view_task", "add_execution"))
    page = viewer.get(TASKS).content.decode()
    assert 'value="pause"' not in page and 'value="resume"' not in page
    viewer.post(TASKS, chosen("pause", "report", post="yes", reason="no"))
    assert pause_state()[0] is True
    scheduler.pause("report")
    viewer.post(TASKS, chosen("resume", "report"))
    assert pause_state()[0] is False
    act = f"{TASKS}report/act/"
    assert viewer.post(act, {"action": "resume"}).status_code == 403
