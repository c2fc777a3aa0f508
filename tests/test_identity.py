"""Occurrence and log ids: the formulas of docs/concepts.md, "Occurrence identity"."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduler_app import scheduler
from scheduler_app.models import (
    OCCURRENCE_NAMESPACE,
    log_id,
    manual_occurrence_id,
    missed_occurrence_id,
    scheduled_occurrence_id,
)
from tests.factories import T0, definition

MINUTE = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)
LOW_80 = (1 << 80) - 1


def milliseconds(instant: datetime) -> int:
    return (
        int((instant - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1000 + instant.microsecond // 1000
    )


def as_documented(prefix: int, name_uuid: uuid.UUID) -> uuid.UUID:
    """The first 48 bits ``prefix``, then the last 80 bits of ``name_uuid`` with the version set to 7
    (a uuid5's variant is RFC 4122's already)."""
    return uuid.UUID(int=prefix << 80 | (name_uuid.int & LOW_80 & ~(0xF << 76)) | 7 << 76)


def test_a_scheduled_id_is_its_fire_time_then_the_uuid5_of_task_and_minute():
    made = scheduled_occurrence_id("report", MINUTE)
    named = uuid.uuid5(OCCURRENCE_NAMESPACE, "report|2026-12-07T09:30Z")
    assert made == as_documented(milliseconds(MINUTE), named)
    assert (made.version, made.variant) == (7, uuid.RFC_4122)
    # The same on every node: the same task and minute, in any timezone.
    assert scheduled_occurrence_id("report", MINUTE.astimezone(ZoneInfo("Europe/Berlin"))) == made


def test_the_ids_of_a_minute_are_neighbours_and_those_of_the_next_minute_come_after():
    tasks = [f"task-{n}" for n in range(200)]
    this = [scheduled_occurrence_id(task, MINUTE) for task in tasks]
    following = [scheduled_occurrence_id(task, MINUTE + timedelta(minutes=1)) for task in tasks]
    assert len(set(this)) == len(tasks)
    assert {made.int >> 80 for made in this} == {milliseconds(MINUTE)}
    assert max(made.int for made in this) < min(made.int for made in following)


def test_a_run_at_off_the_minute_and_a_misfire_record_have_ids_of_their_own():
    off = MINUTE + timedelta(seconds=40, microseconds=250_000)
    assert scheduled_occurrence_id("report", off) == as_documented(
        milliseconds(off), uuid.uuid5(OCCURRENCE_NAMESPACE, "report|2026-12-07T09:30:40.250000Z")
    )
    missed = missed_occurrence_id("report", MINUTE)
    assert missed == as_documented(
        milliseconds(MINUTE), uuid.uuid5(OCCURRENCE_NAMESPACE, "report|missed|2026-12-07T09:30Z")
    )
    assert (
        len({scheduled_occurrence_id("report", MINUTE), missed, scheduled_occurrence_id("report", off)}) == 3
    )


def test_a_keyed_trigger_s_id_is_the_uuid5_of_task_and_key_whenever_it_comes():
    assert manual_occurrence_id("report", "2026-10") == uuid.uuid5(
        OCCURRENCE_NAMESPACE, "report|manual|2026-10"
    )


def test_a_keyless_trigger_s_id_is_a_uuid7_of_its_creation():
    before = time.time_ns() // 1_000_000
    made = [manual_occurrence_id("report", None) for _ in range(100)]
    after = time.time_ns() // 1_000_000
    assert manual_occurrence_id("report", None, MINUTE).int >> 80 == milliseconds(MINUTE)
    assert len(set(made)) == 100
    assert all((one.version, one.variant) == (7, uuid.RFC_4122) for one in made)
    assert all(before <= one.int >> 80 <= after for one in made)


def test_a_log_id_begins_as_its_occurrence_id_then_is_the_uuid5_of_occurrence_and_attempt():
    for occurrence in (
        scheduled_occurrence_id("report", MINUTE),
        manual_occurrence_id("report", None, MINUTE),
        manual_occurrence_id("report", "2026-10"),
    ):
        assert log_id(occurrence, 2) == as_documented(occurrence.int >> 80, uuid.uuid5(occurrence, "2"))
        assert len({occurrence, log_id(occurrence, 0), log_id(occurrence, 1), log_id(occurrence, 2)}) == 4


@pytest.mark.django_db
def test_the_executions_of_keyless_triggers_take_ids_of_their_creation(clock):
    scheduler.register(definition())
    first = scheduler.trigger("report")
    clock.advance(1)
    made = scheduler.trigger_many("report", [{} for _ in range(5)])
    clock.advance(1)
    last = scheduler.trigger("report")
    executions = [first, *made, last]
    assert all(execution.occurrence_id.version == 7 for execution in executions)
    assert [execution.occurrence_id.int >> 80 for execution in executions] == [
        milliseconds(execution.created_at) for execution in executions
    ]
    assert [execution.occurrence_id.int >> 80 for execution in executions] == [milliseconds(T0)] + [
        milliseconds(T0 + timedelta(seconds=1))
    ] * 5 + [milliseconds(T0 + timedelta(seconds=2))]
