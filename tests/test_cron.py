"""Tests of scheduler_app.cron: examples written out by hand and properties against a brute-force oracle."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler_app import cron
from scheduler_app.exceptions import InvalidCron

pytestmark: list[pytest.MarkDecorator] = []

NY = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"
KOLKATA = "Asia/Kolkata"
SANTIAGO = "America/Santiago"
# Samoa skipped 30 December 2011 whole (a 24-hour jump); Casey jumped exactly 3 hours each October
# from 2016 to 2022, the length at which a fixed time in the gap is skipped rather than caught up.
APIA = "Pacific/Apia"
CASEY = "Antarctica/Casey"
ZONES = ("", "UTC", NY, LONDON, LORD_HOWE, KOLKATA, SANTIAGO, APIA, CASEY)
MINUTE = timedelta(minutes=1)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    """Build an aware UTC datetime."""
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(expression: str, zone: str, after: datetime, until: datetime) -> list[datetime]:
    """Chain next_fire_time from ``after`` while the result is not past ``until``."""
    found: list[datetime] = []
    moment = cron.next_fire_time(expression, zone, after)
    while moment <= until:
        found.append(moment)
        moment = cron.next_fire_time(expression, zone, moment)
        assert moment > found[-1]
    return found


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "* * * *",
        "0 * * * * *",
        "0 0 * * * 2026",
        "@reboot",
        "@fortnightly",
        "@daily 0",
        "0\u00a00 * * *",
        "0\u30000 * * *",
        "0\u00850 * * *",
        "0\u20280 * * *",
        "0\x0b0 * * *",
        "0\x0c0 * * *",
        "0 0 * * *\n",
        "0 0 * * L",
        "0 0 L/2 * *",
        "0 0 L-1-3 * *",
        "0 0 L-31 * *",
        "0 0 1-5W * *",
        "0 0 30W 2 *",
        "0 0 L-30 2 *",
        "0 0 * * 1#0",
        "0 0 * * 1#6",
        "0 0 * * 8#1",
        "0 0 * * 1-2L",
        "0 L * * *",
        "0 0 * L *",
        "L * * * *",
        "0 0 * 1#2 *",
        "0 0 W * *",
        "0 0 ?? * *",
        "0 0 ?,1 * *",
        "61 * * * *",
        "-1 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 13 *",
        "* * * 0 *",
        "* * * * 8",
        "0 0 31 2 *",
        "0 0 30 2 *",
        "0 0 31 4,6,9,11 *",
        "0 0 30,31 feb *",
        "0 0 31 2 */7",
        "garbage",
        "a b c d e",
        "*/0 * * * *",
        "*/60 * * * *",
        "5/15 * * * *",
        "10-5 * * * *",
        "1,,2 * * * *",
        "1, * * * *",
        "? * * * *",
        "0 0 * ? *",
        "0 0 */20 * 1#2",
        "0 0 */31 * 5L",
        "0 0 1W * */6",
        "0 0 * * fri-mon",
        "0 0 * * monday",
        "0 0 * january *",
        "0 0 * * \uff15",
        "0 0 1-31/x * *",
        "99999999999999999999 * * * *",
    ],
)
def test_validate_refuses(expression: str) -> None:
    with pytest.raises(InvalidCron) as caught:
        cron.validate(expression, "UTC")
    assert caught.value.errors["cron"]
    assert "timezone" not in caught.value.errors
    assert str(caught.value)


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 29 2 *",
        "*/5 * * * *",
        "0 9 * * mon-fri",
        "0 9 * * MON-Fri",
        "0 0 * * 7",
        "0 0 * * 0",
        "0 0 * * 5-7",
        "0 0 31 2 1",
        "* * * * *",
        "0-59/15 0-23/2 1-31 1-12 0-7",
        "5,10,15 1,2 1 jan,jul *",
        "  0   2  *  * *  ",
        "0\t2 * * *",
        "00 02 01 01 *",
        "*/59 */23 */31 */12 */7",
        "@yearly",
        "@ANNUALLY",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "  @hourly\t",
        "0 0 ? * mon",
        "0 0 1 * ?",
        "0 0 L * *",
        "0 0 l-3 * *",
        "0 0 L-30 * *",
        "0 0 15W * *",
        "0 0 1w,LW * *",
        "0 0 1,15,L * *",
        "0 0 * * 5L",
        "0 0 * * friL",
        "0 0 * * 1#2,fri#5",
        "0 0 * * 7#1",
        "0 0 * * mon-wed",
        "0 0 31W 2 1",
    ],
)
def test_validate_accepts(expression: str) -> None:
    cron.validate(expression, NY)


@pytest.mark.parametrize(
    "zone", ["Mars/Base", "../etc", "/etc/passwd", "europe/london", "localtime", "UTC ", "x" * 500]
)
def test_validate_refuses_unknown_timezone(zone: str) -> None:
    with pytest.raises(InvalidCron) as caught:
        cron.validate("0 0 * * *", zone)
    assert list(caught.value.errors) == ["timezone"]


@pytest.mark.parametrize("zone", ["", "UTC", NY, LORD_HOWE, KOLKATA, SANTIAGO, "Etc/GMT+5"])
def test_validate_accepts_known_timezone(zone: str) -> None:
    cron.validate("0 0 * * *", zone)


def test_validate_reports_both_fields() -> None:
    with pytest.raises(InvalidCron) as caught:
        cron.validate("61 * * * *", "Mars/Base")
    assert set(caught.value.errors) == {"cron", "timezone"}


@pytest.mark.parametrize(
    ("expression", "zone"),
    [
        ("1" * 10_000 + " * * * *", "UTC"),
        ("x " * 10_000, "UTC"),
        ("@" + "d" * 10_000, "UTC"),
        ("* * * * *", "Z" * 10_000),
        ("0 0 * * " + "m" * 10_000, "UTC"),
    ],
)
def test_messages_never_echo_huge_input(expression: str, zone: str) -> None:
    with pytest.raises(InvalidCron) as caught:
        cron.validate(expression, zone)
    assert len(str(caught.value)) < 400
    for messages in caught.value.errors.values():
        assert all(len(message) < 400 for message in messages)


def test_is_fixed_time() -> None:
    assert cron.is_fixed_time("30 2 * * *")
    assert cron.is_fixed_time("0,30 1-3 * * *")
    assert cron.is_fixed_time("0-59 0-23 * * *")
    assert not cron.is_fixed_time("*/5 2 * * *")
    assert not cron.is_fixed_time("0 * * * *")
    assert not cron.is_fixed_time("0 */2 * * *")
    with pytest.raises(InvalidCron):
        cron.is_fixed_time("nope")


def test_refuses_non_strings_and_overlong_input() -> None:
    with pytest.raises(InvalidCron) as caught:
        cron.validate(["0 0 * * *"], "UTC")  # type: ignore[arg-type]
    assert list(caught.value.errors) == ["cron"]
    with pytest.raises(InvalidCron) as caught:
        cron.validate("0 0 * * *", None)  # type: ignore[arg-type]
    assert list(caught.value.errors) == ["timezone"]
    with pytest.raises(InvalidCron):
        cron.validate("0" + ",0" * 600 + " 0 * * *", "UTC")
    cron.validate("0" + ",0" * 400 + " 0 * * *", "UTC")


def test_supported_years() -> None:
    with pytest.raises(ValueError):
        cron.next_fire_time("* * * * *", "UTC", datetime.min.replace(tzinfo=UTC))
    with pytest.raises(ValueError):
        cron.next_fire_time("* * * * *", "UTC", utc(9990, 1, 1))
    assert cron.fire_times("0 0 1 1 *", NY, utc(2026, 1, 1), datetime.max.replace(tzinfo=UTC), limit=2) == [
        utc(2026, 1, 1, 5),
        utc(2027, 1, 1, 5),
    ]


def test_next_fire_time_needs_aware_instant() -> None:
    with pytest.raises(ValueError):
        cron.next_fire_time("* * * * *", "UTC", datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        cron.matches("* * * * *", "UTC", datetime(2026, 1, 1))


def test_next_fire_time_result_shape() -> None:
    after = datetime(2026, 5, 1, 12, 0, 30, 123, tzinfo=ZoneInfo(NY))
    found = cron.next_fire_time("*/5 * * * *", NY, after)
    assert found == utc(2026, 5, 1, 16, 5)
    assert found.tzinfo is UTC
    assert (found.second, found.microsecond) == (0, 0)
    assert cron.next_fire_time("0 * * * *", "", utc(2026, 1, 1, 0, 0)) == utc(2026, 1, 1, 1, 0)
    assert cron.next_fire_time("0 * * * *", "", utc(2026, 1, 1, 0, 0, 59)) == utc(2026, 1, 1, 1, 0)
    assert cron.next_fire_time("0 * * * *", "", utc(2025, 12, 31, 23, 59, 59)) == utc(2026, 1, 1, 0, 0)


# ---------------------------------------------------------------------------
# Calendar rules
# ---------------------------------------------------------------------------


def test_leap_day() -> None:
    assert cron.next_fire_time("0 0 29 2 *", "UTC", utc(2026, 1, 1)) == utc(2028, 2, 29)
    assert cron.next_fire_time("0 0 29 2 *", "UTC", utc(2096, 3, 1)) == utc(2104, 2, 29)


def test_rare_expression_is_found_decades_ahead() -> None:
    # 29 February on a Sunday; 2100 is not a leap year.
    assert cron.next_fire_time("0 0 29 2 */7", "UTC", utc(2089, 1, 1)) == utc(2128, 2, 29)
    assert cron.next_fire_time("0 0 29 2 */7", NY, utc(2033, 1, 1)) == utc(2060, 2, 29, 5)


def test_day_rules_or_when_both_restricted() -> None:
    # 13th of every month or any Friday.
    found = fires("0 0 13 * 5", "UTC", utc(2026, 3, 1), utc(2026, 3, 31))
    assert [moment.day for moment in found] == [6, 13, 20, 27]
    found = fires("0 0 13 * 5", "UTC", utc(2026, 4, 1), utc(2026, 4, 30))
    assert [moment.day for moment in found] == [3, 10, 13, 17, 24]


def test_day_rules_and_when_one_starts_with_star() -> None:
    # Odd days that are Fridays.
    found = fires("0 0 */2 * 5", "UTC", utc(2026, 3, 1), utc(2026, 4, 30))
    assert [(moment.month, moment.day) for moment in found] == [(3, 13), (3, 27), (4, 3), (4, 17)]
    # Day-of-week wildcard: only the day of month counts.
    assert [m.day for m in fires("0 0 13 * *", "UTC", utc(2026, 3, 1), utc(2026, 3, 31))] == [13]


def test_sunday_is_0_and_7() -> None:
    sundays = fires("0 12 * * 0", "UTC", utc(2026, 3, 1), utc(2026, 3, 31))
    assert sundays == fires("0 12 * * 7", "UTC", utc(2026, 3, 1), utc(2026, 3, 31))
    assert sundays == fires("0 12 * * sun", "UTC", utc(2026, 3, 1), utc(2026, 3, 31))
    assert [moment.day for moment in sundays] == [1, 8, 15, 22, 29]


def test_month_names() -> None:
    assert cron.next_fire_time("0 0 1 jul-aug *", "UTC", utc(2026, 1, 1)) == utc(2026, 7, 1)


# ---------------------------------------------------------------------------
# Daylight saving time, written out by hand
# ---------------------------------------------------------------------------


def test_new_york_spring_forward() -> None:
    # 2026-03-08 02:00 EST jumps to 03:00 EDT at 07:00Z.
    assert fires("30 2 * * *", NY, utc(2026, 3, 7), utc(2026, 3, 10)) == [
        utc(2026, 3, 7, 7, 30),
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 9, 6, 30),
    ]
    assert fires("0,30 2,3 * * *", NY, utc(2026, 3, 8, 6), utc(2026, 3, 8, 8)) == [
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 8, 7, 30),
    ]
    # 02:00, 02:30 and 03:00 all land on 07:00Z: one fire.
    assert cron.fire_times("0,30 2,3 * * *", NY, utc(2026, 3, 8, 6), utc(2026, 3, 8, 8)) == [
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 8, 7, 30),
    ]
    assert cron.count_fire_times("0,30 2,3 * * *", NY, utc(2026, 3, 8, 6), utc(2026, 3, 8, 8)) == 2
    # Wildcard expressions skip the gap.
    assert fires("*/30 * * * *", NY, utc(2026, 3, 8, 6), utc(2026, 3, 8, 8)) == [
        utc(2026, 3, 8, 6, 30),
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 8, 7, 30),
        utc(2026, 3, 8, 8, 0),
    ]
    assert fires("*/10 2 * * *", NY, utc(2026, 3, 7), utc(2026, 3, 9)) == [
        utc(2026, 3, 7, 7, minute) for minute in range(0, 60, 10)
    ]


def test_new_york_fall_back() -> None:
    # 2026-11-01 02:00 EDT falls back to 01:00 EST at 06:00Z.
    assert fires("30 1 * * *", NY, utc(2026, 10, 31), utc(2026, 11, 3)) == [
        utc(2026, 10, 31, 5, 30),
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 2, 6, 30),
    ]
    assert fires("*/30 * * * *", NY, utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 6, 45)) == [
        utc(2026, 11, 1, 5, 0),
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 1, 6, 0),
        utc(2026, 11, 1, 6, 30),
    ]
    assert fires("0 * * * *", NY, utc(2026, 11, 1, 3, 30), utc(2026, 11, 1, 7, 30)) == [
        utc(2026, 11, 1, 4),
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 6),
        utc(2026, 11, 1, 7),
    ]
    assert fires("0 1 * * *", NY, utc(2026, 11, 1), utc(2026, 11, 2)) == [utc(2026, 11, 1, 5)]


def test_lord_howe_half_hour_shift() -> None:
    # 2026-04-05 02:00 +11 falls back to 01:30 +10:30 at 2026-04-04 15:00Z.
    assert fires("45 1 * * *", LORD_HOWE, utc(2026, 4, 4, 12), utc(2026, 4, 5, 12)) == [
        utc(2026, 4, 4, 14, 45)
    ]
    assert fires("*/15 * * * *", LORD_HOWE, utc(2026, 4, 4, 13, 59), utc(2026, 4, 4, 16)) == [
        utc(2026, 4, 4, 14) + timedelta(minutes=15 * step) for step in range(9)
    ]
    assert fires("0 * * * *", LORD_HOWE, utc(2026, 4, 4, 13, 30), utc(2026, 4, 4, 16, 30)) == [
        utc(2026, 4, 4, 14, 0),
        utc(2026, 4, 4, 15, 30),
        utc(2026, 4, 4, 16, 30),
    ]
    # 2026-10-04 02:00 +10:30 jumps to 02:30 +11 at 2026-10-03 15:30Z.
    assert fires("15 2 * * *", LORD_HOWE, utc(2026, 10, 2), utc(2026, 10, 5)) == [
        utc(2026, 10, 2, 15, 45),
        utc(2026, 10, 3, 15, 30),
        utc(2026, 10, 4, 15, 15),
    ]
    assert fires("0 * * * *", LORD_HOWE, utc(2026, 10, 3, 14), utc(2026, 10, 3, 16)) == [
        utc(2026, 10, 3, 14, 30),
        utc(2026, 10, 3, 16, 0),
    ]


def test_santiago_midnight_transitions() -> None:
    # 2026-09-06 00:00 -04 jumps to 01:00 -03 at 04:00Z: that day starts at 01:00.
    assert fires("0 0 * * *", SANTIAGO, utc(2026, 9, 4), utc(2026, 9, 8)) == [
        utc(2026, 9, 4, 4),
        utc(2026, 9, 5, 4),
        utc(2026, 9, 6, 4),
        utc(2026, 9, 7, 3),
    ]
    assert fires("*/20 0 * * *", SANTIAGO, utc(2026, 9, 5), utc(2026, 9, 7, 12)) == [
        utc(2026, 9, 5, 4, 0),
        utc(2026, 9, 5, 4, 20),
        utc(2026, 9, 5, 4, 40),
        utc(2026, 9, 7, 3, 0),
        utc(2026, 9, 7, 3, 20),
        utc(2026, 9, 7, 3, 40),
    ]
    # 2026-04-05 00:00 -03 falls back to 2026-04-04 23:00 -04 at 03:00Z.
    assert fires("30 23 * * *", SANTIAGO, utc(2026, 4, 4), utc(2026, 4, 7)) == [
        utc(2026, 4, 4, 2, 30),
        utc(2026, 4, 5, 2, 30),
        utc(2026, 4, 6, 3, 30),
    ]
    assert fires("30 * * * *", SANTIAGO, utc(2026, 4, 5, 2), utc(2026, 4, 5, 5)) == [
        utc(2026, 4, 5, 2, 30),
        utc(2026, 4, 5, 3, 30),
        utc(2026, 4, 5, 4, 30),
    ]


def test_kolkata_and_utc() -> None:
    assert fires("0 9 * * *", KOLKATA, utc(2026, 3, 1), utc(2026, 3, 3)) == [
        utc(2026, 3, 1, 3, 30),
        utc(2026, 3, 2, 3, 30),
    ]
    assert fires("0 9 * * *", "", utc(2026, 3, 1), utc(2026, 3, 3)) == [
        utc(2026, 3, 1, 9),
        utc(2026, 3, 2, 9),
    ]


def test_matches_examples() -> None:
    assert cron.matches("30 2 * * *", NY, utc(2026, 3, 8, 7, 0))
    assert not cron.matches("30 2 * * *", NY, utc(2026, 3, 8, 7, 30))
    assert cron.matches("0 * * * *", NY, utc(2026, 11, 1, 6, 0))
    assert not cron.matches("0 1 * * *", NY, utc(2026, 11, 1, 6, 0))
    assert not cron.matches("* * * * *", "UTC", utc(2026, 1, 1, 0, 0, 30))


def test_fire_times_and_count() -> None:
    assert cron.fire_times("0 * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 1, 3)) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
        utc(2026, 1, 1, 3),
    ]
    assert cron.fire_times("0 * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 1, 3), limit=2) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]
    assert cron.fire_times("0 * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 1, 3), limit=0) == []
    assert cron.fire_times("0 * * * *", "UTC", utc(2026, 1, 2), utc(2026, 1, 1)) == []
    assert cron.count_fire_times("0 * * * *", "UTC", utc(2026, 1, 2), utc(2026, 1, 1)) == 0
    with pytest.raises(ValueError):
        cron.fire_times("0 * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 2), limit=-1)


@pytest.mark.parametrize(
    ("zone", "after", "until", "expected"),
    [
        ("UTC", utc(2026, 3, 1), utc(2026, 4, 1), 31 * 1440),
        (NY, utc(2026, 3, 1, 5), utc(2026, 4, 1, 4), 31 * 1440 - 60),
        (NY, utc(2026, 11, 1, 4), utc(2026, 12, 1, 5), 30 * 1440 + 60),
        (LORD_HOWE, utc(2026, 9, 30, 13, 30), utc(2026, 10, 31, 13), 31 * 1440 - 30),
    ],
)
def test_count_every_minute_for_a_month(zone: str, after: datetime, until: datetime, expected: int) -> None:
    assert cron.count_fire_times("* * * * *", zone, after, until) == expected


# ---------------------------------------------------------------------------
# Brute-force oracle
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """A generated expression: its text and the value sets its fields mean."""

    texts: tuple[str, str, str, str, str]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_specials: tuple[str, ...] = ()  # L, L-N, NW, LW
    weekday_specials: tuple[str, ...] = ()  # NL, N#K

    @property
    def text(self) -> str:
        """Return the expression as one string."""
        return " ".join(self.texts)

    @property
    def fixed(self) -> bool:
        """Tell whether neither minute nor hour starts with a star."""
        return not self.texts[0].startswith("*") and not self.texts[1].startswith("*")

    @property
    def either_day(self) -> bool:
        """Tell whether the day fields combine with OR."""
        return not self.texts[2].startswith(("*", "?")) and not self.texts[4].startswith(("*", "?"))

    def fires_ever(self) -> bool:
        """Tell whether some calendar date satisfies the day and month fields."""
        if self.either_day:
            return True
        longest = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
        for month in self.months:
            if any(day <= longest[month] for day in self.days):
                return True
            for token in self.day_specials:
                if token in ("L", "LW"):
                    return True
                if token.startswith("L-") and longest[month] - int(token[2:]) >= 1:
                    return True
                if token.endswith("W") and int(token[:-1]) <= longest[month]:
                    return True
        return False

    def matches_wall(self, wall: datetime) -> bool:
        """Tell whether a naive wall-clock minute satisfies every field."""
        if wall.minute not in self.minutes or wall.hour not in self.hours or wall.month not in self.months:
            return False
        day = wall.date()
        day_ok = wall.day in self.days or any(special_day(token, day) for token in self.day_specials)
        weekday_ok = (wall.isoweekday() % 7) in self.weekdays or any(
            special_weekday(token, day) for token in self.weekday_specials
        )
        return (day_ok or weekday_ok) if self.either_day else (day_ok and weekday_ok)


def special_day(token: str, day: date) -> bool:
    """Whether a day-of-month token with L or W selects ``day``, found by looking at the whole month."""
    length = calendar.monthrange(day.year, day.month)[1]
    if token == "L":
        return day.day == length
    if token.startswith("L-"):
        return day.day == length - int(token[2:])
    target = length if token == "LW" else int(token[:-1])
    if target > length:
        return False
    weekdays = [number for number in range(1, length + 1) if date(day.year, day.month, number).weekday() < 5]
    return day.day == min(weekdays, key=lambda number: abs(number - target))


def special_weekday(token: str, day: date) -> bool:
    """Whether a day-of-week token NL or N#K selects ``day``."""
    length = calendar.monthrange(day.year, day.month)[1]
    if "#" in token:
        weekday, week = token.split("#")
        count = sum(
            1
            for number in range(1, day.day + 1)
            if date(day.year, day.month, number).isoweekday() % 7 == int(weekday) % 7
        )
        return day.isoweekday() % 7 == int(weekday) % 7 and count == int(week)
    weekday = int(token[:-1]) % 7
    later = [
        number
        for number in range(day.day + 1, length + 1)
        if date(day.year, day.month, number).isoweekday() % 7 == weekday
    ]
    return day.isoweekday() % 7 == weekday and not later


