"""Registering, updating and removing task definitions through the Python API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from scheduler_app import scheduler
from scheduler_app.definitions import MAX_JSON_BYTES, MAX_JSON_DEPTH
from scheduler_app.exceptions import InvalidCron, InvalidDefinition, TaskAlreadyExists, TaskNotFound
from scheduler_app.models import Task
from tests.factories import definition, nested

pytestmark = pytest.mark.django_db


def test_register_stores_every_field_and_computes_next_run():
    task = scheduler.register(
        definition(
            "nightly-report",
            cron="0 2 * * *",
            timezone="Europe/Berlin",
            retry={"max_attempts": 3, "backoff": [10, 60]},
            idempotent=True,
            params={"channel": "ops"},
            max_concurrency=2,
            overlap="buffer_one",
            misfire_grace_seconds=120,
        )
    )
    stored = Task.objects.get(id="nightly-report")
    assert (stored.retry_max_attempts, stored.retry_backoff) == (3, [10, 60])
    assert stored.params == {"channel": "ops"} and stored.idempotent and stored.overlap == "buffer_one"
    assert stored.revision == 1
    assert stored.next_run_at == task.next_run_at
    assert stored.next_run_at.astimezone(UTC).hour in (0, 1)  # 02:00 in Berlin


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"id": "has space"}, "id"),
        ({"id": "x" * 129}, "id"),
        ({"id": ""}, "id"),
        ({"id": "report\n"}, "id"),
        ({"cron": "* * * * * *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "0 " + ",".join(["1"] * 120) + " * * *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
        ({"retry": {"max_attempts": 101}}, "retry.max_attempts"),
        ({"retry": {"max_attempts": 2, "backoff": [-1]}}, "retry.backoff"),
        ({"params": [1, 2]}, "params"),
        ({"handler": {"kind": "telepathy"}}, "handler.kind"),
        ({"handler": {"kind": "fake", "outcome": "maybe"}}, "handler.outcome"),
        ({"handler": {"kind": "fake", "colour": "red"}}, "handler"),
        ({"overlap": "queue_all"}, "overlap"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"surprise": 1}, ""),
    ],
)
def test_invalid_definition_is_refused_with_a_field_error_and_writes_nothing(changes, field):
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(
            definition("report", **changes) if "id" not in changes else {**definition(), **changes}
        )
    assert field in caught.value.errors
    assert caught.value.code in ("scheduler:012", "scheduler:022")
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "a\x00b"}, "name"),
        ({"description": "\ud800"}, "description"),
        ({"params": {"k\x00": 1}}, "params.k\\x00"),
        ({"params": {"k": ["ok", "\udfff"]}}, "params.k.1"),
        ({"params": {"n": float("nan")}}, "params.n"),
        ({"handler": {"kind": "fake", "result": "a\x00"}}, "handler.result"),
        ({"params": {"deep": nested(MAX_JSON_DEPTH + 8)}}, "params.deep." + ".".join(["0"] * 31)),
        ({"params": {"blob": "x" * MAX_JSON_BYTES}}, ""),
    ],
    ids=["nul", "surrogate", "nul-key", "surrogate-item", "nan", "handler", "deep", "large"],
)
def test_values_no_database_can_store_are_refused_by_register_and_update(changes, field):
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition(**changes))
    assert field in caught.value.errors
    assert not Task.objects.exists()
    scheduler.register(definition())
    before = list(Task.objects.values())
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.update_task("report", **changes)
    assert field in caught.value.errors
    assert list(Task.objects.values()) == before


def test_cron_errors_carry_their_own_code():
    with pytest.raises(InvalidCron) as caught:
        scheduler.register(definition(cron="0 0 31 2 *"))
    assert caught.value.code == "scheduler:022"


def test_register_twice_raises_already_exists_and_keeps_the_first():
    scheduler.register(definition(name="First"))
    with pytest.raises(TaskAlreadyExists) as caught:
        scheduler.register(definition(name="Second"))
    assert caught.value.code == "scheduler:021"
    assert Task.objects.get().name == "First"


def test_update_bumps_revision_and_none_clears_retry_handler_and_timezone():
    scheduler.register(
        definition(
            timezone="Asia/Kolkata", retry={"max_attempts": 3, "backoff": [5]}, handler={"kind": "fake"}
        )
    )
    task = scheduler.update_task("report", enabled=False, retry=None, handler=None, timezone=None)
    stored = Task.objects.get()
    assert stored.revision == task.revision == 2
    assert (stored.enabled, stored.retry_max_attempts, stored.retry_backoff) == (False, 1, [])
    assert stored.handler is None and stored.timezone == ""


def test_invalid_update_changes_nothing():
    scheduler.register(definition(cron="0 9 * * *"))
    before = Task.objects.get()
    with pytest.raises(InvalidDefinition):
        scheduler.update_task("report", name="Renamed", cron="0 0 30 2 *")
    with pytest.raises(InvalidDefinition):
        scheduler.update_task("report", id="other")
    after = Task.objects.get()
    assert (after.name, after.cron, after.revision, after.updated_at) == (
        before.name,
        before.cron,
        before.revision,
        before.updated_at,
    )


def test_update_of_timezone_alone_is_checked_against_the_stored_cron():
    scheduler.register(definition(cron="0 9 * * *"))
    with pytest.raises(InvalidCron):
        scheduler.update_task("report", timezone="Nowhere/Land")
    task = scheduler.update_task("report", timezone="America/New_York")
    assert task.next_run_at.astimezone(UTC).hour in (13, 14)


def test_unknown_task_raises_not_found():
    with pytest.raises(TaskNotFound) as caught:
        scheduler.update_task("ghost", enabled=False)
    assert caught.value.code == "scheduler:020"
    with pytest.raises(TaskNotFound):
        scheduler.unregister("ghost")


def test_unregister_deletes_the_definition_but_not_the_journal():
    scheduler.register(definition())
    execution = scheduler.trigger("report")
    scheduler.unregister("report")
    assert not Task.objects.exists()
    assert scheduler.executions.get(execution.occurrence_id).task_id == "report"


def test_definition_round_trips_through_to_definition():
    original = definition(
        cron="*/5 * * * *",
        timezone="Europe/London",
        retry={"max_attempts": 2, "backoff": [1, 2]},
        params={"a": 1},
    )
    task = scheduler.register(original)
    again = task.to_definition()
    again["id"] = "copy"
    copy = scheduler.register(again)
    assert copy.to_definition() | {"id": "report"} == task.to_definition()


@override_settings(
    SCHEDULER_APP={
        "HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"},
        "TASKS": [definition("a", cron="0 * * * *"), definition("b", cron="30 1 * * *", params={"x": 1})],
    }
)
def test_refresh_tasks_creates_then_updates_only_what_changed():
    scheduler.refresh_tasks()
    assert set(Task.objects.values_list("id", flat=True)) == {"a", "b"}
    scheduler.refresh_tasks()
    assert set(Task.objects.values_list("revision", flat=True)) == {1}
    with override_settings(
        SCHEDULER_APP={"TASKS": [definition("a", cron="0 * * * *"), definition("b", cron="45 1 * * *")]}
    ):
        scheduler.refresh_tasks()
    assert Task.objects.get(id="a").revision == 1
    assert (Task.objects.get(id="b").cron, Task.objects.get(id="b").revision) == ("45 1 * * *", 2)


@pytest.mark.parametrize(
    "tasks",
    [
        [definition("a"), definition("a")],
        [definition(""), definition("b")],
        [definition("a", cron="bad cron")],
    ],
)
def test_bad_declared_tasks_are_refused_at_start_and_reported_by_checks(tasks):
    with override_settings(SCHEDULER_APP={"TASKS": tasks}):
        with pytest.raises(InvalidDefinition):
            scheduler.refresh_tasks()
        with pytest.raises(CommandError, match="scheduler:0"):
            call_command("run_scheduler", "--once")
        from scheduler_app.checks import check_settings

        assert [m.id for m in check_settings()] == ["scheduler_app.E002"]
    assert not Task.objects.exists()


def test_next_run_ignores_the_node_timezone():
    with override_settings(TIME_ZONE="Asia/Tokyo"):
        task = scheduler.register(definition(cron="0 12 * * *"))
    assert task.next_run_at.astimezone(UTC).hour == 12
    assert task.next_run_at > datetime(2020, 1, 1, tzinfo=UTC)


def test_update_without_a_real_change_keeps_the_revision():
    scheduler.register(definition(name="Same"))
    assert scheduler.update_task("report", name="Same").revision == 1


def test_changing_only_the_name_keeps_a_due_next_run():
    task = scheduler.register(definition(cron="0 0 1 1 *"))
    Task.objects.filter(id="report").update(next_run_at=datetime(2020, 1, 1, tzinfo=UTC))
    scheduler.update_task("report", name="Renamed")
    assert Task.objects.get().next_run_at == datetime(2020, 1, 1, tzinfo=UTC)
    scheduler.update_task("report", cron="0 0 2 1 *")
    assert Task.objects.get().next_run_at > task.next_run_at


@override_settings(
    SCHEDULER_APP={
        "TASKS": [{"id": "a", "cron": " 0  *  * * * ", "timezone": None, "params": None, "retry": None}]
    }
)
def test_refresh_tasks_compares_normalised_definitions():
    scheduler.refresh_tasks()
    scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.cron, task.timezone, task.params, task.revision) == ("0 * * * *", "", {}, 1)


def test_refresh_tasks_resets_fields_a_declaration_no_longer_sets():
    declared = definition("a", retry={"max_attempts": 3, "backoff": [5]}, description="old")
    with override_settings(SCHEDULER_APP={"TASKS": [declared]}):
        scheduler.refresh_tasks()
    with override_settings(SCHEDULER_APP={"TASKS": [definition("a")]}):
        scheduler.refresh_tasks()
    task = Task.objects.get()
    assert (task.retry_max_attempts, task.retry_backoff, task.description, task.revision) == (1, [], "", 2)


@override_settings(SCHEDULER_APP={"HANDLERS": {"broken": "tests.nowhere.Handler"}})
def test_a_handler_kind_that_cannot_be_imported_is_unknown_not_a_crash():
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition(handler={"kind": "broken"}))
    assert "handler.kind" in caught.value.errors


def test_registry_masks_handler_secrets_for_display():
    from scheduler_app.handlers import registry

    config = {
        "kind": "api",
        "url": "https://user:pw@example.com/hook?token=abc",
        "headers": {"Authorization": "Bearer s3cret"},
    }
    shown = str(registry.masked(config))
    assert "s3cret" not in shown and "pw@" not in shown and "abc" not in shown
    assert registry.masked(None) is None
    assert registry.masked({"kind": "telepathy", "key": "k"}) == {"kind": "telepathy"}
    assert registry.masked({"kind": "fake", "outcome": "fail"}) == {"kind": "fake", "outcome": "fail"}


def test_an_error_explained_to_a_person_names_what_is_wrong_with_each_field():
    from scheduler_app.exceptions import InvalidDefinition, TaskNotFound

    refused = InvalidDefinition(
        "The trigger is invalid.",
        errors={"run_at": ["Must be at most 366 days from now."], "": ["Unknown fields: x."]},
    )
    assert refused.explained() == (
        "The trigger is invalid. run_at: Must be at most 366 days from now. Unknown fields: x."
    )
    assert TaskNotFound().explained() == "No task with that id."
