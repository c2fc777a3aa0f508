"""
Five-field (Vixie) cron expressions evaluated on wall-clock time in an IANA zone.

Pure logic, no Django. Every instant taken or returned is timezone-aware; every
instant returned is in UTC with zero seconds and microseconds.

Semantics:

* Fields are minute (0-59), hour (0-23), day of month (1-31), month (1-12 or
  jan-dec) and day of week (0-7 or sun-sat, 0 and 7 are Sunday), separated by
  spaces or tabs (no other whitespace). Each field is a comma list of ``*``,
  ``N``, ``N-M``, ``*/S`` or ``N-M/S``.
* The day fields also take ``?`` alone (as ``*``). Day of month: ``L`` (the last
  day), ``L-N`` (N days before it), ``NW`` (the weekday nearest day N, within
  the month), ``LW`` (the last weekday). Day of week: ``NL`` (the last such
  weekday of the month), ``N#K`` (the K-th such weekday, K 1-5).
* ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
  (``@midnight``) and ``@hourly`` stand for their five fields; ``@reboot`` is
  refused (a cluster has no boot).
* When both day fields are restricted (neither starts with ``*`` or ``?``) a
  day matches if either matches; otherwise both must match.
* An expression is fixed-time when neither its minute nor its hour field starts
  with ``*``. A fixed-time wall time that does not exist (spring-forward gap)
  fires once at the transition instant when the clock jumps less than 3 hours,
  and is skipped when it jumps further (Vixie cron and cronie catch up only
  over jumps shorter than 3 hours: Pacific/Apia skipped 30 December 2011
  whole); an ambiguous
  one (fall-back) fires once, on the first pass. A wildcard expression fires
  at every instant whose wall time matches: nothing inside a gap, both passes
  of a repeated hour.
* Wall times that map to the same instant fire once.

Implementation: the timeline is cut into segments of constant UTC offset
(found by scanning ``zoneinfo`` once per zone and year, then cached). Inside a
segment wall time is a plain shift of UTC, so matching wall minutes are
enumerated from the parsed fields and shifted back.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from itertools import islice, pairwise
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from scheduler_app.exceptions import InvalidCron

__all__ = [
    "MACROS",
    "count_fire_times",
    "fire_times",
    "is_fixed_time",
    "matches",
    "next_fire_time",
    "shortest_wall_gap",
    "validate",
    "validate_timezone",
]

_ECHO_LIMIT = 100
_MAX_LENGTH = 1000
# Longest possible wait between two fires of a valid expression is a 29 February
# on a given weekday (up to 40 years around 2100), so a century is ample.
_SEARCH_YEARS = 100
_MIN_YEAR = 2
_MAX_YEAR = 9999 - _SEARCH_YEARS - 3
_MINUTE = timedelta(minutes=1)
# Sampling step when looking for UTC offset changes; two changes closer together
# than this would be seen as one, which no real zone does.
_SCAN_STEP = timedelta(hours=6)
_UTC_KEY = "UTC"
_NOT_ZONES = frozenset({"localtime", "posixrules"})

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1
    )
}
_DOW_NAMES = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_DAYS_IN_MONTH_MAX = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

_PART = re.compile(r"(?:(\*)|([0-9a-z]+)(?:-([0-9a-z]+))?)(?:/([0-9]+))?", re.ASCII | re.IGNORECASE)
_LAST_DAY = re.compile(r"L(?:-([0-9]+))?", re.ASCII | re.IGNORECASE)
_NEAREST_WEEKDAY = re.compile(r"([0-9]+|L)W", re.ASCII | re.IGNORECASE)
_LAST_WEEKDAY_OF = re.compile(r"([0-9a-z]+?)L", re.ASCII | re.IGNORECASE)
_NTH_WEEKDAY = re.compile(r"([0-9a-z]+)#([0-9]+)", re.ASCII | re.IGNORECASE)
_SPECIAL = re.compile(r"[LW#]", re.ASCII | re.IGNORECASE)
# The separators of fields: any other whitespace (a no-break space, U+2028, a form feed) is refused.
_SEPARATORS = " \t"
_MAX_WEEK_OF_MONTH = 5
_MAX_DAYS_BEFORE_LAST = 30
_CALENDAR_START = date(2000, 1, 1)
_CALENDAR_END = date(2399, 12, 31)
# A forward jump of the clock shorter than this fires the fixed times it skipped, at the jump.
_CATCH_UP = timedelta(hours=3)
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class _FieldSpec:
    """Name, bounds and accepted names of one cron field."""

    label: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _FieldSpec("minute", 0, 59, {}),
    _FieldSpec("hour", 0, 23, {}),
    _FieldSpec("day of month", 1, 31, {}),
    _FieldSpec("month", 1, 12, _MONTH_NAMES),
    _FieldSpec("day of week", 0, 7, _DOW_NAMES),
)


@dataclass(frozen=True, slots=True)
class _DayRules:
    """The day-of-month and day-of-week tokens whose days depend on the month."""

    days_before_last: frozenset[int] = frozenset()  # L is 0, L-3 is 3
    nearest_weekday: frozenset[int] = frozenset()  # 15W is 15
    last_weekday: bool = False  # LW
    last_of_weekday: frozenset[int] = frozenset()  # 5L is 5 (0 = Sunday)
    nth_weekday: frozenset[tuple[int, int]] = frozenset()  # 1#2 is (1, 2)

    def month_days(self, year: int, month: int) -> frozenset[int]:
        """The days of one month the day-of-month rules select."""
        length = _month_length(year, month)
        found = {length - before for before in self.days_before_last if length - before >= 1}
        for day in self.nearest_weekday:
            if day <= length:
                found.add(_nearest_weekday(year, month, day, length))
        if self.last_weekday:
            found.add(_nearest_weekday(year, month, length, length))
        return frozenset(found)

    def matches_weekday(self, weekday: int, day: int, length: int) -> bool:
        """Whether a day (its weekday, 0 = Sunday, and its number) is selected by the week rules."""
        if weekday in self.last_of_weekday and day > length - 7:
            return True
        return (weekday, (day - 1) // 7 + 1) in self.nth_weekday


@dataclass(frozen=True, slots=True)
class _Cron:
    """A parsed expression: sorted minutes and hours, day and month sets, flags."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday, 7 folded into 0
    either_day: bool  # both day fields restricted: classic OR rule
    fixed: bool
    rules: _DayRules | None = None  # L, W and # tokens, when there are any