def zone_of(key: str) -> ZoneInfo:
    """Return the ZoneInfo of a key, UTC for the empty key."""
    return ZoneInfo(key or "UTC")


def wall_of(moment: datetime, zone: ZoneInfo) -> datetime:
    """Return the naive wall-clock time of an instant."""
    return moment.astimezone(zone).replace(tzinfo=None)


def instant_of_wall(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """Map a wall time to the instant a fixed-time expression fires at; None when it is skipped."""
    candidate = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if wall_of(candidate, zone) == wall:
        return candidate  # exists; fold=0 is the first pass when ambiguous
    # In a gap: the first instant whose wall time is at or after this wall time, when the clock
    # jumped less than 3 hours; a longer jump skips it (Vixie cron's catch-up limit).
    moment = candidate - timedelta(hours=30)
    while wall_of(moment, zone) < wall:
        moment += MINUTE
    jump = wall_of(moment, zone) - wall_of(moment - MINUTE, zone) - MINUTE
    return moment if jump < timedelta(hours=3) else None


def oracle(expr: Expr, key: str, after: datetime, window: timedelta) -> list[datetime]:
    """Return every fire time in (after, after + window] by walking minutes one by one."""
    zone = zone_of(key)
    after = after.astimezone(UTC)
    start = after.replace(second=0, microsecond=0) + MINUTE
    end = after + window
    if not expr.fixed:
        found = []
        moment = start
        while moment <= end:
            if expr.matches_wall(wall_of(moment, zone)):
                found.append(moment)
            moment += MINUTE
        return found
    instants: set[datetime] = set()
    wall = wall_of(start, zone) - timedelta(days=1)
    wall_end = wall_of(end, zone) + timedelta(days=1)
    while wall <= wall_end:
        if expr.matches_wall(wall):
            moment = instant_of_wall(wall, zone)
            if moment is not None and after < moment <= end:
                instants.add(moment)
        wall += MINUTE
    return sorted(instants)


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------


MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@st.composite
def field(
    draw: st.DrawFn, low: int, high: int, names: tuple[str, ...] = (), star_weight: int = 2
) -> tuple[str, frozenset[int]]:
    """Draw one field's text together with the set of values it means."""

    def render(value: int) -> str:
        if names and value - low < len(names) and draw(st.booleans()):
            name = names[value - low]
            return draw(st.sampled_from((name, name.upper(), name.capitalize())))
        return str(value)

    parts: list[str] = []
    values: set[int] = set()
    for index in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 3 + star_weight))
        if kind >= 4 and index == 0:
            step = draw(st.integers(1, high)) if kind == 5 else 1
            parts.append("*" if step == 1 and draw(st.booleans()) else f"*/{step}")
            values.update(range(low, high + 1, step))
            continue
        first = draw(st.integers(low, high))
        if kind <= 1 or kind >= 4:
            parts.append(render(first))
            values.add(first)
            continue
        last = draw(st.integers(first, high))
        if kind == 2:
            parts.append(f"{render(first)}-{render(last)}")
            values.update(range(first, last + 1))
        else:
            step = draw(st.integers(1, high))
            parts.append(f"{render(first)}-{render(last)}/{step}")
            values.update(range(first, last + 1, step))
    return ",".join(parts), frozenset(values)


