"""The journal's queue indexes (due rows, leased rows) hold only the queue on PostgreSQL, and its
hot statements can use them even with a generic plan; other databases keep whole indexes."""

from __future__ import annotations

import importlib
import json
import uuid
from datetime import timedelta

import pytest
from django.core import checks
from django.db import connection

from scheduler_app import db, scheduler
from scheduler_app.models import Execution, Status
from tests.factories import definition

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE_INDEXES = {
    "scheduler_execution_due": "'pending'",
    "scheduler_execution_lease": "'claimed'",
    "scheduler_task_paused": "enabled",
}


def index_definitions() -> dict[str, str]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [list(QUEUE_INDEXES)]
            )
        elif connection.vendor == "sqlite":
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND name IN (%s, %s, %s)",
                list(QUEUE_INDEXES),
            )
        else:
            cursor.execute(
                "SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics"
                " WHERE table_schema = DATABASE() AND index_name IN (%s, %s, %s) GROUP BY index_name",
                list(QUEUE_INDEXES),
            )
        return dict(cursor.fetchall())


def test_the_queue_indexes_are_partial_on_postgresql_and_whole_elsewhere():
    found = index_definitions()
    assert set(found) == set(QUEUE_INDEXES)
    for name, status in QUEUE_INDEXES.items():
        if connection.vendor == "postgresql":
            assert " WHERE " in found[name] and status in found[name]
        else:
            assert "WHERE" not in found[name].upper()


def test_the_task_id_has_its_primary_key_index_and_no_like_prefix_one():
    constraints = connection.introspection.get_constraints(connection.cursor(), "scheduler_app_task")
    on_id = [c for c in constraints.values() if c["columns"] == ["id"] and c["index"]]
    assert [c for c in on_id if not c["primary_key"]] == []


def test_the_like_prefix_index_comes_back_when_the_migrations_are_undone():
    from scheduler_app.indexes import WithoutPatternIndex

    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL builds a LIKE-prefix index beside a varchar primary key")
    from django.apps import apps
    from django.db.migrations.state import ProjectState

    state = ProjectState.from_apps(apps)
    operation = WithoutPatternIndex("task", "id")

    def like_indexes() -> list[str]:
        constraints = connection.introspection.get_constraints(connection.cursor(), "scheduler_app_task")
        return [name for name, c in constraints.items() if name.endswith("_like")]

    with connection.schema_editor() as editor:
        operation.database_backwards("scheduler_app", editor, state, state)
    assert len(like_indexes()) == 1
    with connection.schema_editor() as editor:
        operation.database_forwards("scheduler_app", editor, state, state)
    assert like_indexes() == []


def test_the_index_of_occupying_rows_is_built_on_postgresql_only_and_undone_with_the_migration():
    from django.apps import apps
    from django.db.migrations.state import ProjectState

    from scheduler_app.indexes import PostgresOnlyIndex

    initial = importlib.import_module("scheduler_app.migrations.0001_initial").Migration

    def built() -> bool:
        constraints = connection.introspection.get_constraints(connection.cursor(), "scheduler_app_execution")
        return "scheduler_execution_occupying" in constraints

    if connection.vendor != "postgresql":
        assert not built()
        return
    assert built()
    (operation,) = [o for o in initial.operations if isinstance(o, PostgresOnlyIndex)]
    state = ProjectState.from_apps(apps)
    with connection.schema_editor() as editor:
        operation.database_backwards("scheduler_app", editor, state, state)
    assert not built()
    with connection.schema_editor() as editor:
        operation.database_forwards("scheduler_app", editor, state, state)
    assert built()


def test_no_database_warns_that_a_condition_is_ignored():
    """MySQL and MariaDB have no partial indexes: the model does not ask for one there (models.W037)."""
    assert [m.id for m in checks.run_checks(databases=["default"]) if m.id == "models.W037"] == []