@dataclass(frozen=True, slots=True)
class _Transitions:
    """UTC offset changes of a zone within one year: instants (naive UTC) and offsets."""

    instants: tuple[datetime, ...]
    before: tuple[timedelta, ...]
    after: tuple[timedelta, ...]


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def validate(cron: str, timezone: str) -> None:
    """Raise InvalidCron unless ``cron`` is a valid, firing expression and ``timezone`` a known zone."""
    errors: dict[str, list[str]] = {}
    try:
        _parse(cron)
    except InvalidCron as exc:
        errors.update(exc.errors)
    try:
        _zone(timezone)
    except InvalidCron as exc:
        errors.update(exc.errors)
    if errors:
        message = " ".join(message for messages in errors.values() for message in messages)
        raise InvalidCron(message, errors=errors)


def validate_timezone(timezone: str) -> None:
    """Raise InvalidCron unless ``timezone`` is a known IANA zone (empty is UTC)."""
    _zone(timezone)


def is_fixed_time(cron: str) -> bool:
    """Tell whether neither the minute nor the hour field starts with ``*``."""
    return _parse(cron).fixed


def next_fire_time(cron: str, timezone: str, after: datetime) -> datetime:
    """Return the first fire time strictly after ``after``, in UTC."""
    # A bad expression or zone is InvalidCron before a bad instant is a ValueError.
    _parse(cron), _zone(timezone)
    low = _first_candidate(after)
    found = _next_fire(cron, timezone, low)
    if found is None:
        raise ValueError(f"The expression does not fire within {_SEARCH_YEARS} years after {after}.")
    return found


def matches(cron: str, timezone: str, instant: datetime) -> bool:
    """Tell whether ``instant`` (aware, whole minute) is a fire time."""
    spec, zone = _parse(cron), _zone(timezone)
    moment = _naive_utc(instant)
    if moment.second or moment.microsecond:
        return False
    _check_year(moment)
    return next(_fires(spec, zone, moment, moment + _MINUTE), None) == moment