@st.composite
def expressions(draw: st.DrawFn, focus: tuple[int, ...] = ()) -> Expr:
    """Draw an expression that fires on some date, biased towards frequent fires and ``focus`` hours."""
    minute_text, minutes = draw(field(0, 59))
    if len(focus) > 0 and draw(st.booleans()):
        picked = sorted(draw(st.sets(st.sampled_from(focus), min_size=1)))
        if len(picked) > 1 and draw(st.booleans()):
            hour_text, hours = f"{picked[0]}-{picked[-1]}", frozenset(range(picked[0], picked[-1] + 1))
        else:
            hour_text, hours = ",".join(map(str, picked)), frozenset(picked)
    else:
        hour_text, hours = draw(field(0, 23))
    day_specials: tuple[str, ...] = ()
    weekday_specials: tuple[str, ...] = ()
    if draw(st.integers(0, 9)) < 6:
        day_text, days = draw(st.sampled_from(("*", "*", "*", "?"))), frozenset(range(1, 32))
    else:
        day_text, days = draw(field(1, 31, star_weight=1))
        if draw(st.integers(0, 2)) == 0:
            picked = draw(
                st.lists(
                    st.sampled_from(("L", "LW"))
                    | st.integers(0, 30).map(lambda n: f"L-{n}")
                    | st.integers(1, 31).map(lambda n: f"{n}W"),
                    min_size=1,
                    max_size=2,
                )
            )
            day_specials = tuple(picked)
            if draw(st.booleans()) or day_text.startswith("*"):
                day_text, days = ",".join(picked), frozenset()
            else:
                day_text = ",".join([day_text, *picked])
    if draw(st.integers(0, 9)) < 8:
        month_text, months = "*", frozenset(range(1, 13))
    else:
        month_text, months = draw(field(1, 12, MONTH_NAMES))
    if draw(st.integers(0, 9)) < 6:
        weekday_text, weekdays = draw(st.sampled_from(("*", "*", "*", "?"))), frozenset(range(7))
    else:
        weekday_text, raw = draw(field(0, 7, DOW_NAMES, star_weight=1))
        weekdays = frozenset(value % 7 for value in raw)
        if draw(st.integers(0, 2)) == 0:
            picked = draw(
                st.lists(
                    st.integers(0, 7).map(lambda n: f"{n}L")
                    | st.tuples(st.integers(0, 7), st.integers(1, 5)).map(
                        lambda pair: f"{pair[0]}#{pair[1]}"
                    ),
                    min_size=1,
                    max_size=2,
                )
            )
            weekday_specials = tuple(picked)
            if draw(st.booleans()) or weekday_text.startswith("*"):
                weekday_text, weekdays = ",".join(picked), frozenset()
            else:
                weekday_text = ",".join([weekday_text, *picked])
    return Expr(
        (minute_text, hour_text, day_text, month_text, weekday_text),
        minutes,
        hours,
        days,
        months,
        weekdays,
        day_specials,
        weekday_specials,
    )