def fill_history(now, rows: int, pending: int = 0) -> None:
    """``rows`` executions of one task, the first ``pending`` of them pending, the rest ended."""
    scheduler.register(definition("history", cron="0 0 1 1 *"))
    Execution.objects.bulk_create(
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id="history",
            task_revision=1,
            trigger_type="manual",
            status=Status.PENDING if n < pending else Status.SUCCESS,
            due_at=now - timedelta(seconds=n),
            params={},
            max_attempts=1,
            created_at=now,
            updated_at=now,
        )
        for n in range(rows)
    )


def copy_tasks(count: int, *, paused_every: int) -> None:
    """``count`` copies of a registered task, every ``paused_every``-th of them paused until tomorrow."""
    from scheduler_app.models import Task

    scheduler.register(definition("original"))
    columns = [
        f.column for f in Task._meta.concrete_fields if f.column not in ("id", "enabled", "disabled_until")
    ]
    listed = ", ".join(connection.ops.quote_name(c) for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO scheduler_app_task (id, enabled, disabled_until, {listed})"
            f" SELECT 'copy-' || n, n %% %s <> 0, CASE WHEN n %% %s = 0 THEN now() + interval '1 day' END,"
            f" {listed} FROM scheduler_app_task, generate_series(1, %s) AS n WHERE id = 'original'",
            [paused_every, paused_every, count],
        )


def prepared_plan(
    sql: str, types: str, params: list, *, generic: bool = True, analyze: bool = True
) -> list[dict]:
    """Every node of the plan of a prepared statement, after ANALYZE (``analyze=False``: under the
    statistics as they are): the generic plan PostgreSQL keeps for later calls, or
    (``generic=False``) the plan made for ``params``, run (EXPLAIN ANALYZE), as the runner's
    sessions plan each call."""
    mode, options = (
        ("force_generic_plan", "FORMAT JSON") if generic else ("force_custom_plan", "ANALYZE, FORMAT JSON")
    )
    with connection.cursor() as cursor:
        if analyze:
            cursor.execute("ANALYZE")
        cursor.execute(f"SET plan_cache_mode = {mode}")
        try:
            cursor.execute(f"PREPARE planned({types}) AS {numbered(sql)}")
            cursor.execute(f"EXPLAIN ({options}) EXECUTE planned({', '.join(['%s'] * len(params))})", params)
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE ALL")
            cursor.execute("RESET plan_cache_mode")
    return plan_nodes(plan)


def kept_plan(sql: str, types: str, params: list) -> list[dict]:
    """The plan a runner keeps for a prepared statement (binding.KEPT_PLANS: generic, made without
    sequential scans), under the statistics as they are."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
    try:
        return prepared_plan(sql, types, params, generic=True, analyze=False)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_seqscan")


def numbered(sql: str) -> str:
    """``sql`` as it is prepared: its %s placeholders numbered $1, $2, ..."""
    parts = sql.split("%s")
    return "".join(part + (f"${n}" if n < len(parts) else "") for n, part in enumerate(parts, 1))


def plan_nodes(plan) -> list[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) result."""
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def below(node):
        return [node, *(n for child in node.get("Plans", []) for n in below(child))]

    return below(plan[0]["Plan"])


def beside_the_newest_row(plan: list[dict]) -> list[dict]:
    """The nodes of the candidates' plan but the read of the journal's newest row (one end of the
    primary key, for the runner's kept plans)."""
    return [n for n in plan if n.get("Alias") != "n"]