def fire_times(
    cron: str, timezone: str, after: datetime, until: datetime, limit: int | None = None
) -> list[datetime]:
    """Return the fire times in (after, until], at most ``limit`` of them, in UTC."""
    if limit is not None and limit < 0:
        raise ValueError("limit must not be negative.")
    spec, zone = _parse(cron), _zone(timezone)
    low, high = _first_candidate(after), _end_bound(until)
    if high <= low:
        return []
    if high - low <= _CACHED_SPAN:
        return list(_recent_fires(cron, timezone, low, high, limit))
    found = _fires(spec, zone, low, high)
    return [moment.replace(tzinfo=UTC) for moment in islice(found, limit)]


# The runners ask, for each due task, its fire times since its last and its next one: tasks that
# share an expression and a zone (a thousand hourly reports) share the answers, in a few small
# caches keyed by whole minutes.
_CACHED_SPAN = timedelta(hours=1)


@lru_cache(maxsize=1024)
def _next_fire(cron: str, timezone: str, low: datetime) -> datetime | None:
    found = next(_fires(_parse(cron), _zone(timezone), low, _years_later(low, _SEARCH_YEARS)), None)
    return None if found is None else found.replace(tzinfo=UTC)


@lru_cache(maxsize=1024)
def _recent_fires(
    cron: str, timezone: str, low: datetime, high: datetime, limit: int | None
) -> tuple[datetime, ...]:
    found = _fires(_parse(cron), _zone(timezone), low, high)
    return tuple(moment.replace(tzinfo=UTC) for moment in islice(found, limit))


@lru_cache(maxsize=256)
def shortest_wall_gap(cron: str, first: date, last: date) -> timedelta | None:
    """The shortest time between two consecutive wall-clock fire times on the days from ``first``
    to ``last``, as if the zone's UTC offset never changed. None when it fires at most once."""
    spec = _parse(cron)
    times = [hour * 60 + minute for hour in spec.hours for minute in spec.minutes]
    gaps = [later - earlier for earlier, later in pairwise(times)]
    # The shortest a gap across midnight can be: on two days in a row.
    overnight = 1440 - times[-1] + times[0]
    if not gaps or min(gaps) > overnight:
        previous: date | None = None
        for day in _days(spec, first, last):
            if previous is not None:
                gaps.append((day - previous).days * 1440 - times[-1] + times[0])
                if gaps[-1] == overnight:
                    break
            previous = day
    return timedelta(minutes=min(gaps)) if gaps else None


def count_fire_times(cron: str, timezone: str, after: datetime, until: datetime) -> int:
    """Return how many fire times lie in (after, until]."""
    spec, zone = _parse(cron), _zone(timezone)
    low, high = _first_candidate(after), _end_bound(until)
    if high <= low:
        return 0
    return sum(1 for _ in _fires(spec, zone, low, high))


# ---------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------


def _echo(value: str) -> str:
    """Quote a piece of user input for a message, cut to 100 characters."""
    text = repr(value)
    return text if len(text) <= _ECHO_LIMIT else text[: _ECHO_LIMIT - 3] + "..."


def _cron_error(message: str) -> InvalidCron:
    """Build the InvalidCron for a problem with the expression."""
    return InvalidCron(message, errors={"cron": [message]})


def _parse(cron: str) -> _Cron:
    """Parse and check a five-field expression; raise InvalidCron when it is invalid or never fires."""
    if not isinstance(cron, str):
        raise _cron_error("The cron expression must be a string.")
    if len(cron) > _MAX_LENGTH:
        raise _cron_error(f"The cron expression must be at most {_MAX_LENGTH} characters.")
    return _parse_text(cron)