@cache
def transitions(key: str) -> tuple[datetime, ...]:
    """Return the UTC instants in 2011-2030 where the zone's offset changes, found by scanning."""
    zone = zone_of(key)
    found: list[datetime] = []
    moment = utc(2011, 1, 1)
    offset = moment.astimezone(zone).utcoffset()
    while moment < utc(2031, 1, 1):
        probe = moment + timedelta(hours=2)
        if probe.astimezone(zone).utcoffset() != offset:
            while moment.astimezone(zone).utcoffset() == offset:
                moment += MINUTE
            found.append(moment)
            offset = moment.astimezone(zone).utcoffset()
        else:
            moment = probe
    return tuple(found)


def hours_around(key: str, moment: datetime) -> tuple[int, ...]:
    """Return the wall-clock hours on either side of a transition, gap or repeat included."""
    zone = zone_of(key)
    before = (moment - MINUTE).astimezone(zone).utcoffset()
    after = moment.astimezone(zone).utcoffset()
    assert before is not None and after is not None
    naive = moment.replace(tzinfo=None)
    walls = [naive + offset + shift for offset in (before, after) for shift in (-MINUTE, timedelta(0))]
    return tuple(sorted({wall.hour for wall in walls}))


@st.composite
def cases(draw: st.DrawFn) -> tuple[Expr, str, datetime]:
    """Draw an expression, a zone and an ``after`` instant, often a few hours before a transition."""
    key = draw(st.sampled_from(ZONES))
    near = transitions(key)
    if near and draw(st.integers(0, 9)) < 7:
        transition = draw(st.sampled_from(near))
        earliest = -26 * 60 if draw(st.integers(0, 3)) == 0 else -6 * 60
        after = transition + timedelta(minutes=draw(st.integers(earliest, 60)))
        expr = draw(expressions(hours_around(key, transition)))
    else:
        after = utc(2020, 1, 1) + timedelta(minutes=draw(st.integers(0, 11 * 365 * 1440)))
        expr = draw(expressions())
    if draw(st.booleans()):
        after += timedelta(seconds=draw(st.integers(0, 59)), microseconds=draw(st.integers(0, 999_999)))
    if draw(st.booleans()):
        after = after.astimezone(zone_of(draw(st.sampled_from(ZONES))))
    return expr, key, after


