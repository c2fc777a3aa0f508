"""On PostgreSQL the fixed statements of triggers and claims are prepared by default, once per
connection, and never where DISABLE_SERVER_SIDE_CURSORS says a transaction-mode pooler is in between."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.test import override_settings

from scheduler_app import scheduler, wakeup
from scheduler_app.runner import claims
from tests.factories import definition
from tests.test_partial_indexes import numbered, plan_nodes, scans_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    connection.close()  # a session of its own: pg_prepared_statements is per session
    yield
    connection.settings_dict.pop("DISABLE_SERVER_SIDE_CURSORS", None)
    connection.close()


def prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def trigger_and_claim(clock, monkeypatch) -> list[str]:
    # No wake-up sent yet: the first trigger carries one, the others (within the spacing, however
    # slow the machine) do not, and ask no thread to send one.
    monkeypatch.setattr(wakeup, "_sender", wakeup._Sender())
    monkeypatch.setattr(wakeup, "SPACING", 60.0)
    monkeypatch.setattr(wakeup, "notify", lambda: None)
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=5))
    for n in range(3):
        scheduler.trigger("report", params={"n": n})
    for _ in range(2):
        claims.claim(clock.now(), "node-a", 1, 60)
    return prepared()


def test_triggers_and_claims_are_prepared_by_default_and_each_once(clock, monkeypatch):
    statements = trigger_and_claim(clock, monkeypatch)
    inserts = [s for s in statements if s.startswith("WITH t AS") and "INSERT INTO" in s]
    takes = [s for s in statements if s.startswith("WITH u AS (UPDATE")]
    # The trigger's statement has two texts: with the wake-up it carries (the first), and without.
    assert sorted("pg_notify" in s for s in inserts) == [False, True]
    assert len(takes) == 1
    assert any("FOR UPDATE OF e SKIP LOCKED" in s for s in statements)


def test_nothing_is_prepared_behind_a_transaction_pooler(clock, monkeypatch):
    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    assert trigger_and_claim(clock, monkeypatch) == []


@override_settings(SCHEDULER_APP={"PREPARED_STATEMENTS": False})
def test_nothing_is_prepared_when_the_setting_says_so(clock, monkeypatch):
    assert trigger_and_claim(clock, monkeypatch) == []


def plans(start: str) -> tuple[int, int]:
    """(generic, custom) plans PostgreSQL made for the prepared statement starting with ``start``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            [start + "%"],
        )
        return cursor.fetchone()


def plan_cache_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        return cursor.fetchone()[0]


def test_a_runners_statements_keep_their_plans_without_sequential_scans():
    from scheduler_app import db
    from scheduler_app.statements import journal_statements

    with journal_statements().kept_plans():
        for _ in range(3):
            db.probe()
        assert plans("SELECT statement_timestamp()") == (3, 0)
        assert plan_cache_mode() == "force_generic_plan"
        assert setting("enable_seqscan") == "off"
    assert (plan_cache_mode(), setting("enable_seqscan")) == ("auto", "on")


def test_the_loop_of_a_runner_keeps_its_plans_and_leaves_the_session_as_it_was(monkeypatch):
    from scheduler_app import db
    from scheduler_app.runner.loop import SchedulerLoop

    modes: list[str] = []
    original = db.probe

    def probe(*args, **kwargs):
        found = original(*args, **kwargs)
        modes.append(plan_cache_mode())
        return found

    monkeypatch.setattr(db, "probe", probe)
    SchedulerLoop(node_id="node-a", workers=1).run(once=True)
    assert modes and set(modes) == {"force_generic_plan"}
    assert plan_cache_mode() == "auto"


def setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return cursor.fetchone()[0]


def journal_rows(now, count: int, status: str) -> list:
    from scheduler_app.models import Execution

    return Execution.objects.bulk_create(
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id="report",
            trigger_type="manual",
            status=status,
            execution_token=f"token-{uuid.uuid4()}",
            due_at=now,
            created_at=now,
            updated_at=now,
        )
        for _ in range(count)
    )


def start_params(rows, now) -> list:
    """batch.start's parameters for ``rows``, in the order of its statement."""
    sequences = [row.sequence for row in rows]
    tokens = [row.execution_token for row in rows]
    moved = ["claimed", "running", now, now, sequences]
    event = [now, "claimed", "running", "started", "node-a"]
    return [sequences, tokens, *moved, *event]


