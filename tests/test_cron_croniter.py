"""scheduler_app.cron agrees with croniter away from daylight saving time changes.

croniter is a development-only requirement; near DST changes the two differ on purpose
(bench/croniter_compare.py prints the cases, docs/concepts.md explains them). Runs on the
SQLite pass only (``SCHEDULER_TEST_DB`` sqlite or unset): it touches no database.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_app import cron

pytestmark = pytest.mark.skipif(
    os.environ.get("SCHEDULER_TEST_DB", "sqlite") not in ("", "sqlite"),
    reason="a pure cron cross-check: once per CI run, on the SQLite pass",
)

croniter = pytest.importorskip("croniter").croniter

FIRES = 20
FAR = timedelta(days=2)
NO_DST = ("UTC", "Asia/Tokyo")
WITH_DST = ("Europe/Berlin", "America/New_York")
STARTS = (datetime(2025, 5, 17, 13, 7), datetime(2027, 12, 31, 23, 59), datetime(2028, 2, 28, 0, 0))
# Mid-January and mid-July: weeks from the nearest transition in both zones.
FAR_STARTS = (datetime(2026, 1, 14, 10, 3), datetime(2026, 7, 15, 22, 45), datetime(2027, 1, 16, 0, 0))

EXPRESSIONS = (
    "* * * * *",
    "*/5 * * * *",
    "*/7 */3 * * *",
    "5,10-20/3 * * * *",
    "59 23 * * *",
    "0 2 * * *",
    "30 1 * * 1-5",
    "0 9-17 * * mon-fri",
    "1-5/2 3 * * *",
    "0 0 1 * *",
    "15 4 1,15 * *",
    "0 0 31 * *",
    "0 0 29 2 *",
    "0 0 */10 * *",
    "0 0 * jan,jul *",
    "0 12 * * 0",
    "0 12 * * 7",
    "0 12 * * 5-7",
    "0 0 * * sun",
    "0 0 * * */2",
    # Both day fields restricted: either may match, in both evaluators.
    "0 0 13 * 5",
    "0 0 1-7 * 1",
    "30 6 1,15 * mon",
    # Not here: one day field a step over '*' ("*/2") and the other restricted, such as
    # "0 0 */2 * 5". Vixie cron, and scheduler_app.cron, treat a field that starts with '*'
    # as unrestricted, so both day fields must match (odd-day Fridays); croniter counts
    # "*/2" as restricted and fires when either matches (every odd day and every Friday).
)


@cache
def transitions(zone: str, year: int) -> tuple[datetime, ...]:
    """Return the UTC instants of the offset changes of ``zone`` in ``year``, to the hour."""
    tz, day = ZoneInfo(zone), datetime(year, 1, 1, tzinfo=UTC)
    found, offset = [], day.astimezone(tz).utcoffset()
    while day.year == year:
        day += timedelta(days=1)
        if day.astimezone(tz).utcoffset() == offset:
            continue
        # Changed within the last day (no zone here changes twice in a day): find the hour.
        moment = day - timedelta(days=1)
        while moment.astimezone(tz).utcoffset() == offset:
            moment += timedelta(hours=1)
        found.append(moment)
        offset = moment.astimezone(tz).utcoffset()
    return tuple(found)


def far_from_transitions(zone: str, instant: datetime) -> bool:
    """Tell whether no offset change of ``zone`` lies within two days of ``instant``."""
    years = range(instant.year - 1, instant.year + 2)
    return all(abs(change - instant) > FAR for year in years for change in transitions(zone, year))


def ours(expression: str, zone: str, start: datetime) -> list[datetime]:
    """Chain next_fire_time from ``start`` (aware) for the next FIRES fire times."""
    found, moment = [], start
    for _ in range(FIRES):
        moment = cron.next_fire_time(expression, zone, moment)
        found.append(moment)
    return found


def theirs(expression: str, zone: str, start: datetime) -> list[datetime]:
    """Chain croniter's get_next from ``start`` (aware) for the next FIRES fire times, in UTC."""
    iterator = croniter(expression, start)
    return [iterator.get_next(datetime).astimezone(UTC) for _ in range(FIRES)]


@pytest.mark.parametrize("zone", NO_DST)
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_the_next_20_fire_times_match_croniter_in_zones_without_dst(expression: str, zone: str) -> None:
    """In UTC and Asia/Tokyo the next 20 fire times are croniter's, from several starts."""
    for start in STARTS:
        aware = start.replace(tzinfo=ZoneInfo(zone))
        assert ours(expression, zone, aware) == theirs(expression, zone, aware), start


@pytest.mark.parametrize("zone", WITH_DST)
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_fire_times_far_from_dst_changes_match_croniter(expression: str, zone: str) -> None:
    """In Berlin and New York each of 20 steps agrees with croniter when it lies two days from any change."""
    compared = 0
    for start in FAR_STARTS:
        moment = start.replace(tzinfo=ZoneInfo(zone))
        for _ in range(FIRES):
            expected = cron.next_fire_time(expression, zone, moment)
            # Each step asks croniter afresh from the same instant, so a step near a change
            # (skipped here) does not shift the ones after it.
            if far_from_transitions(zone, moment) and far_from_transitions(zone, expected):
                found = croniter(expression, moment.astimezone(ZoneInfo(zone))).get_next(datetime)
                assert found.astimezone(UTC) == expected, (start, moment)
                compared += 1
            moment = expected
    assert compared >= FIRES


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    """Draw one simple field: ``*``, ``N``, ``N-M``, ``*/S``, ``N-M/S`` or a short list."""
    number = st.integers(low, high)
    single = number.map(str)
    # Ranges have two different ends: croniter 7.0 reads "N-N" (and "N-N/S") as '*' in
    # every field, so "0-0 * * * *" fires every minute there and every hour here.
    ends = st.tuples(number, number).filter(lambda pair: pair[0] != pair[1])
    span = ends.map(lambda pair: f"{min(pair)}-{max(pair)}")
    step = st.integers(1, high).map(str)
    return st.one_of(
        st.just("*"),
        single,
        span,
        step.map(lambda value: f"*/{value}"),
        st.tuples(span, step).map(lambda pair: f"{pair[0]}/{pair[1]}"),
        st.lists(single, min_size=2, max_size=4).map(",".join),
    )


@st.composite
def simple_expressions(draw: st.DrawFn) -> str:
    """Draw an expression with free minute, hour and month fields and at most one restricted day field."""
    # A restricted day of month with a '*'-led day of week (or the reverse) would put the
    # known "*/S" difference (see EXPRESSIONS) back in; '*' beside it keeps the AND rule plain.
    day, weekday = draw(
        st.one_of(
            st.tuples(st.just("*"), st.just("*")),
            st.tuples(_field(1, 28), st.just("*")),
            st.tuples(st.just("*"), _field(0, 6)),
        )
    )
    return " ".join((draw(_field(0, 59)), draw(_field(0, 23)), day, draw(_field(1, 12)), weekday))


@settings(max_examples=100, deadline=None)
@given(
    expression=simple_expressions(),
    zone=st.sampled_from(NO_DST),
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2060, 1, 1)),
)
def test_generated_expressions_match_croniter_in_zones_without_dst(
    expression: str, zone: str, start: datetime
) -> None:
    """Generated simple expressions give croniter's next 20 fire times in UTC and Asia/Tokyo."""
    aware = start.replace(tzinfo=ZoneInfo(zone))
    assert ours(expression, zone, aware) == theirs(expression, zone, aware)
