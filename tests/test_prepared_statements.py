"""On PostgreSQL the fixed statements of triggers and claims are prepared by default, once per
connection, and never where DISABLE_SERVER_SIDE_CURSORS says a transaction-mode pooler is in between."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from scheduler_app import scheduler
from scheduler_app.runner import claims
from tests.factories import definition

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


def trigger_and_claim(clock) -> list[str]:
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=5))
    for n in range(3):
        scheduler.trigger("report", params={"n": n})
    for _ in range(2):
        claims.claim(clock.now(), "node-a", 1, 60)
    return prepared()


def test_triggers_and_claims_are_prepared_by_default_and_each_once(clock):
    statements = trigger_and_claim(clock)
    inserts = [s for s in statements if s.startswith("WITH t AS") and "INSERT INTO" in s]
    takes = [s for s in statements if s.startswith("WITH u AS (UPDATE")]
    assert (len(inserts), len(takes)) == (1, 1)
    assert any("FOR UPDATE OF e SKIP LOCKED" in s for s in statements)


def test_nothing_is_prepared_behind_a_transaction_pooler(clock):
    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    assert trigger_and_claim(clock) == []


@override_settings(SCHEDULER_APP={"PREPARED_STATEMENTS": False})
def test_nothing_is_prepared_when_the_setting_says_so(clock):
    assert trigger_and_claim(clock) == []


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


def test_a_runners_statements_are_planned_at_each_call_for_the_journal_as_it_is_then():
    from scheduler_app import db
    from scheduler_app.statements import journal_statements

    for _ in range(8):
        db.probe()
    # Elsewhere (a web process) PostgreSQL settles on one plan after the fifth call.
    assert plans("SELECT statement_timestamp()")[0] > 0
    connection.close()
    with journal_statements().planned_at_each_call():
        for _ in range(8):
            db.probe()
        # A plan that read the whole journal while it was empty is not kept for when it is large.
        assert plans("SELECT statement_timestamp()") == (0, 8)
        assert plan_cache_mode() == "force_custom_plan"
    assert plan_cache_mode() == "auto"


def test_the_loop_of_a_runner_plans_at_each_call_and_leaves_the_session_as_it_was(monkeypatch):
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
    assert modes and set(modes) == {"force_custom_plan"}
    assert plan_cache_mode() == "auto"