def finish_params(rows, now) -> list:
    """batch.finish's parameters for successes of ``rows`` (no log rows), in its statement's order."""
    outcomes = [
        {
            "sequence": row.sequence,
            "token": row.execution_token,
            "from_status": "running",
            "given": ["status", "updated_at", "finished_at"],
            "new_status": "success",
            "new_updated_at": now.isoformat(),
            "new_finished_at": now.isoformat(),
            "event_reason": "succeeded",
        }
        for row in rows
    ]
    return [json.dumps(outcomes), [row.sequence for row in rows], now, "node-a", "[]"]


WRITER_STATEMENTS = [("_start_sql", "claimed", start_params), ("_finish_sql", "running", finish_params)]


def prepared_as(text: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE statement = %s", [numbered(text)])
        found = cursor.fetchall()
    assert len(found) == 1, found
    return found[0][0]


@pytest.mark.django_db(transaction=True, reset_sequences=True)
@pytest.mark.parametrize(("sql", "status", "params"), WRITER_STATEMENTS)
def test_the_writers_plans_are_made_again_as_the_journal_grows_and_read_by_key(clock, sql, status, params):
    """A runner's journal writer keeps the plan of each of its statements, made at its first call,
    often on a new journal of a few rows. Made there, the starts' plan read a whole index for each row
    (the task's, by its second column), and with sequential scans the outcomes' read the whole
    table: 20,000 rows a row a minute later.
    Made again once the journal's newest sequence has doubled, and without sequential scans (and the
    start's status a parameter: as a literal it matched the partial index of leased rows), the plan
    in use reads each row by its key."""
    from scheduler_app.postgres import batch
    from scheduler_app.postgres.binding import REPLAN_AFTER_ROWS
    from scheduler_app.statements import journal_statements

    now = clock.now()
    scheduler.register(definition(cron="0 0 1 1 *"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the statistics of a new, empty journal
    text = getattr(batch, sql)()
    first = journal_rows(now, 20, status)
    with journal_statements().kept_plans():
        assert len(batch._run(text, params(first[:10], now), first[9].sequence)) == 10
        made_small = prepared_as(text)
        rows = journal_rows(now, 20_000, status)
        # Newest rows under twice the sequence of the plan's and 1,000 more: the plan is kept.
        assert len(batch._run(text, params(first[10:], now), rows[REPLAN_AFTER_ROWS // 2].sequence)) == 10
        assert prepared_as(text) == made_small
        assert len(batch._run(text, params(rows[:10], now), rows[-1].sequence)) == 10
        made_large = prepared_as(text)
        assert made_large != made_small
        values = params(rows[10_000:10_010], now)
        with connection.cursor() as cursor:
            cursor.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {made_large}({', '.join(['%s'] * len(values))})",
                values,
            )
            plan = plan_nodes(cursor.fetchone()[0])
    assert plans(numbered(text)[:60])[1] == 0  # never a custom plan: each is made once and kept
    scans, read = scans_of(plan, "scheduler_app_execution")
    assert read == 2 * 10, scans  # locked, then moved: each by its key
    assert {n["Index Name"] for n in plan if "Index Name" in n} <= {"scheduler_app_execution_pkey"}, scans


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_the_claims_kept_plan_reads_only_the_rows_it_returns_from_a_burst(clock):
    """The loop keeps its plans too. The claim's read of candidates, first planned on 20 due rows, is
    planned again once it has seen the journal's newest sequence double (it returns it), and behind
    20,000 due rows its plan reads the rows it returns from the index of due rows, however many wait
    (its limit is a parameter of the kept plan)."""
    from scheduler_app.postgres.claims import candidates, candidates_sql
    from scheduler_app.statements import journal_statements

    now = clock.now()
    scheduler.register(definition(cron="0 0 1 1 *"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the statistics of a new, empty journal
    journal_rows(now, 20, "pending")
    with journal_statements().kept_plans():
        assert len(candidates(now, 64)) == 20
        made_small = prepared_as(candidates_sql())
        journal_rows(now, 20_000, "pending")
        assert len(candidates(now, 64)) == 64  # sees the newest row
        assert len(candidates(now, 64)) == 64
        made_large = prepared_as(candidates_sql())
        assert made_large != made_small
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {made_large}(%s, %s)", [now, 64])
            plan = plan_nodes(cursor.fetchone()[0])
    scans, read = scans_of(plan, "scheduler_app_execution")
    assert read <= 64 + 1, scans  # the rows returned, and the newest row's key
    assert "Seq Scan" not in {n["Node Type"] for n in plan}