@lru_cache(maxsize=4096)
def _parse_text(cron: str) -> _Cron:
    """Parse a string expression; cached because schedulers ask about the same few all the time."""
    other = next((char for char in cron if char.isspace() and char not in _SEPARATORS), None)
    if other is not None:
        raise _cron_error(
            f"The cron expression may separate its fields with spaces and tabs only; it holds "
            f"U+{ord(other):04X} in {_echo(cron)}."
        )
    texts = re.split(r"[ \t]+", cron.strip(_SEPARATORS))
    if len(texts) == 1 and texts[0].startswith("@"):
        return _parse_text(_macro(texts[0]))
    if len(texts) != len(_FIELDS):
        raise _cron_error(
            f"The cron expression must have exactly 5 fields (minute hour day-of-month month "
            f"day-of-week), got {len([text for text in texts if text])} in {_echo(cron)}."
        )
    # "?" in a day field is "*" (Quartz's "no specific value").
    texts = [("*" if text == "?" and index in (2, 4) else text) for index, text in enumerate(texts)]
    problems: list[str] = []
    values: list[frozenset[int]] = []
    rules: dict[str, Any] = {}
    for index, (text, field) in enumerate(zip(texts, _FIELDS, strict=True)):
        try:
            if index == 2:
                values.append(_parse_month_days(text, field, rules))
            elif index == 4:
                values.append(_parse_week_days(text, field, rules))
            else:
                values.append(_parse_field(text, field))
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        message = " ".join(problems)
        raise InvalidCron(message, errors={"cron": problems})
    minutes, hours, days, months, weekdays = values
    day_text, weekday_text = texts[2], texts[4]
    spec = _Cron(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        months=months,
        weekdays=frozenset(day % 7 for day in weekdays),
        either_day=not day_text.startswith("*") and not weekday_text.startswith("*"),
        fixed=not texts[0].startswith("*") and not texts[1].startswith("*"),
        rules=_DayRules(**rules) if rules else None,
    )
    # Under the AND rule a day of month that no selected month has means no fire
    # ever; the weekday cannot rescue it. Any existing date does reach every
    # weekday over the years, so that is the only case to refuse.
    if not spec.either_day and not _some_month_has_a_day(spec):
        raise _cron_error(f"The cron expression {_echo(cron)} never fires: no selected month has those days.")
    if spec.rules is not None and next(_days(spec, _CALENDAR_START, _CALENDAR_END), None) is None:
        # L, W and # depend on where a day falls in its month: "0 0 */20 * 1#2" (the 1st or 21st,
        # and the second Monday) never meets. The calendar repeats every 400 years.
        raise _cron_error(f"The cron expression {_echo(cron)} never fires: no day matches both day fields.")
    return spec


def _macro(text: str) -> str:
    """The five fields a macro such as ``@daily`` stands for."""
    key = text.lower()
    if key == "@reboot":
        raise _cron_error(
            "@reboot is not supported: a scheduler shared by many nodes has no single start to run "
            "at. Trigger the task from your deploy instead (scheduler.trigger or POST "
            "tasks/{id}/trigger/)."
        )
    if key not in MACROS:
        raise _cron_error(
            f"Unknown cron macro {_echo(text)}: use one of {', '.join(MACROS)}, or 5 fields: "
            "minute hour day-of-month month day-of-week."
        )
    return MACROS[key]


def _some_month_has_a_day(spec: _Cron) -> bool:
    """Whether a selected month has one of the selected days of month, in some year."""
    if any(day <= _DAYS_IN_MONTH_MAX[month] for month in spec.months for day in spec.days):
        return True
    rules = spec.rules
    if rules is None:
        return False
    longest = max(_DAYS_IN_MONTH_MAX[month] for month in spec.months)
    return (
        rules.last_weekday
        or any(longest - before >= 1 for before in rules.days_before_last)
        or any(day <= longest for day in rules.nearest_weekday)
    )