WINDOW = timedelta(days=2)
CHAINED = 8
PROPERTY_SETTINGS = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


@PROPERTY_SETTINGS
@given(expressions())
def test_validate_accepts_exactly_the_firing_expressions(expr: Expr) -> None:
    if expr.fires_ever():
        cron.validate(expr.text, "UTC")
        assert cron.is_fixed_time(expr.text) == expr.fixed
    else:
        with pytest.raises(InvalidCron):
            cron.validate(expr.text, "UTC")


@PROPERTY_SETTINGS
@given(cases())
def test_next_fire_time_agrees_with_oracle(case: tuple[Expr, str, datetime]) -> None:
    expr, key, after = case
    assume(expr.fires_ever())
    expected = oracle(expr, key, after, WINDOW)[:CHAINED]
    found: list[datetime] = []
    moment = after
    for _ in range(len(expected)):
        moment = cron.next_fire_time(expr.text, key, moment)
        found.append(moment)
    assert found == expected
    if len(expected) < CHAINED:
        assert cron.next_fire_time(expr.text, key, moment) > after.astimezone(UTC) + WINDOW
    assert all(moment.tzinfo is UTC for moment in found)


@PROPERTY_SETTINGS
@given(cases())
def test_matches_agrees_with_oracle(case: tuple[Expr, str, datetime]) -> None:
    expr, key, after = case
    assume(expr.fires_ever())
    window = timedelta(hours=3)
    expected = set(oracle(expr, key, after, window))
    moment = after.astimezone(UTC).replace(second=0, microsecond=0) + MINUTE
    while moment <= after.astimezone(UTC) + window:
        assert cron.matches(expr.text, key, moment) == (moment in expected), moment
        moment += MINUTE


