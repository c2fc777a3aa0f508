"""Many manual triggers of one task at once: trigger()'s rules for each, all or nothing, a fixed cost."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from scheduler_app import scheduler
from scheduler_app.exceptions import Conflict, InvalidDefinition, TaskNotFound
from scheduler_app.models import Execution, ExecutionEvent, Status, manual_occurrence_id
from scheduler_app.services import MAX_TRIGGERS
from tests.factories import definition, inline_runner
from tests.test_api import PROJECTION, assert_error, client_for, make_user, post
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def rows() -> tuple[int, int]:
    return Execution.objects.count(), ExecutionEvent.objects.count()


def test_each_trigger_becomes_a_pending_execution_in_order_with_its_params_merged_over_the_tasks(clock):
    scheduler.register(definition(cron="0 0 1 1 *", params={"channel": "ops", "n": 0}, max_concurrency=4))
    executions = scheduler.trigger_many(
        "report", [{"params": {"n": n}} for n in range(1, 4)] + [{}], source="billing"
    )
    assert [e.params for e in executions] == [
        {"channel": "ops", "n": 1},
        {"channel": "ops", "n": 2},
        {"channel": "ops", "n": 3},
        {"channel": "ops", "n": 0},
    ]
    stored = list(Execution.objects.order_by("sequence"))
    assert [e.sequence for e in executions] == [e.sequence for e in stored]
    assert {(e.status, e.trigger_type, e.trigger_source, e.attempt) for e in stored} == {
        (Status.PENDING, "manual", "billing", 0)
    }
    events = ExecutionEvent.objects.order_by("execution_id")
    assert [(e.execution_id, e.to_status, e.reason) for e in events] == [
        (e.sequence, Status.PENDING, "triggered by billing") for e in executions
    ]
    inline_runner(clock).tick()
    assert set(Execution.objects.values_list("status", flat=True)) == {Status.SUCCESS}


def test_the_same_keys_return_the_same_executions_and_create_nothing_more():
    scheduler.register(definition())
    batch = [{"idempotency_key": f"k{n}", "params": {"n": n}} for n in range(3)]
    first = scheduler.get_or_trigger_many("report", batch)
    again = scheduler.get_or_trigger_many("report", batch)
    assert [created for _, created in first] == [True, True, True]
    assert [created for _, created in again] == [False, False, False]
    assert [e.occurrence_id for e, _ in again] == [manual_occurrence_id("report", f"k{n}") for n in range(3)]
    assert [e.sequence for e, _ in again] == [e.sequence for e, _ in first]
    assert rows() == (3, 3)


def test_a_key_given_twice_in_one_batch_with_the_same_params_is_one_execution():
    scheduler.register(definition())
    results = scheduler.get_or_trigger_many(
        "report", [{"idempotency_key": "k", "params": {"a": 1}}, {"idempotency_key": "k", "params": {"a": 1}}]
    )
    (first, created), (second, again) = results
    assert (first.sequence, created, again) == (second.sequence, True, False)
    assert rows() == (1, 1)


def test_a_key_given_a_single_trigger_before_is_returned_by_a_batch_and_the_reverse():
    scheduler.register(definition())
    single = scheduler.trigger("report", idempotency_key="k", params={"a": 1})
    ((batched, created),) = scheduler.get_or_trigger_many(
        "report", [{"idempotency_key": "k", "params": {"a": 1}}]
    )
    assert (batched.sequence, created) == (single.sequence, False)
    (other,) = scheduler.trigger_many("report", [{"idempotency_key": "j"}])
    assert scheduler.trigger("report", idempotency_key="j").sequence == other.sequence


@pytest.mark.parametrize(
    "batch",
    [
        # The same key twice in the batch with other params.
        [
            {"idempotency_key": "new"},
            {"idempotency_key": "k2", "params": {"a": 1}},
            {"idempotency_key": "k2"},
        ],
        # A key used before with other params, after new triggers in the batch.
        [{"idempotency_key": "new"}, {}, {"idempotency_key": "taken", "params": {"a": 2}}],
    ],
)
def test_a_key_reused_with_other_params_refuses_the_whole_batch(batch: list[dict[str, Any]]):
    scheduler.register(definition())
    scheduler.trigger("report", idempotency_key="taken", params={"a": 1})
    with pytest.raises(Conflict) as caught:
        scheduler.trigger_many("report", batch)
    assert caught.value.code == "scheduler:041"
    assert rows() == (1, 1)


def test_an_unknown_task_is_refused_and_nothing_is_written():
    with pytest.raises(TaskNotFound):
        scheduler.trigger_many("missing", [{}])
    assert rows() == (0, 0)


@pytest.mark.parametrize(
    ("batch", "source", "fields"),
    [
        ([], None, {"triggers"}),
        ({"params": {}}, None, {"triggers"}),
        ([{}] * (MAX_TRIGGERS + 1), None, {"triggers"}),
        ([{}, 5], None, {"triggers[1]"}),
        ([{"source": "x"}], None, {"triggers[0]"}),
        (
            [{"params": [1]}, {"idempotency_key": ""}],
            None,
            {"triggers[0].params", "triggers[1].idempotency_key"},
        ),
        ([{"params": {"a": "nul\x00"}}], None, {"triggers[0].params.a"}),
        ([{}], 5, {"source"}),
    ],
)
def test_an_invalid_batch_names_each_bad_field_and_writes_nothing(batch: Any, source: Any, fields: set[str]):
    scheduler.register(definition())
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.trigger_many("report", batch, source=source)
    assert caught.value.code == "scheduler:012"
    assert set(caught.value.errors) == fields
    assert rows() == (0, 0)


def test_a_batch_costs_the_same_statements_whatever_its_size_within_the_databases_parameter_limit():
    """One statement on PostgreSQL; elsewhere the same statements but for the two multi-row INSERTs,
    which a database with a parameter limit (SQLite before Django 6: 999) splits into chunks."""
    scheduler.register(definition())
    limit = connection.features.max_query_params
    per_row = len(Execution._meta.concrete_fields)

    def statements(size: int, keyed: bool) -> tuple[int, int]:
        """The statements of one batch: those that are not INSERTs, and the INSERTs."""
        batch = [{"idempotency_key": f"{size}-{n}-{keyed}"} if keyed else {} for n in range(size)]
        with CaptureQueriesContext(connection) as queries:
            scheduler.trigger_many("report", batch)
        # This test's transaction puts the batch in a savepoint; alone it is not.
        sql = [
            q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
        ]
        inserts = sum(1 for text in sql if text.startswith("INSERT"))
        return len(sql) - inserts, inserts

    for keyed in (True, False):
        (small_others, small_inserts), (large_others, large_inserts) = (
            statements(10, keyed),
            statements(500, keyed),
        )
        assert small_others == large_others
        if connection.vendor == "postgresql":
            assert (small_others, small_inserts, large_inserts) == (1, 0, 0)
        else:
            assert small_inserts == 2
            assert large_inserts == 2 if limit is None else large_inserts <= 2 * -(-500 * per_row // limit)


def sessions_waiting_for_a_lock() -> int:
    """How many sessions of the test database's server wait for a row lock."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        else:
            cursor.execute("SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer at a time: no race")
