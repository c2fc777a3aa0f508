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


def describe(expression: str) -> str:
    """Say when ``expression`` fires, e.g. "at 02:00 every day"; invalid ones read "invalid"."""
    try:
        cron.validate(expression, "")
    except InvalidCron:
        return "invalid cron expression"
    minute, hour, day, month, weekday = expression.lower().split()
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
        phrases.append(f"on day {_plain(day)} of the month")
    if weekday != "*":
        phrases.append("on " + _list(weekday, WEEKDAYS, WEEKDAY_KEYS, "weekday"))
    # Both restricted: either day matches (Vixie cron); one starting with "*": both must.
    joiner = " or " if not day.startswith("*") and not weekday.startswith("*") else " and "
    return joiner.join(phrases)


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