@PROPERTY_SETTINGS
@given(cases(), st.integers(0, 2 * 1440), st.none() | st.integers(0, 20))
def test_fire_times_and_count_agree_with_oracle(
    case: tuple[Expr, str, datetime], span: int, limit: int | None
) -> None:
    expr, key, after = case
    assume(expr.fires_ever())
    until = after.astimezone(UTC) + timedelta(minutes=span)
    every = cron.fire_times(expr.text, key, after, until)
    assert every == oracle(expr, key, after, until - after)
    assert all(earlier < later for earlier, later in pairwise(every))
    assert cron.count_fire_times(expr.text, key, after, until) == len(every)
    assert cron.fire_times(expr.text, key, after, until, limit) == every[:limit]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.sampled_from(ZONES) | st.text(max_size=20))
def test_validate_only_ever_raises_invalid_cron(expression: str, key: str) -> None:
    try:
        cron.validate(expression, key)
    except InvalidCron as exc:
        assert exc.errors


# ---------------------------------------------------------------------------
# The fuller dialect: macros, ?, L, W, # and long gaps
# ---------------------------------------------------------------------------


@st.composite
def day_expressions(draw: st.DrawFn) -> Expr:
    """Noon on the days a drawn pair of day fields with L, W and # tokens selects."""
    expr = draw(expressions())
    assume(expr.day_specials or expr.weekday_specials)
    return Expr(("0", "12", *expr.texts[2:]), frozenset({0}), frozenset({12}), *astuple_tail(expr))