def scans_of(plan: list[dict], table: str) -> tuple[list[dict], int]:
    """The nodes of ``plan`` that read ``table`` (not the one that writes it), and how many of its
    rows they read, kept or filtered out."""
    scans = [n for n in plan if n.get("Relation Name") == table and n["Node Type"] != "ModifyTable"]
    return scans, sum(
        n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0) for n in scans
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_the_probe_reads_the_queue_indexes_under_a_generic_plan(clock):
    """The idle tick's one statement names its statuses as literals: prepared, with the plan PostgreSQL
    keeps for every later call, it still reads one end of each partial index (no scan of the history)."""
    fill_history(clock.now(), 5000, pending=1)
    copy_tasks(5000, paused_every=100)
    sql, params = db.probe_statement(connection)
    plan = prepared_plan(sql, "boolean", list(params))
    on_journal = [n for n in plan if n.get("Relation Name") == "scheduler_app_execution"]
    assert len(on_journal) == 3
    assert sorted(n.get("Index Name") for n in on_journal) == [
        "scheduler_execution_due",
        "scheduler_execution_lease",
        "scheduler_execution_lease",
    ]
    on_tasks = [n for n in plan if n.get("Relation Name") == "scheduler_app_task"]
    assert sorted(n.get("Index Name") for n in on_tasks) == ["scheduler_task_due", "scheduler_task_paused"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_the_claim_counts_busy_tasks_without_reading_the_history(clock):
    """The claim skips tasks at their max_concurrency: it counts leased rows through their partial
    index and a candidate's unknown ones through the partial index of occupying rows, never through
    the task index's entry of every ended row (with millions of ended rows that read made W1 14
    times slower, bench/scale.py)."""
    from scheduler_app.postgres.claims import candidates_sql

    now = clock.now()
    fill_history(now, 20000)
    plan = prepared_plan(candidates_sql(), "timestamptz, integer", [now, 32])
    read = {(n["Node Type"], n.get("Index Name")) for n in beside_the_newest_row(plan)}
    assert {name for _, name in read if name} <= {
        "scheduler_execution_due",
        "scheduler_execution_lease",
        "scheduler_execution_occupying",
        "scheduler_app_task_pkey",
    }, read
    assert not [
        n
        for n in plan
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "scheduler_app_execution"
    ]


def many_tasks(now) -> None:
    """4,000 tasks, many-00000 to many-03999, none due."""
    from scheduler_app.models import Task

    Task.objects.bulk_create(
        Task(id=f"many-{n:05d}", name=f"many {n}", cron="0 0 1 1 *", next_run_at=now) for n in range(4000)
    )


def unknown_and_due(now, unknown: list[str], due: list[str]) -> None:
    """One unknown row of each task of ``unknown``, one due pending row of each of ``due``."""
    Execution.objects.bulk_create(
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id=task_id,
            trigger_type="manual",
            status=status,
            due_at=now,
            created_at=now,
            updated_at=now,
        )
        for status, task_ids in ((Status.UNKNOWN, unknown), (Status.PENDING, due))
        for task_id in task_ids
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_the_graces_tasks_set_of_their_own_are_read_from_an_index_of_those_tasks_only(clock):
    """Each page of the task list and each status check reads the graces in use (lateness.cutoffs):
    from an index of the few tasks that set one, not by reading every task (13-16 ms a page at
    100,000 tasks, bench/scale.py)."""
    from django.test.utils import CaptureQueriesContext

    from scheduler_app import lateness
    from scheduler_app.models import Task

    now = clock.now()
    many_tasks(now)
    Task.objects.filter(id__in=["many-00007", "many-00008", "many-00009"]).update(misfire_grace_seconds=300)
    Task.objects.filter(id="many-00010").update(misfire_grace_seconds=30)
    with CaptureQueriesContext(connection) as queries:
        assert [grace for grace, _ in lateness.cutoffs(now)] == [None, 30, 300]
    (query,) = queries
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {query['sql']}")
        plan = plan_nodes(cursor.fetchone()[0])
    scans = [n for n in plan if n.get("Relation Name") == "scheduler_app_task"]
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [
        ("Index Only Scan", "scheduler_task_grace")
    ]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_the_claim_reads_only_the_slots_and_limits_of_the_due_tasks(clock):
    """With many tasks and a thousand unknown rows of tasks not due, the claim reads neither those
    rows nor those tasks: PostgreSQL once merged the occupying rows with an index read of every
    task (20-75 ms a claim at 100,000 tasks), then read every unknown row of the journal at each
    claim (hundreds in a long history: most of what made W1 slower there, bench/scale.py)."""
    from scheduler_app.postgres.claims import candidates_sql

    now = clock.now()
    many_tasks(now)
    unknown_and_due(now, [f"many-{n:05d}" for n in range(0, 4000, 4)], ["many-00001", "many-00002"])
    plan = beside_the_newest_row(
        prepared_plan(candidates_sql(), "timestamptz, integer", [now, 32], generic=False)
    )
    task_rows = sum(
        n["Actual Rows"] * n["Actual Loops"] for n in plan if n.get("Relation Name") == "scheduler_app_task"
    )
    assert task_rows <= 2  # the limits of the two due tasks
    slot_rows = sum(
        n["Actual Rows"] * n["Actual Loops"]
        for n in plan
        if n.get("Relation Name") == "scheduler_app_execution"
        and n.get("Index Name") != "scheduler_execution_due"
    )
    assert slot_rows == 0  # neither has a leased or unknown row


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_the_claim_looks_unknown_rows_up_by_task_whatever_the_statistics_say(clock):
    """A candidate's task is counted by its id even when the statistics know of no unknown row
    (ANALYZE samples 30,000 rows: rare unknown rows among millions are often left out). Asked
    whether each candidate's task had an unknown row, PostgreSQL then read every unknown row of the
    journal for each candidate, through the partial index of unknown rows: in one run of
    bench/scale.py, 13-22 ms a claim on 5 million executions against 1 ms. What is left is one read
    of the occupying rows a claim, for the set of tasks full of leased rows, and only while the
    unknown rows are too few for ANALYZE's sample to find them."""
    from scheduler_app.postgres.claims import candidates_sql

    now = clock.now()
    many_tasks(now)
    fill_history(now, 20000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # statistics that know of no unknown row
    unknown_and_due(
        now, [f"many-{n:05d}" for n in range(0, 4000, 4)], [f"many-{n:05d}" for n in range(1, 400, 4)]
    )
    plan = beside_the_newest_row(
        prepared_plan(candidates_sql(), "timestamptz, integer", [now, 64], generic=False, analyze=False)
    )
    indexes = {n.get("Index Name") for n in plan if n.get("Relation Name") == "scheduler_app_execution"}
    assert "scheduler_execution_unknown" not in indexes, indexes
    on_journal = [
        n
        for n in plan
        if n.get("Relation Name") == "scheduler_app_execution"
        and n.get("Index Name") != "scheduler_execution_due"
    ]
    per_candidate = [n for n in on_journal if n["Actual Loops"] > 1]
    # none of the due tasks has a leased or unknown row
    assert (
        sum(
            (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in per_candidate
        )
        == 0
    )
    once = sum(
        n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in on_journal if n["Actual Loops"] <= 1
    )
    assert once <= 1000  # the journal's unknown rows, at most once
    # Kept, as a runner keeps its plans: no join of the candidates with the unknown rows either.
    kept = beside_the_newest_row(kept_plan(candidates_sql(), "timestamptz, integer", [now, 64]))
    assert [n["Node Type"] for n in kept if "Join" in n["Node Type"] or n["Node Type"] == "Nested Loop"] == []
    assert "scheduler_execution_unknown" not in {n.get("Index Name") for n in kept}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_a_busy_task_s_leased_rows_are_read_once_a_claim_not_once_a_candidate(clock):
    """A bulk trigger's task (max_concurrency 32) with 20 attempts leased and hundreds due: each
    of the claim's candidates is that task. Counted for each candidate, its leased rows were read
    64 times a claim (1.5 ms a claim in bench/trigger_many.py, twice the statement's cost without
    that count); a candidate's task is now only asked for unknown rows, which skips the leased
    entries of the index without reading them."""
    from scheduler_app.postgres.claims import candidates_sql

    now = clock.now()
    scheduler.register(definition("bulk", cron="0 0 1 1 *", max_concurrency=32))
    Execution.objects.bulk_create(
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id="bulk",
            trigger_type="manual",
            status=Status.RUNNING if n < 20 else Status.PENDING,
            due_at=now - timedelta(seconds=1000 - n),
            created_at=now,
            updated_at=now,
        )
        for n in range(500)
    )
    plan = beside_the_newest_row(
        prepared_plan(candidates_sql(), "timestamptz, integer", [now, 64], generic=False)
    )
    assert next(n for n in plan if n.get("Alias") == "e")["Actual Rows"] == 64
    on_journal = [
        n for n in plan if n.get("Relation Name") == "scheduler_app_execution" and n.get("Alias") != "e"
    ]
    per_candidate = [n for n in on_journal if n["Actual Loops"] > 1]
    assert per_candidate, "each candidate's task is looked up"
    assert (
        sum(
            (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in per_candidate
        )
        == 0
    )
    assert (
        sum(
            n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
            for n in on_journal
            if n["Actual Loops"] <= 1
        )
        <= 20
    )
    # Kept, as a runner keeps its plans: the unknown rows are looked up through the occupying index.
    kept = beside_the_newest_row(kept_plan(candidates_sql(), "timestamptz, integer", [now, 64]))
    assert not [
        n for n in kept if n["Node Type"] == "Seq Scan" and n["Relation Name"] == "scheduler_app_execution"
    ]
    assert {n["Index Name"] for n in kept if n.get("Index Name", "").startswith("scheduler_execution")} <= {
        "scheduler_execution_due",
        "scheduler_execution_lease",
        "scheduler_execution_occupying",
    }


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partial indexes are PostgreSQL's")
def test_the_claim_takes_its_rows_by_their_key_whatever_the_statistics_say(clock):
    """The claim's UPDATE finds the rows it locked by their key. It also tested their status once,
    which made the partial index of pending rows match: with statistics taken while the queue was
    empty, PostgreSQL read that index whole, every pending row of a burst at each claim (2 ms a claim
    of 20 rows behind 10,000 triggers of one task, bench/trigger_many.py)."""
    from scheduler_app.postgres.claims import _take_sql

    now = clock.now()
    scheduler.register(definition("history", cron="0 0 1 1 *"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the statistics of a new, empty journal
    Execution.objects.bulk_create(  # a burst of triggers, not analyzed yet
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id="history",
            trigger_type="manual",
            due_at=now,
            created_at=now,
            updated_at=now,
        )
        for _ in range(3000)
    )
    taken = list(Execution.objects.filter(status=Status.PENDING).order_by("sequence")[:2])
    sequences = [row.sequence for row in taken]
    params = [sequences[:1], "running", "claimed", "node", "token", now, now, sequences[:1], now, sequences]
    params += [now, "pending", "claimed", "node", now, "claimed", "running", "node", "running"]
    types = "bigint[], text, text, text, text, timestamptz, timestamptz, bigint[], timestamptz, bigint[]"
    types += ", timestamptz, text, text, text, timestamptz, text, text, text, text"
    # Planned at the call, as the runner's loop plans, under the empty journal's statistics.
    plan = prepared_plan(_take_sql(), types, params, generic=False, analyze=False)
    scans, read = scans_of(plan, "scheduler_app_execution")
    assert read == 2, scans
    indexes = {n["Index Name"] for n in plan if "Index Name" in n}
    assert indexes <= {"scheduler_app_execution_pkey", "scheduler_app_task_pkey"}, indexes
    # Kept, as a runner keeps it once the journal has grown to this (binding.kept_plans).
    kept = kept_plan(_take_sql(), types, params)
    indexes = {n["Index Name"] for n in kept if "Index Name" in n}
    assert indexes <= {"scheduler_app_execution_pkey", "scheduler_app_task_pkey"}, indexes


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the statement is PostgreSQL's")
def test_moving_the_next_runs_of_a_batch_reads_only_its_tasks(clock):
    """Scheduling moves next_run_at of the tasks it planned by their key: PostgreSQL once read the
    whole task table for each batch of 200 (a hash join with the new instants)."""
    from scheduler_app.models import Task
    from scheduler_app.postgres.scheduled import move_next_runs_sql

    now = clock.now()
    Task.objects.bulk_create(
        Task(id=f"many-{n:05d}", name=f"many {n}", cron="0 0 1 1 *", next_run_at=now) for n in range(10000)
    )
    ids = [f"many-{n:05d}" for n in range(0, 10000, 50)]  # a batch of scheduling.BATCH
    later = now + timedelta(days=1)
    plan = prepared_plan(
        move_next_runs_sql(), "text[], timestamptz[], text[]", [ids, [later] * len(ids), ids], generic=False
    )
    scans, read = scans_of(plan, "scheduler_app_task")
    assert "Seq Scan" not in {n["Node Type"] for n in scans}, scans
    assert read == len(ids)