def test_a_key_a_concurrent_trigger_commits_while_the_batch_is_written_is_returned_not_duplicated():
    """The concurrent trigger's insert is not committed when the batch looks its keys up, and is when
    the batch's insert, which waited for it on the unique index, goes on."""
    scheduler.register(definition())
    inserted, release = threading.Event(), threading.Event()

    def concurrent_trigger() -> None:
        try:
            with transaction.atomic():
                scheduler.trigger("report", idempotency_key="k")
                inserted.set()
                release.wait(30)
        finally:
            connections.close_all()

    other = threading.Thread(target=concurrent_trigger)
    other.start()
    try:
        assert inserted.wait(30)
        batch = threading.Thread(target=lambda: results.extend(batch_call()))
        results: list[tuple[Execution, bool]] = []

        def batch_call() -> list[tuple[Execution, bool]]:
            try:
                return scheduler.get_or_trigger_many("report", [{}, {"idempotency_key": "k"}])
            finally:
                connections.close_all()

        batch.start()
        # InnoDB refreshes what information_schema.innodb_trx shows only when it is read 0.1 s or more
        # after the last refresh: a faster poll keeps seeing the state before the wait.
        wait_for(lambda: sessions_waiting_for_a_lock() >= 1, timeout=30, interval=0.2)
    finally:
        release.set()
        other.join(30)
    batch.join(30)
    assert [created for _, created in results] == [True, False]
    assert Execution.objects.filter(idempotency_key="k").count() == 1
    assert rows() == (2, 2)