def astuple_tail(expr: Expr) -> tuple[Any, ...]:
    return (expr.days, expr.months, expr.weekdays, expr.day_specials, expr.weekday_specials)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(day_expressions(), st.integers(2020, 2040))
def test_day_tokens_select_the_days_a_walk_over_the_calendar_finds(expr: Expr, year: int) -> None:
    assume(expr.fires_ever())
    start = utc(year, 1, 1)
    expected = []
    day = start
    while day < utc(year + 2, 1, 1):
        noon = day.replace(hour=12)
        if expr.matches_wall(noon.replace(tzinfo=None)):
            expected.append(noon)
        day += timedelta(days=1)
    assert cron.fire_times(expr.text, "UTC", start, utc(year + 2, 1, 1) - MINUTE) == expected, expr.text


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("0 0 L * *", utc(2028, 1, 15), [utc(2028, 1, 31), utc(2028, 2, 29), utc(2028, 3, 31)]),
        ("0 0 L-2 * *", utc(2027, 1, 15), [utc(2027, 1, 29), utc(2027, 2, 26), utc(2027, 3, 29)]),
        # 15 Feb 2026 is a Sunday, 15 Aug 2026 a Saturday.
        ("0 0 15W 2,8 *", utc(2026, 1, 1), [utc(2026, 2, 16), utc(2026, 8, 14)]),
        # 1 Aug 2026 is a Saturday: the nearest weekday within the month is Monday the 3rd.
        ("0 0 1W 8 *", utc(2026, 1, 1), [utc(2026, 8, 3)]),
        # 31 May 2026 is a Sunday: the last weekday is Friday the 29th.
        ("0 0 LW 5 *", utc(2026, 1, 1), [utc(2026, 5, 29)]),
        ("0 0 * * 5L", utc(2026, 1, 1), [utc(2026, 1, 30), utc(2026, 2, 27), utc(2026, 3, 27)]),
        ("0 9 ? * 1#2", utc(2026, 1, 1), [utc(2026, 1, 12, 9), utc(2026, 2, 9, 9), utc(2026, 3, 9, 9)]),
        ("0 0 * * sun#5", utc(2026, 1, 1), [utc(2026, 3, 29), utc(2026, 5, 31), utc(2026, 8, 30)]),
        ("@yearly", utc(2026, 6, 1), [utc(2027, 1, 1), utc(2028, 1, 1)]),
        ("@monthly", utc(2026, 6, 1), [utc(2026, 7, 1), utc(2026, 8, 1)]),
        ("@weekly", utc(2026, 6, 1), [utc(2026, 6, 7), utc(2026, 6, 14)]),
        ("@midnight", utc(2026, 6, 1), [utc(2026, 6, 2), utc(2026, 6, 3)]),
        ("@hourly", utc(2026, 6, 1), [utc(2026, 6, 1, 1), utc(2026, 6, 1, 2)]),
    ],
)
def test_dialect_examples(expression: str, after: datetime, expected: list[datetime]) -> None:
    assert cron.fire_times(expression, "UTC", after, expected[-1]) == expected


