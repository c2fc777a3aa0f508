"""The python handler kind: functions registered by name (@job, FUNCTIONS), refused when unknown, run per attempt."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from scheduler_app import job, jobs, scheduler
from scheduler_app.checks import check_settings
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.models import Execution, ExecutionLog, Status, Task
from tests.factories import definition, inline_runner

pytestmark = pytest.mark.django_db


def python(function: str, **options: object) -> dict[str, object]:
    return {"kind": "python", "function": function, **options}


def run_once(clock, task_id: str = "report", **trigger: object) -> Execution:
    execution = scheduler.trigger(task_id, **trigger)
    inline_runner(clock).tick()
    return Execution.objects.get(sequence=execution.sequence)


def test_the_jobs_modules_of_installed_apps_are_discovered_at_start_up():
    assert {"echo", "explode", "skip", "not-json"} <= set(jobs.names())
    assert jobs.get("echo") is not None and jobs.get("echo").__module__ == "tests.jobapp.jobs"


def test_a_function_receives_the_event_and_its_return_value_is_the_result(clock):
    scheduler.register(definition(cron="0 0 1 1 *", handler=python("echo"), params={"day": "mon"}))
    execution = run_once(clock, params={"extra": 1})
    assert execution.status == Status.SUCCESS
    assert execution.result == {
        "task": "report",
        "params": {"day": "mon", "extra": 1},
        "occurrence_id": str(execution.occurrence_id),
        "attempt": 1,
        "trigger": "manual",
        "has_token": True,
        "cancelled": False,
    }
    assert ExecutionLog.objects.get(occurrence_id=execution.occurrence_id).status == "success"


def test_an_exception_fails_the_attempt_and_the_retry_policy_applies(clock):
    scheduler.register(
        definition(cron="0 0 1 1 *", handler=python("explode"), retry={"max_attempts": 2, "backoff": [5]})
    )
    execution = run_once(clock)
    assert (execution.status, execution.attempt) == (Status.PENDING, 1)
    assert execution.error == {"code": "scheduler:023", "message": "RuntimeError: exploded on purpose"}
    clock.advance(5)
    inline_runner(clock, node_id="node-b").tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.FAILED, 2)


def test_task_skipped_ends_the_attempt_interrupted(clock):
    scheduler.register(definition(cron="0 0 1 1 *", handler=python("skip")))
    execution = run_once(clock)
    assert execution.status == Status.INTERRUPTED
    assert execution.error == {"reason": "skipped", "message": "nothing to do today"}


def test_a_result_that_is_not_json_fails_the_attempt(clock):
    scheduler.register(definition(cron="0 0 1 1 *", handler=python("not-json")))
    execution = run_once(clock)
    assert execution.status == Status.FAILED
    assert execution.error == {"code": "scheduler:023", "message": "The result is not JSON."}


@pytest.mark.parametrize(
    ("handler", "field", "says"),
    [
        (python("nobody-registered-this"), "handler.function", "No function is registered under"),
        (python(""), "handler.function", "Must be the name of a registered function."),
        ({"kind": "python", "function": "tests.hooks.on_task_execute"}, "handler.function", "registered"),
        (python("echo", timeout=0), "handler.timeout", "Must be a number of seconds"),
        (python("echo", path="os.system"), "handler", "Unknown keys: path."),
    ],
)
def test_a_function_nobody_registered_is_refused_with_a_field_error(handler, field, says):
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.register(definition(handler=handler))
    assert refused.value.code == "scheduler:012"
    assert any(says in message for message in refused.value.errors[field])
    assert not Task.objects.exists()


def test_an_update_to_an_unregistered_function_is_refused_and_changes_nothing():
    scheduler.register(definition(handler=python("echo")))
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.update_task("report", handler=python("os.system"))
    assert set(refused.value.errors) == {"handler.function"}
    assert Task.objects.get().handler == python("echo")


def test_the_rest_api_refuses_an_unregistered_function_with_the_same_field_error(admin_client):
    response = admin_client.post(
        reverse("scheduler_api:task-list"),
        {"id": "report", "name": "Report", "cron": "* * * * *", "handler": python("subprocess.run")},
        content_type="application/json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "scheduler:012" and "handler.function" in body["fields"]
    accepted = admin_client.post(
        reverse("scheduler_api:task-list"),
        {"id": "report", "name": "Report", "cron": "* * * * *", "handler": python("echo", timeout=60)},
        content_type="application/json",
    )
    assert accepted.status_code == 201
    assert Task.objects.get().handler == python("echo", timeout=60)


def admin_form(**values: object) -> dict[str, object]:
    form = {
        "id": "report",
        "name": "Report",
        "description": "",
        "cron": "* * * * *",
        "timezone": "UTC",
        "enabled": "on",
        "retry_max_attempts": "1",
        "retry_backoff": "[]",
        "overlap": "skip",
        "max_concurrency": "1",
        "params": "{}",
        "handler": "",
        "function": "",
    }
    form.update(values)
    return form


def test_the_admin_offers_the_registered_functions_as_a_choice(admin_client):
    page = admin_client.get(reverse("admin:scheduler_app_task_add"))
    choices = [value for value, _ in page.context["adminform"].form.fields["function"].choices]
    assert choices == ["", *jobs.names()]
    response = admin_client.post(reverse("admin:scheduler_app_task_add"), admin_form(function="echo"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Task.objects.get().handler == python("echo")


def test_the_admin_refuses_a_function_typed_into_the_handler_json(admin_client):
    response = admin_client.post(
        reverse("admin:scheduler_app_task_add"),
        admin_form(handler='{"kind": "python", "function": "os.system"}'),
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "No function is registered under" in errors["function"][0]
    assert not Task.objects.exists()


def test_the_admin_keeps_a_python_timeout_when_the_function_changes(admin_client):
    scheduler.register(definition(handler=python("echo", timeout=90)))
    change = reverse("admin:scheduler_app_task_change", args=["report"])
    response = admin_client.post(
        change, admin_form(handler='{"kind": "python", "function": "echo", "timeout": 90}', function="skip")
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Task.objects.get().handler == python("skip", timeout=90)


def test_the_admin_refuses_a_function_beside_a_handler_of_another_kind(admin_client):
    response = admin_client.post(
        reverse("admin:scheduler_app_task_add"),
        admin_form(handler='{"kind": "fake"}', function="echo"),
    )
    assert response.status_code == 200
    assert "not both" in response.context["adminform"].form.errors["function"][0]


def test_functions_can_be_named_in_the_functions_setting(clock, settings):
    settings.SCHEDULER_APP = {
        **settings.SCHEDULER_APP,
        "FUNCTIONS": {"from-settings": "tests.jobapp.jobs.echo"},
    }
    assert "from-settings" in jobs.names()
    assert check_settings() == []
    scheduler.register(definition(cron="0 0 1 1 *", handler=python("from-settings")))
    assert run_once(clock).result["task"] == "report"


def test_a_function_gone_from_this_node_fails_the_attempt_with_035(clock, settings):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "FUNCTIONS": {"temporary": "tests.jobapp.jobs.echo"}}
    scheduler.register(definition(cron="0 0 1 1 *", handler=python("temporary")))
    settings.SCHEDULER_APP = {
        key: value for key, value in settings.SCHEDULER_APP.items() if key != "FUNCTIONS"
    }
    execution = run_once(clock)
    assert execution.status == Status.FAILED
    assert execution.error["code"] == "scheduler:035"
    assert "'temporary'" in execution.error["message"]


def test_two_functions_under_one_name_are_a_system_check_error():
    @job("clash-test")
    def first(event):
        return 1

    @job("clash-test")
    def second(event):
        return 2

    try:
        [message] = [m for m in check_settings() if m.id == "scheduler_app.E038"]
        assert "'clash-test'" in message.msg and "first" in message.msg and "second" in message.msg
        # The first registration stays: which one runs does not depend on import order later on.
        assert jobs.get("clash-test") is first
    finally:
        jobs.forget("clash-test")
    assert check_settings() == []


def test_registering_the_same_function_twice_is_no_clash():
    def once(event):
        return 1

    try:
        job("same-twice")(once)
        job("same-twice")(once)
        assert not [m for m in check_settings() if m.id == "scheduler_app.E038"]
    finally:
        jobs.forget("same-twice")


def test_job_needs_a_name():
    with pytest.raises(TypeError, match="takes the function's name"):
        job("")
    with pytest.raises(TypeError, match="takes the function's name"):
        job(lambda event: None)  # type: ignore[arg-type]


def test_a_scheduled_minute_runs_the_function(clock):
    scheduler.register(definition(handler=python("echo")))
    runner = inline_runner(clock)
    clock.advance(timedelta(seconds=60).total_seconds())
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.result["trigger"]) == (Status.SUCCESS, "scheduled")
