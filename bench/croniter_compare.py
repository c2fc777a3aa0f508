"""croniter 7.0 beside scheduler_app.cron: three DST cases, then the time per next fire time.

For each case the script lists every fire time either evaluator gives in a window around
the transition, with its local wall time, and a brute-force answer: every UTC minute of
the window is converted to wall time and matched field by field, then the DST rules of
docs/concepts.md ("DST rules (Vixie cron)") are applied: a fixed-time expression fires
on the first pass of a repeated wall time only and once at the end of a gap that hides
one of its wall times; a wildcard expression fires at every matching instant. The
brute force imports nothing from scheduler_app.

croniter is driven as its documentation shows: ``croniter(expr, aware_start)`` and
``get_next(datetime)`` repeatedly. The speed part times next-fire-time computations
chained from 2026-01-05 09:17 local, after one untimed pass that fills the caches of both
evaluators; each figure is the median of 5 passes, each ratio the median of the ratios of
the 5 passes (the three timings of a pass run back to back), so compare ratios within one
run only.
croniter is timed two ways: a new iterator per call (as a scheduler asks "next fire time
after this instant" per task) and one iterator chained with ``get_next``.

croniter is a development-only requirement (requirements-dev.txt). Run (from the
repository root, about 15 s):

    .venv/bin/python bench/croniter_compare.py [--iterations 300]

Writes bench/results/croniter_compare.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import version
from typing import Any
from zoneinfo import ZoneInfo

from _common import write_results
from croniter import croniter

from scheduler_app import cron

MINUTE = timedelta(minutes=1)
SPEED_EXPRESSIONS = ("* * * * *", "*/5 * * * *", "0 2 * * *", "30 1 * * 1-5", "0 0 1 * *")
SPEED_ZONES = ("UTC", "Europe/Berlin")
PASSES = 5


@dataclass(frozen=True)
class Case:
    """A DST transition and an expression to evaluate around it; the window is in local time."""

    title: str
    expression: str
    zone: str
    start: datetime  # naive local wall time, exclusive
    end: datetime  # naive local wall time, inclusive


CASES = (
    Case(
        "fall back, fixed time",
        "30 1 * * *",
        "America/New_York",
        datetime(2024, 11, 2, 12),
        datetime(2024, 11, 4, 12),
    ),
    Case(
        "spring forward at midnight, wildcard hour",
        "34 */7 * * *",
        "America/Havana",
        datetime(2019, 3, 9, 12),
        datetime(2019, 3, 10, 18),
    ),
    Case(
        "half-hour fall back, wildcard hour",
        "26,39 * * * *",
        "Australia/Lord_Howe",
        datetime(2016, 4, 2, 23),
        datetime(2016, 4, 3, 3),
    ),
)


# ---------------------------------------------------------------------------
# Brute force: wall-clock fields matched minute by minute, plus the DST rules
# ---------------------------------------------------------------------------


def field_values(text: str, low: int, high: int) -> set[int]:
    """Expand a numeric field (``*``, ``N``, ``N-M``, ``/S``, commas)."""
    values: set[int] = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            first, last = low, high
        else:
            first_text, _, last_text = base.partition("-")
            first = int(first_text)
            last = int(last_text) if last_text else first
        values.update(range(first, last + 1, int(step) if step else 1))
    return values


def field_sets(expression: str) -> list[set[int]]:
    """Return the value sets of the five fields."""
    texts = expression.split()
    bounds = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
    return [field_values(text, low, high) for text, (low, high) in zip(texts, bounds, strict=True)]


def wall_matches(expression: str, wall: datetime) -> bool:
    """Tell whether a wall time matches the fields, with Vixie's day-of-month OR day-of-week rule."""
    texts = expression.split()
    minutes, hours, days, months, weekdays = field_sets(expression)
    weekday = (wall.weekday() + 1) % 7
    day_of_month = wall.day in days
    day_of_week = weekday in weekdays or (weekday == 0 and 7 in weekdays)
    if not texts[2].startswith("*") and not texts[4].startswith("*"):
        day = day_of_month or day_of_week
    else:
        day = day_of_month and day_of_week
    return wall.minute in minutes and wall.hour in hours and wall.month in months and day


def is_fixed_time(expression: str) -> bool:
    """Neither the minute nor the hour field starts with ``*`` (docs/concepts.md)."""
    minute, hour = expression.split()[:2]
    return not minute.startswith("*") and not hour.startswith("*")


def wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """Return the naive local wall time of a UTC instant."""
    return instant.astimezone(zone).replace(tzinfo=None)


def brute_force(expression: str, zone: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    """Return the fire times in (after, until] (UTC), one UTC minute at a time."""
    fixed = is_fixed_time(expression)
    found: list[datetime] = []
    moment = after.astimezone(UTC).replace(second=0, microsecond=0) + MINUTE
    while moment <= until:
        here, before = wall(moment, zone), wall(moment - MINUTE, zone)
        if fixed:
            # First pass only: the earlier reading (fold=0) of this wall time is this instant.
            first_pass = here.replace(tzinfo=zone, fold=0).astimezone(UTC) == moment
            fires = first_pass and wall_matches(expression, here)
            # A gap ends here: a skipped wall time that matches fires once, now.
            skipped = before + MINUTE
            while not fires and skipped < here:
                fires = wall_matches(expression, skipped)
                skipped += MINUTE
        else:
            fires = wall_matches(expression, here)
        if fires:
            found.append(moment)
        moment += MINUTE
    return found


# ---------------------------------------------------------------------------
# The two evaluators
# ---------------------------------------------------------------------------


def croniter_fires(expression: str, zone: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    """Chain croniter's get_next from ``after`` (aware, local) while it is not past ``until``."""
    iterator = croniter(expression, after)
    found: list[datetime] = []
    while (moment := iterator.get_next(datetime).astimezone(UTC)) <= until:
        found.append(moment)
    return found


def our_fires(expression: str, zone: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    """Return scheduler_app.cron's fire times in (after, until]."""
    return cron.fire_times(expression, zone.key, after, until)


def pass_of(instant: datetime, zone: ZoneInfo) -> str:
    """Say whether the wall time of ``instant`` is read once, or is the first or second of two."""
    here = wall(instant, zone)
    earlier = here.replace(tzinfo=zone, fold=0).astimezone(UTC)
    later = here.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if earlier == later:
        return ""
    return "1st pass" if instant == earlier else "2nd pass"


def field_report(expression: str, instant: datetime, zone: ZoneInfo) -> str:
    """Say which of the minute and hour fields the wall time of ``instant`` matches."""
    here = wall(instant, zone)
    minutes, hours = field_sets(expression)[:2]
    minute = "matches" if here.minute in minutes else "does not match"
    hour = "matches" if here.hour in hours else "does not match"
    return f"minute {here.minute:02d} {minute} the minute field, hour {here.hour:02d} {hour} the hour field"


def show_case(case: Case) -> dict[str, Any]:
    """Print the fire times of one case side by side and the differences from the brute force."""
    zone = ZoneInfo(case.zone)
    after = case.start.replace(tzinfo=zone)
    until = case.end.replace(tzinfo=zone).astimezone(UTC)
    kind = "fixed-time" if is_fixed_time(case.expression) else "wildcard"
    expected = brute_force(case.expression, zone, after, until)
    found = {
        "ours": our_fires(case.expression, zone, after, until),
        "croniter": croniter_fires(case.expression, zone, after, until),
    }
    print(f"\n{case.title}: {case.expression!r} ({kind}) in {case.zone}, local {case.start} to {case.end}")
    print(f"  {'UTC':<17} {'local wall time':<29} {'':<8}  brute force  ours  croniter")
    for instant in sorted(set(expected) | set(found["ours"]) | set(found["croniter"])):
        local = instant.astimezone(zone)
        marks = ["yes" if instant in times else "-" for times in (expected, found["ours"], found["croniter"])]
        local_text = f"{local:%Y-%m-%d %H:%M %z %Z}"
        print(
            f"  {instant:%Y-%m-%d %H:%MZ} {local_text:<29} {pass_of(instant, zone):<8}"
            f"  {marks[0]:<11}  {marks[1]:<4}  {marks[2]}"
        )
    verdicts: dict[str, Any] = {}
    for name, times in found.items():
        extra = [instant for instant in times if instant not in expected]
        missing = [instant for instant in expected if instant not in times]
        verdicts[name] = {"extra": extra, "missing": missing}
        if not extra and not missing:
            print(f"  {name}: right (same fire times as the brute force)")
        for instant in extra:
            local = instant.astimezone(zone)
            print(
                f"  {name}: WRONG, extra fire at {instant:%H:%MZ} = {local:%Y-%m-%d %H:%M %Z}"
                f" {pass_of(instant, zone)}".rstrip()
                + f"; {field_report(case.expression, instant, zone)}"
            )
        for instant in missing:
            local = instant.astimezone(zone)
            print(
                f"  {name}: WRONG, no fire at {instant:%H:%MZ} = {local:%Y-%m-%d %H:%M %Z}"
                f" {pass_of(instant, zone)}".rstrip()
            )
    return {"expression": case.expression, "zone": case.zone, "expected": expected, **verdicts}


# ---------------------------------------------------------------------------
# Speed
# ---------------------------------------------------------------------------


def chain_ours(expression: str, zone: str, start: datetime, iterations: int) -> None:
    """Chain scheduler_app.cron.next_fire_time ``iterations`` times."""
    moment = start
    for _ in range(iterations):
        moment = cron.next_fire_time(expression, zone, moment)


def chain_croniter_new(expression: str, zone: str, start: datetime, iterations: int) -> None:
    """Chain a new croniter per computation, each asked for its first get_next."""
    moment = start
    for _ in range(iterations):
        moment = croniter(expression, moment).get_next(datetime)


def chain_croniter_chained(expression: str, zone: str, start: datetime, iterations: int) -> None:
    """Call get_next ``iterations`` times on one croniter."""
    iterator = croniter(expression, start)
    for _ in range(iterations):
        iterator.get_next(datetime)


CHAINS: tuple[tuple[str, Callable[[str, str, datetime, int], None]], ...] = (
    ("ours", chain_ours),
    ("new", chain_croniter_new),
    ("chained", chain_croniter_chained),
)


def per_call(chain: Callable[[], None], iterations: int) -> float:
    """Return the seconds per computation of one timed pass of ``chain``."""
    started = time.perf_counter()
    chain()
    return (time.perf_counter() - started) / iterations


def speed(iterations: int) -> list[dict[str, Any]]:
    """Print the median time per next fire time of each evaluator, and the ratios."""
    print(
        f"\nSpeed: microseconds per next fire time, {iterations} chained computations,"
        f" median of {PASSES} passes after one untimed pass (ratios: median of the passes' ratios)"
    )
    print(
        f"  {'zone':<14} {'expression':<14} {'ours':>7} {'croniter new':>13} {'ratio':>6}"
        f" {'croniter chained':>17} {'ratio':>6}"
    )
    rows: list[dict[str, Any]] = []
    for zone in SPEED_ZONES:
        start = datetime(2026, 1, 5, 9, 17, tzinfo=ZoneInfo(zone))
        for expression in SPEED_EXPRESSIONS:
            chains = {
                name: partial(function, expression, zone, start, iterations) for name, function in CHAINS
            }
            for chain in chains.values():
                chain()
            # The three run back to back in each pass and each pass gives its own ratios, so a
            # burst of load on the machine weighs on both sides of a ratio.
            passes = [
                {name: per_call(chain, iterations) * 1e6 for name, chain in chains.items()}
                for _ in range(PASSES)
            ]
            row = {
                "zone": zone,
                "expression": expression,
                "ours_us": statistics.median(one["ours"] for one in passes),
                "croniter_new_us": statistics.median(one["new"] for one in passes),
                "croniter_chained_us": statistics.median(one["chained"] for one in passes),
                "ratio_new": statistics.median(one["new"] / one["ours"] for one in passes),
                "ratio_chained": statistics.median(one["chained"] / one["ours"] for one in passes),
            }
            rows.append(row)
            print(
                f"  {zone:<14} {expression:<14} {row['ours_us']:>7.1f} {row['croniter_new_us']:>13.1f}"
                f" {row['ratio_new']:>5.1f}x {row['croniter_chained_us']:>17.1f} {row['ratio_chained']:>5.1f}x"
            )
    print("  ratio = croniter's time / ours; above 1 means croniter is slower")
    return rows


def main() -> None:
    """Run the DST cases, then the speed comparison, and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300, help="computations per timed pass")
    arguments = parser.parse_args()
    print(f"croniter {version('croniter')}, Python {sys.version.split()[0]}")
    cases = [show_case(case) for case in CASES]
    rows = speed(arguments.iterations)
    write_results("croniter_compare", {"cases": cases, "speed": rows, "iterations": arguments.iterations})


if __name__ == "__main__":
    main()