def test_macros_mean_their_five_fields_and_reboot_says_why_it_is_refused() -> None:
    after = utc(2026, 3, 1)
    for macro, fields in (("@annually", "0 0 1 1 *"), ("@daily", "0 0 * * *"), ("@hourly", "0 * * * *")):
        assert cron.fire_times(macro, NY, after, utc(2028, 1, 1), 30) == cron.fire_times(
            fields, NY, after, utc(2028, 1, 1), 30
        )
    with pytest.raises(InvalidCron) as caught:
        cron.validate("@reboot", "UTC")
    assert "no single start" in str(caught.value) and "trigger" in str(caught.value)


@pytest.mark.parametrize("separator", ["\u00a0", "\u3000", "\u0085", "\u2028", "\v", "\f", "\r", "\n"])
def test_whitespace_other_than_space_and_tab_is_refused_by_name(separator: str) -> None:
    with pytest.raises(InvalidCron) as caught:
        cron.validate(f"0{separator}0 * * *", "UTC")
    assert f"U+{ord(separator):04X}" in str(caught.value) and "spaces and tabs only" in str(caught.value)


def test_a_fixed_time_in_a_skipped_day_is_skipped_not_moved_to_the_jump() -> None:
    # Samoa jumped from 29 December 2011 24:00 to 31 December 00:00 (UTC-10 to UTC+14).
    found = cron.fire_times("0 12 * * *", APIA, utc(2011, 12, 28), utc(2012, 1, 1))
    assert [moment.astimezone(ZoneInfo(APIA)).day for moment in found] == [28, 29, 31, 1]
    assert found == oracle(
        Expr(("0", "12", "*", "*", "*"), *_every(0, 12)), APIA, utc(2011, 12, 28), timedelta(days=4)
    )
    # A jump of an hour still fires the skipped minute at the jump (New York, 8 March 2026).
    assert cron.next_fire_time("30 2 * * *", NY, utc(2026, 3, 8)) == utc(2026, 3, 8, 7)


def test_a_jump_of_exactly_three_hours_skips_the_fixed_times_inside_it() -> None:
    # Casey went from 01:00 (UTC+8) to 04:00 (UTC+11) on 4 October 2020: 02:30 did not exist.
    found = cron.fire_times("30 2 * * *", CASEY, utc(2020, 10, 2), utc(2020, 10, 6))
    assert [moment.astimezone(ZoneInfo(CASEY)).day for moment in found] == [3, 5, 6]
    assert found == oracle(
        Expr(("30", "2", "*", "*", "*"), *_every(30, 2)), CASEY, utc(2020, 10, 2), timedelta(days=4)
    )
    # A wildcard minute fires only at wall minutes that exist: next at 02:00 the day after.
    assert cron.next_fire_time("* 2 * * *", CASEY, utc(2020, 10, 3, 16, 59)) == utc(2020, 10, 4, 15)


MACRO_MEANINGS = {
    "@yearly": (frozenset({1}), frozenset({1}), frozenset(range(7))),
    "@monthly": (frozenset({1}), frozenset(range(1, 13)), frozenset(range(7))),
    "@weekly": (frozenset(range(1, 32)), frozenset(range(1, 13)), frozenset({0})),
    "@daily": (frozenset(range(1, 32)), frozenset(range(1, 13)), frozenset(range(7))),
}


@pytest.mark.parametrize("macro", [*MACRO_MEANINGS, "@hourly"])
@pytest.mark.parametrize("key", [SANTIAGO, LORD_HOWE, APIA, CASEY])
def test_macros_agree_with_the_oracle_around_transitions_and_new_year(macro: str, key: str) -> None:
    if macro == "@hourly":
        expr = Expr(
            tuple(cron.MACROS[macro].split()), frozenset({0}), frozenset(range(24)), *_every(0, 0)[2:]
        )
    else:
        expr = Expr(tuple(cron.MACROS[macro].split()), frozenset({0}), frozenset({0}), *MACRO_MEANINGS[macro])
    starts = [moment - timedelta(days=2) for moment in transitions(key)[:4]] + [utc(2021, 12, 28)]
    for after in starts:
        expected = oracle(expr, key, after, timedelta(days=8))
        assert cron.fire_times(macro, key, after, after + timedelta(days=8)) == expected, after


def _every(minute: int, hour: int) -> tuple[frozenset[int], ...]:
    return (
        frozenset({minute}),
        frozenset({hour}),
        frozenset(range(1, 32)),
        frozenset(range(1, 13)),
        frozenset(range(7)),
    )


def test_fire_times_shared_by_tasks_come_from_a_cache_that_a_caller_cannot_change():
    after = datetime(2026, 3, 2, 9, 0, 30, tzinfo=UTC)
    first = cron.fire_times("*/5 * * * *", "Europe/Berlin", after, after + timedelta(minutes=30))
    first.append(after)
    again = cron.fire_times(
        "*/5 * * * *", "Europe/Berlin", after + timedelta(seconds=10), after + timedelta(minutes=30)
    )
    assert again == [datetime(2026, 3, 2, 9, m, tzinfo=UTC) for m in (5, 10, 15, 20, 25, 30)]
    assert cron.next_fire_time("*/5 * * * *", "Europe/Berlin", after) == again[0]