def _parse_month_days(text: str, field: _FieldSpec, rules: dict[str, Any]) -> frozenset[int]:
    """The day-of-month field: plain parts as any field, and L, L-N, NW, LW."""
    plain: list[str] = []
    before: set[int] = set()
    nearest: set[int] = set()
    for part in text.split(","):
        if last := _LAST_DAY.fullmatch(part):
            digits = last.group(1) or "0"
            offset = int(digits) if len(digits) <= 2 else _MAX_DAYS_BEFORE_LAST + 1
            if offset > _MAX_DAYS_BEFORE_LAST:
                raise ValueError(f"{_echo(part)} in the {field.label} field: L-N takes N from 0 to 30.")
            before.add(offset)
        elif weekday := _NEAREST_WEEKDAY.fullmatch(part):
            if weekday.group(1).upper() == "L":
                rules["last_weekday"] = True
            else:
                nearest.add(_field_value(weekday.group(1), field))
        elif _SPECIAL.search(part):
            raise ValueError(
                f"Cannot read {_echo(part)} in the {field.label} field: it takes L, L-N, NW or LW alone "
                "in a list item (no ranges or steps with them)."
            )
        else:
            plain.append(part)
    if before:
        rules["days_before_last"] = frozenset(before)
    if nearest:
        rules["nearest_weekday"] = frozenset(nearest)
    return _parse_field(",".join(plain), field) if plain else frozenset()


def _parse_week_days(text: str, field: _FieldSpec, rules: dict[str, Any]) -> frozenset[int]:
    """The day-of-week field: plain parts as any field, and NL, N#K."""
    plain: list[str] = []
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for part in text.split(","):
        if part.upper() == "L":
            raise ValueError(
                f"L alone in the {field.label} field is ambiguous (Quartz reads it as Saturday): write 6 "
                "for every Saturday, or 6L for the last Saturday of the month."
            )
        if found := _NTH_WEEKDAY.fullmatch(part):
            week = int(found.group(2)) if len(found.group(2)) <= 2 else 0
            if not 1 <= week <= _MAX_WEEK_OF_MONTH:
                raise ValueError(f"{_echo(part)} in the {field.label} field: N#K takes K from 1 to 5.")
            nth.add((_field_value(found.group(1), field) % 7, week))
        elif found := _LAST_WEEKDAY_OF.fullmatch(part):
            # No weekday name ends in L: "5L" and "friL" are always the last such weekday.
            last.add(_field_value(found.group(1), field) % 7)
        else:
            plain.append(part)
    if last:
        rules["last_of_weekday"] = frozenset(last)
    if nth:
        rules["nth_weekday"] = frozenset(nth)
    return _parse_field(",".join(plain), field) if plain else frozenset()


def _parse_field(text: str, field: _FieldSpec) -> frozenset[int]:
    """Expand one field to its set of values; raise ValueError with a readable message."""
    values: set[int] = set()
    for part in text.split(","):
        match = _PART.fullmatch(part)
        if match is None:
            if _SPECIAL.search(part) and field.label not in ("day of month", "day of week"):
                raise ValueError(
                    f"Cannot read {_echo(part)} in the {field.label} field: L, W and # belong to the day "
                    "fields only."
                )
            raise ValueError(f"Cannot read {_echo(part)} in the {field.label} field.")
        star, first, last, step_text = match.groups()
        if star:
            low, high = field.low, field.high
        else:
            low = _field_value(first, field)
            high = _field_value(last, field) if last is not None else low
            if last is None and step_text is not None:
                raise ValueError(f"A step needs a range or '*' in the {field.label} field: {_echo(part)}.")
            if low > high:
                raise ValueError(f"Range {_echo(part)} in the {field.label} field runs backwards.")
        step = 1
        if step_text is not None:
            step = int(step_text) if len(step_text) <= 9 else 0
            if not 1 <= step <= field.high:
                raise ValueError(
                    f"Step {_echo(step_text)} in the {field.label} field must be 1-{field.high}."
                )
        values.update(range(low, high + 1, step))
    return frozenset(values)


def _field_value(text: str, field: _FieldSpec) -> int:
    """Read one number or name of a field and check its range."""
    if text.isdigit():
        value = int(text) if len(text) <= 9 else field.high + 1
    else:
        named = field.names.get(text.lower())
        if named is None:
            raise ValueError(f"Unknown value {_echo(text)} in the {field.label} field.")
        value = named
    if not field.low <= value <= field.high:
        raise ValueError(
            f"Value {_echo(text)} in the {field.label} field is out of range {field.low}-{field.high}."
        )
    return value


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    """Return the IANA keys zoneinfo can load, without pseudo-zones like ``localtime``."""
    return frozenset(available_timezones()) - _NOT_ZONES


