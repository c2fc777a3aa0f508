"""Manual triggers: idempotency keys, params, waiting, and the one-statement trigger on PostgreSQL."""

from __future__ import annotations

import pytest

from scheduler_app import scheduler
from scheduler_app.exceptions import Conflict, InvalidDefinition, TaskNotFound
from scheduler_app.models import Execution, ExecutionEvent, manual_occurrence_id
from tests.factories import definition, nested

pytestmark = pytest.mark.django_db


def test_the_same_idempotency_key_returns_the_same_execution():
    scheduler.register(definition(params={"a": 1}))
    first = scheduler.trigger("report", source="billing", idempotency_key="2026-10", params={"b": 2})
    again = scheduler.trigger("report", source="billing", idempotency_key="2026-10", params={"b": 2})
    assert first.occurrence_id == again.occurrence_id == manual_occurrence_id("report", "2026-10")
    assert Execution.objects.count() == 1
    assert ExecutionEvent.objects.get().reason == "triggered by billing"


def test_the_same_key_with_other_params_is_a_conflict():
    scheduler.register(definition())
    scheduler.trigger("report", idempotency_key="k", params={"b": 2})
    with pytest.raises(Conflict) as caught:
        scheduler.trigger("report", idempotency_key="k", params={"b": 3})
    assert caught.value.code == "scheduler:041"
    with pytest.raises(Conflict):
        scheduler.trigger("report", idempotency_key="k")
    assert Execution.objects.count() == 1


def test_trigger_params_merge_shallowly_over_the_task_params_for_that_execution_only():
    scheduler.register(definition(params={"a": 1, "nested": {"x": 1}}))
    execution = scheduler.trigger("report", params={"nested": {"y": 2}, "c": 3})
    assert execution.params == {"a": 1, "nested": {"y": 2}, "c": 3}
    assert scheduler.trigger("report").params == {"a": 1, "nested": {"x": 1}}


def test_triggers_without_key_are_distinct():
    scheduler.register(definition())
    assert scheduler.trigger("report").occurrence_id != scheduler.trigger("report").occurrence_id


@pytest.mark.parametrize(
    "kwargs",
    [
        {"params": [1]},
        {"idempotency_key": ""},
        {"idempotency_key": "k" * 129},
        {"wait": -1},
        {"source": 5},
        # What no database can store, refused as the API and register() refuse it.
        {"params": {"a": "nul\x00"}},
        {"params": {"\ud800": 1}},
        {"params": {"deep": nested(40)}},
        {"idempotency_key": "k\x00"},
        {"source": "billing\ud800"},
    ],
)
def test_bad_trigger_input_is_refused_and_writes_nothing(kwargs):
    scheduler.register(definition())
    with pytest.raises(InvalidDefinition):
        scheduler.trigger("report", **kwargs)
    assert not Execution.objects.exists()


def test_trigger_of_an_unknown_task_raises_not_found():
    with pytest.raises(TaskNotFound):
        scheduler.trigger("ghost")


def test_trigger_wait_returns_at_the_deadline_when_nothing_runs():
    scheduler.register(definition())
    execution = scheduler.trigger("report", wait=0.05)
    assert execution.status == "pending"


def stored(execution: Execution) -> tuple[dict, list]:
    row = Execution.objects.filter(sequence=execution.sequence).values().get()
    for name in ("sequence", "occurrence_id", "idempotency_key", "due_at", "created_at", "updated_at"):
        row.pop(name)
    events = list(
        ExecutionEvent.objects.filter(execution_id=execution.sequence).values_list(
            "from_status", "to_status", "reason", "node", "attempt", "result", "error"
        )
    )
    return row, events


def test_a_trigger_on_postgresql_is_one_statement_that_writes_what_the_orm_path_writes(monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler_app import statements

    if connection.vendor != "postgresql":
        pytest.skip("the one-statement trigger is PostgreSQL's")
    scheduler.register(definition(params={"a": 1, "b": {"x": 1}}, retry={"max_attempts": 3, "backoff": [5]}))
    scheduler.update_task("report", name="Renamed")  # revision 2
    with CaptureQueriesContext(connection) as queries:
        fast = scheduler.trigger("report", source="ops", idempotency_key="k1", params={"b": 2, "c": [1]})
    assert len(queries) == 1
    monkeypatch.setattr(connection, statements.ATTRIBUTE, statements.ORM)
    slow = scheduler.trigger("report", source="ops", idempotency_key="k2", params={"b": 2, "c": [1]})
    assert stored(fast) == stored(slow)
    assert (fast.params, fast.task_revision, fast.max_attempts) == ({"a": 1, "b": 2, "c": [1]}, 2, 3)
    assert Execution.objects.get(sequence=fast.sequence).params == fast.params
    monkeypatch.undo()
    again = scheduler.trigger("report", source="ops", idempotency_key="k1", params={"b": 2, "c": [1]})
    assert again.sequence == fast.sequence
    with pytest.raises(Conflict):
        scheduler.trigger("report", idempotency_key="k1", params={"b": 3})
    with pytest.raises(TaskNotFound):
        scheduler.trigger("missing")


def test_a_triggered_execution_is_built_as_execution_would_build_it_and_answered_as_stored():
    """occurrences.manual builds the trigger's row without Model.__init__: every field the trigger
    and its task do not give holds its default, and trigger() answers the row as stored."""
    scheduler.register(definition(params={"k": [1]}, retry={"max_attempts": 3}))
    answered = scheduler.trigger("report", source="ops", idempotency_key="k", params={"n": 2})
    default = Execution()
    given = {"sequence", "occurrence_id", "task_id", "task_revision", "trigger_type", "trigger_source"}
    given |= {"idempotency_key", "payload_hash", "params", "due_at", "max_attempts"}
    given |= {"created_at", "updated_at"}
    for field in Execution._meta.concrete_fields:
        if field.attname not in given:
            assert getattr(answered, field.attname) == getattr(default, field.attname), field.attname
    assert (answered.params, answered.max_attempts, answered._state.adding) == ({"k": [1], "n": 2}, 3, False)
    fresh = Execution.objects.get(sequence=answered.sequence)
    assert [getattr(fresh, f.attname) for f in Execution._meta.concrete_fields] == [
        getattr(answered, f.attname) for f in Execution._meta.concrete_fields
    ]
    (many,) = scheduler.trigger_many("report", [{"params": {"n": 3}}], source="ops")
    assert Execution.objects.get(sequence=many.sequence).params == many.params == {"k": [1], "n": 3}
