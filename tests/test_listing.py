"""Listing the journal: keyset pages of executions (Python and REST), and the operator's lists by limit
and offset; bad input is refused with scheduler:012 and the field it concerns."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.models import Execution, Status
from tests.factories import definition
from tests.test_api import ALL_PERMISSIONS, BASE, assert_error, client_for, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def journal(clock) -> list[Execution]:
    """Seven executions of two tasks, oldest first: one a minute, with statuses of every kind."""
    scheduler.register(definition("report", cron="0 0 1 1 *", max_concurrency=10))
    scheduler.register(definition("other", cron="0 0 1 1 *", max_concurrency=10))
    made = []
    for n in range(7):
        made.append(scheduler.trigger("report" if n % 2 == 0 else "other", params={"n": n}))
        clock.advance(60)
    Execution.objects.filter(sequence=made[1].sequence).update(status=Status.UNKNOWN, result={"big": "x"})
    Execution.objects.filter(sequence=made[4].sequence).update(status=Status.SUCCESS, result={"big": "y"})
    return made


def sequences(rows: list[Execution]) -> list[int]:
    return [row.sequence for row in rows]


def test_pages_follow_each_other_newest_first_until_the_last(journal):
    seen, cursor = [], None
    for _ in range(10):
        page = scheduler.executions.list(limit=3, cursor=cursor)
        seen += sequences(page.results)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == sorted((e.sequence for e in journal), reverse=True)


def test_rows_added_after_the_first_page_do_not_shift_the_next(journal):
    first = scheduler.executions.list(limit=3)
    scheduler.trigger("report")
    second = scheduler.executions.list(limit=3, cursor=first.next_cursor)
    assert sequences(second.results) == sorted((e.sequence for e in journal), reverse=True)[3:6]


def test_filters_combine(journal, clock):
    assert sequences(scheduler.executions.list(task_id="other").results) == [
        journal[5].sequence,
        journal[3].sequence,
        journal[1].sequence,
    ]
    assert sequences(scheduler.executions.list(status="unknown").results) == [journal[1].sequence]
    assert sequences(scheduler.executions.list(task_id="report", status="pending", limit=1).results) == [
        journal[6].sequence
    ]
    window = scheduler.executions.list(
        due_after=journal[2].due_at, due_before=journal[5].due_at, trigger_type="manual"
    )
    assert sequences(window.results) == [journal[4].sequence, journal[3].sequence, journal[2].sequence]
    assert scheduler.executions.list(trigger_type="scheduled").results == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": True}, "limit"),
        ({"status": "done"}, "status"),
        ({"trigger_type": "cron"}, "trigger_type"),
        ({"due_after": "2026-01-01"}, "due_after"),
        ({"task_id": "x" * 129}, "task_id"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "YmVmb3JlOi0x"}, "cursor"),  # "before:-1"
    ],
)
def test_bad_queries_are_refused_with_the_field(journal, query, field):
    with pytest.raises(InvalidDefinition) as raised:
        scheduler.executions.list(**query)
    assert raised.value.code == "scheduler:012" and set(raised.value.errors) == {field}


def test_the_operators_lists_take_a_limit_and_an_offset(journal):
    Execution.objects.filter(task_id="report").update(status=Status.UNKNOWN)
    unknown = [journal[1], journal[0], journal[2], journal[4], journal[6]]
    Execution.objects.filter(sequence__in=[e.sequence for e in unknown]).update(log_persistence="pending")
    assert len(scheduler.executions.list_unknown()) == 5
    assert (
        sequences(scheduler.executions.list_unknown(limit=2, offset=1))
        == sequences(scheduler.executions.list_unknown())[1:3]
    )
    assert len(scheduler.executions.list_log_failures(limit=100)) == 5
    for bad in ({"limit": 0}, {"limit": 101}, {"offset": -1}, {"offset": "1"}):
        with pytest.raises(InvalidDefinition) as raised:
            scheduler.executions.list_unknown(**bad)
        assert set(raised.value.errors) == set(bad)


# -- REST --------------------------------------------------------------------------------------


@pytest.fixture
def api() -> Any:
    return client_for(make_user("alice", *ALL_PERMISSIONS))


def test_rest_pages_follow_next_and_carry_no_result(journal, api):
    body = api.get(BASE + "executions/?limit=4").json()
    assert [row["sequence"] for row in body["results"]] == sorted(
        (e.sequence for e in journal), reverse=True
    )[:4]
    assert all("result" not in row for row in body["results"])
    rest = api.get(body["next"]).json()
    assert [row["sequence"] for row in rest["results"]] == sorted(e.sequence for e in journal)[:3][::-1]
    assert rest["next"] is None and rest["next_cursor"] is None
    detail = api.get(BASE + f"executions/{journal[4].occurrence_id}/").json()
    assert detail["result"] == {"big": "y"}


def test_rest_filters_and_refusals(journal, api, clock):
    due_after = journal[2].due_at.isoformat().replace("+00:00", "Z")
    body = api.get(BASE + "executions/", {"task_id": "report", "due_after": due_after}).json()
    assert [row["sequence"] for row in body["results"]] == [
        journal[6].sequence,
        journal[4].sequence,
        journal[2].sequence,
    ]
    for query, field in (
        ({"limit": "0"}, "limit"),
        ({"status": "done"}, "status"),
        ({"cursor": "x"}, "cursor"),
        ({"due_before": "yesterday"}, "due_before"),
    ):
        assert_error(api.get(BASE + "executions/", query), 400, "scheduler:012", {field})


def test_rest_operator_lists_by_limit_and_offset(journal, api):
    Execution.objects.update(status=Status.UNKNOWN)
    body = api.get(BASE + "executions/unknown/?limit=3").json()
    assert body["count"] == 7 and len(body["results"]) == 3 and body["previous"] is None
    assert all("result" not in row for row in body["results"])
    last: Any = api.get(BASE + "executions/unknown/?limit=3&offset=6").json()
    assert len(last["results"]) == 1 and last["next"] is None and "offset=3" in last["previous"]
    middle = api.get(body["next"]).json()
    assert [row["sequence"] for row in middle["results"]] == [
        row.sequence for row in scheduler.executions.list_unknown(limit=3, offset=3)
    ]
    assert_error(api.get(BASE + "executions/unknown/?limit=101"), 400, "scheduler:012", {"limit"})
    assert_error(api.get(BASE + "executions/log-failures/?offset=-1"), 400, "scheduler:012", {"offset"})


def test_rest_runners_with_their_state(api):
    from scheduler_app import db
    from tests.test_commands import runner_record

    now = db.probe().now
    runner_record("up", now, now + timedelta(minutes=1))
    runner_record("dead", now, now - timedelta(seconds=1))
    runner_record("done", now, now, stopped=now)
    body = api.get(BASE + "runners/").json()
    assert [(row["node_id"], row["state"]) for row in body] == [
        ("dead", "silent"),
        ("done", "stopped"),
        ("up", "alive"),
    ]