def _zone(timezone: str) -> ZoneInfo:
    """Return the ZoneInfo for an IANA key, UTC for the empty string; raise InvalidCron otherwise."""
    if not isinstance(timezone, str):
        message = "The timezone must be a string."
        raise InvalidCron(message, errors={"timezone": [message]})
    return _zone_key(timezone)


@lru_cache(maxsize=1024)
def _zone_key(timezone: str) -> ZoneInfo:
    """Look up a string zone key; cached to skip the checks on every call."""
    key = timezone or _UTC_KEY
    if key in _known_zones():
        try:
            return ZoneInfo(key)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    message = f"Unknown timezone {_echo(timezone)}: use an IANA name such as 'Europe/London'."
    raise InvalidCron(message, errors={"timezone": [message]})


# ---------------------------------------------------------------------------
# Instants and zone transitions (naive datetimes below are UTC unless named wall)
# ---------------------------------------------------------------------------


def _naive_utc(moment: datetime) -> datetime:
    """Convert an aware datetime to naive UTC; raise ValueError for a naive one."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("A timezone-aware datetime is required.")
    return moment.astimezone(UTC).replace(tzinfo=None)


def _check_year(moment: datetime) -> None:
    """Refuse instants too close to the ends of the datetime range to search from."""
    if not _MIN_YEAR <= moment.year <= _MAX_YEAR:
        raise ValueError(f"Instants must lie in years {_MIN_YEAR}-{_MAX_YEAR}.")


def _first_candidate(after: datetime) -> datetime:
    """Return the first whole UTC minute strictly after ``after``."""
    moment = _naive_utc(after).replace(second=0, microsecond=0) + _MINUTE
    _check_year(moment)
    return moment


def _end_bound(until: datetime) -> datetime:
    """Return the exclusive naive UTC bound matching an inclusive ``until``, clamped to the supported years."""
    moment = _naive_utc(until)
    if moment.year > _MAX_YEAR:
        return datetime(_MAX_YEAR + 1, 1, 1)
    return moment.replace(second=0, microsecond=0) + _MINUTE


def _years_later(moment: datetime, years: int) -> datetime:
    """Return 1 January of the year ``years`` after that of ``moment``."""
    return datetime(moment.year + years, 1, 1)


def _offset(zone: ZoneInfo, moment: datetime) -> timedelta:
    """Return the UTC offset of ``zone`` at the naive UTC instant ``moment``."""
    offset = zone.utcoffset(zone.fromutc(moment.replace(tzinfo=zone)))
    assert offset is not None
    return offset


@lru_cache(maxsize=4096)
def _transitions(zone: ZoneInfo, year: int) -> _Transitions:
    """Find the instants in (1 Jan year, 1 Jan year+1] (UTC) where the offset of ``zone`` changes."""
    instants: list[datetime] = []
    before: list[timedelta] = []
    after: list[timedelta] = []
    moment, end = datetime(year, 1, 1), datetime(year + 1, 1, 1)
    current = _offset(zone, moment)
    while moment < end:
        probe = min(moment + _SCAN_STEP, end)
        if _offset(zone, probe) == current:
            moment = probe
            continue
        low, high = moment, probe  # offset is ``current`` at low, differs at high
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) / 2
            middle = middle.replace(microsecond=0)
            if _offset(zone, middle) == current:
                low = middle
            else:
                high = middle
        changed = _offset(zone, high)
        instants.append(high)
        before.append(current)
        after.append(changed)
        moment, current = high, changed
    return _Transitions(tuple(instants), tuple(before), tuple(after))


def _segment(zone: ZoneInfo, moment: datetime) -> tuple[datetime | None, timedelta, timedelta, datetime]:
    """Return (start, offset before start, offset, end) of the constant-offset stretch holding ``moment``."""
    # start is None when the offset did not change in the year before; when it
    # does not change in the year after either, end is an arbitrary 1 January.
    offset = _offset(zone, moment)
    here = _transitions(zone, moment.year)
    index = bisect_right(here.instants, moment)
    start: datetime | None = None
    previous = offset
    if index:
        start, previous = here.instants[index - 1], here.before[index - 1]
    else:
        earlier = _transitions(zone, moment.year - 1)
        if earlier.instants:
            start, previous = earlier.instants[-1], earlier.before[-1]
    if index < len(here.instants):
        end = here.instants[index]
    else:
        later = _transitions(zone, moment.year + 1)
        end = later.instants[0] if later.instants else datetime(moment.year + 2, 1, 1)
    return start, previous, offset, end


# ---------------------------------------------------------------------------
# Enumeration
# ---------------------------------------------------------------------------


def _ceil_minute(moment: datetime) -> datetime:
    """Round a naive datetime up to a whole minute."""
    if moment.second or moment.microsecond:
        return moment.replace(second=0, microsecond=0) + _MINUTE
    return moment


def _days(spec: _Cron, first: date, last: date) -> Iterator[date]:
    """Yield the days from ``first`` to ``last`` (inclusive) allowed by the day and month fields."""
    year, month, day = first.year, first.month, first.day
    weekdays, either, rules = spec.weekdays, spec.either_day, spec.rules
    while (year, month) <= (last.year, last.month):
        if month in spec.months:
            length = _month_length(year, month)
            stop = min(length, last.day) if (year, month) == (last.year, last.month) else length
            weekday = (date(year, month, day).weekday() + 1) % 7
            days = spec.days | rules.month_days(year, month) if rules is not None else spec.days
            for number in range(day, stop + 1):
                on_weekday = weekday in weekdays or (
                    rules is not None and rules.matches_weekday(weekday, number, length)
                )
                if (number in days or on_weekday) if either else (number in days and on_weekday):
                    yield date(year, month, number)
                weekday = (weekday + 1) % 7
        day = 1
        month += 1
        if month == 13:
            year, month = year + 1, 1


def _nearest_weekday(year: int, month: int, day: int, length: int) -> int:
    """The weekday (Monday to Friday) nearest ``day`` without leaving its month (Quartz's ``W``)."""
    weekday = date(year, month, day).weekday()  # Monday is 0
    if weekday == 5:  # Saturday: the Friday before, or the Monday after the 1st
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday: the Monday after, or the Friday before the last day
        return day + 1 if day < length else day - 2
    return day


def _month_length(year: int, month: int) -> int:
    """Return the number of days in a month."""
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return _DAYS_IN_MONTH_MAX[month]


def _walls(spec: _Cron, first: datetime, stop: datetime) -> Iterator[datetime]:
    """Yield matching wall minutes in [first, stop), in order; ``first`` is a whole minute."""
    if first >= stop:
        return
    minutes, hours = spec.minutes, spec.hours
    first_day = first.date()
    for day in _days(spec, first_day, stop.date()):
        year, month, number = day.year, day.month, day.day
        hour_index = start_minute = 0
        if day == first_day:
            hour_index = bisect_left(hours, first.hour)
            if hour_index < len(hours) and hours[hour_index] == first.hour:
                start_minute = first.minute
        for hour in hours[hour_index:]:
            minute_index = bisect_left(minutes, start_minute) if start_minute else 0
            start_minute = 0
            for minute in minutes[minute_index:]:
                wall = datetime(year, month, number, hour, minute)
                if wall >= stop:
                    return
                yield wall


def _fires(spec: _Cron, zone: ZoneInfo, low: datetime, high: datetime) -> Iterator[datetime]:
    """Yield the fire instants in [low, high) in increasing order (naive UTC, ``low`` a whole minute)."""
    moment = low
    last: datetime | None = None
    while moment < high:
        start, previous, offset, end = _segment(zone, moment)
        end = min(end, high)
        if spec.fixed and start is not None and start >= moment and previous < offset < previous + _CATCH_UP:
            # Wall times skipped by a gap shorter than 3 hours fire once, at the transition itself.
            gap = _walls(spec, _ceil_minute(start + previous), start + offset)
            if next(gap, None) is not None:
                last = start
                yield start
        wall_low = moment + offset
        if start is not None:
            # A fixed time inside a repeated stretch already fired on the first pass.
            wall_low = max(wall_low, start + (max(offset, previous) if spec.fixed else offset))
        for wall in _walls(spec, _ceil_minute(wall_low), end + offset):
            instant = wall - offset
            if last is None or instant > last:
                last = instant
                yield instant
        moment = end
