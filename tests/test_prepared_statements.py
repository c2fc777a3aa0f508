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
