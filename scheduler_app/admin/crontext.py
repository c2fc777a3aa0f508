"""A plain-language reading of a five-field cron expression, for the task list."""

from __future__ import annotations

from scheduler_app import cron
from scheduler_app.exceptions import InvalidCron

MONTHS = (
    "",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTH_KEYS = {name[:3].lower(): str(number) for number, name in enumerate(MONTHS) if name}
WEEKDAY_KEYS = {name[:3].lower(): str(number) for number, name in enumerate(WEEKDAYS[:7])}
MAX_LISTED_TIMES = 6
ORDINALS = ("", "first", "second", "third", "fourth", "fifth")


def describe(expression: str) -> str:
    """Say when ``expression`` fires, e.g. "at 02:00 every day"; invalid ones read "invalid"."""
    try:
        cron.validate(expression, "")
    except InvalidCron:
        return "invalid cron expression"
    fields = expression.lower().split()
    if len(fields) == 1:
        fields = cron.MACROS[fields[0]].split()
    minute, hour, day, month, weekday = (
        "*" if field == "?" and index in (2, 4) else field for index, field in enumerate(fields)
    )
    parts = [_time(minute, hour)]
    if day != "*" or weekday != "*":
        parts.append(_days(day, weekday))
    elif not hour.startswith("*"):
        parts.append("every day")
    if month != "*":
        parts.append("in " + _list(month, MONTHS, MONTH_KEYS, "month"))
    return " ".join(part for part in parts if part)


def _time(minute: str, hour: str) -> str:
    minutes, hours = _numbers(minute), _numbers(hour)
    if minutes and hours and len(minutes) * len(hours) <= MAX_LISTED_TIMES:
        return "at " + ", ".join(f"{h:02d}:{m:02d}" for h in hours for m in minutes)
    if minute == "*":
        what = "every minute"
    elif minute.startswith("*/"):
        what = f"every {minute[2:]} minutes"
    else:
        what = f"at minute {_plain(minute)}"
    if hour == "*":
        return what if minute.startswith("*") else what + " of every hour"
    if hour.startswith("*/"):
        return f"{what} of every {hour[2:]} hours"
    return f"{what} during hour {_plain(hour)}"


def _days(day: str, weekday: str) -> str:
    phrases = []
    if day.startswith("*/"):
        phrases.append(f"every {day[2:]} days of the month")
    elif day != "*":
        phrases.append("on " + ", ".join(_month_day(item) for item in day.split(",")))
    if weekday != "*":
        phrases.append("on " + ", ".join(_week_day(item) for item in weekday.split(",")))
    # Both restricted: either day matches (Vixie cron); one starting with "*": both must.
    joiner = " or " if not day.startswith("*") and not weekday.startswith("*") else " and "
    return joiner.join(phrases)


def _month_day(item: str) -> str:
    """One item of the day-of-month field: a day, a range, or L, L-N, NW, LW."""
    if item == "l":
        return "the last day of the month"
    if item.startswith("l-"):
        before = int(item[2:])
        return (
            "the last day of the month"
            if not before
            else f"{before} day{'s' if before > 1 else ''} before the last day of the month"
        )
    if item == "lw":
        return "the last weekday of the month"
    if item.endswith("w"):
        return f"the weekday nearest day {item[:-1]} of the month"
    return f"day {_plain(item)} of the month"


def _week_day(item: str) -> str:
    """One item of the day-of-week field: weekdays, or NL, N#K."""
    if "#" in item:
        weekday, week = item.split("#")
        return f"the {ORDINALS[int(week)]} {WEEKDAYS[int(WEEKDAY_KEYS.get(weekday, weekday))]} of the month"
    if item.endswith("l"):
        return f"the last {WEEKDAYS[int(WEEKDAY_KEYS.get(item[:-1], item[:-1]))]} of the month"
    return _list(item, WEEKDAYS, WEEKDAY_KEYS, "weekday")


def _numbers(field: str) -> list[int] | None:
    """The values of a plain comma list of numbers, or None when the field has ranges or steps."""
    items = field.split(",")
    if not all(item.isdigit() for item in items):
        return None
    return sorted({int(item) for item in items})


def _plain(field: str) -> str:
    readings = []
    for item in field.split(","):
        base, _, step = item.partition("/")
        reading = "every value" if base == "*" else base.replace("-", " to ")
        readings.append(reading + (f" every {step}" if step else ""))
    return ", ".join(readings)


def _list(field: str, names: tuple[str, ...], keys: dict[str, str], unit: str) -> str:
    """A field of named values (months, weekdays) read with its names."""

    def name(value: str) -> str:
        number = int(keys.get(value, value))
        return names[number]

    readings = []
    for item in field.split(","):
        base, _, step = item.partition("/")
        if base == "*":
            readings.append(f"every {step} {unit}s" if step else f"every {unit}")
            continue
        if "-" in base:
            first, last = base.split("-")
            reading = f"{name(first)} to {name(last)}"
        else:
            reading = name(base)
        readings.append(reading + (f" (every {step})" if step else ""))
    return ", ".join(readings)