# -- REST ---------------------------------------------------------------------------


@pytest.fixture
def api():
    return client_for(make_user("alice", "view_task", "add_execution"))


def test_rest_trigger_many_answers_202_with_the_executions_then_200_for_the_same_keys(api):
    scheduler.register(definition())
    body = {"triggers": [{"idempotency_key": f"k{n}", "params": {"n": n}} for n in range(3)]}
    response = post(api, "tasks/report/trigger-many/", body)
    assert response.status_code == 202, response.content
    data = response.json()
    assert data["created"] == 3
    assert [set(e) for e in data["executions"]] == [PROJECTION] * 3
    assert {e["trigger_source"] for e in data["executions"]} == {"alice"}
    again = post(api, "tasks/report/trigger-many/", body)
    assert (again.status_code, again.json()["created"]) == (200, 0)
    assert [e["sequence"] for e in again.json()["executions"]] == [e["sequence"] for e in data["executions"]]


def test_rest_trigger_many_errors(api):
    scheduler.register(definition())
    path = "tasks/report/trigger-many/"
    assert_error(post(api, path, {"triggers": [{"params": 1}]}), 400, "scheduler:012", {"triggers[0].params"})
    assert_error(post(api, path, {"triggers": [], "extra": 1}), 400, "scheduler:012", {""})
    assert_error(post(api, path, {}), 400, "scheduler:012", {"triggers"})
    assert_error(post(api, "tasks/missing/trigger-many/", {"triggers": [{}]}), 404, "scheduler:020")
    post(api, path, {"triggers": [{"idempotency_key": "k"}]})
    body = {"triggers": [{}, {"idempotency_key": "k", "params": {"a": 1}}]}
    assert_error(post(api, path, body), 409, "scheduler:041")
    assert rows() == (1, 1)


def test_rest_trigger_many_needs_add_execution():
    scheduler.register(definition())
    viewer = client_for(make_user("bob", "view_task"))
    response = post(viewer, "tasks/report/trigger-many/", {"triggers": [{}]})
    assert response.status_code == 403
    assert rows() == (0, 0)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement batch is PostgreSQL's")
def test_a_batch_on_postgresql_is_one_statement_that_writes_and_answers_what_the_orm_path_does(monkeypatch):
    from scheduler_app import statements
    from tests.test_triggers import stored

    scheduler.register(definition(params={"a": 1, "b": {"x": 1}}, retry={"max_attempts": 3, "backoff": [5]}))
    scheduler.update_task("report", name="Renamed")  # revision 2
    batch = [{"params": {"b": 2, "c": [1]}}, {"idempotency_key": "k", "params": {"d": None}}, {}]
    with CaptureQueriesContext(connection) as queries:
        fast = scheduler.get_or_trigger_many("report", batch, source="ops")
    # Inside this test's transaction the statement runs in a savepoint; in autocommit it is alone.
    # A prepared statement is logged by Django as "QUERY = '<text>' - PARAMS = ...".
    sent = [q["sql"].removeprefix("QUERY = ").strip("'\"").split()[0] for q in queries.captured_queries]
    assert sent == ["SAVEPOINT", "WITH", "RELEASE"]
    monkeypatch.setattr(connection, statements.ATTRIBUTE, statements.ORM)
    slow = scheduler.get_or_trigger_many(
        "report", [*batch[:1], {"idempotency_key": "j", "params": {"d": None}}, {}], source="ops"
    )
    assert [stored(e) for e, _ in fast] == [stored(e) for e, _ in slow]
    for answered, created in fast:
        row = Execution.objects.get(sequence=answered.sequence)
        assert created
        assert (answered.params, answered.status, answered.attempt) == (row.params, row.status, row.attempt)
        assert (answered.task_revision, answered.max_attempts, answered.created_at) == (2, 3, row.created_at)
    assert fast[0][0].params == {"a": 1, "b": 2, "c": [1]}
    monkeypatch.undo()
    # A key used before: one statement, then the look-up of the executions it left out.
    again = scheduler.get_or_trigger_many("report", [{"idempotency_key": "k", "params": {"d": None}}, {}])
    (first, first_created), (_, second_created) = again
    assert (first.sequence, first_created, second_created) == (fast[1][0].sequence, False, True)
