"""Outages, lost connections, skewed clocks, long downtime and racing operators.

Real runner processes where the fault needs one (tests/system/faults.py patches the
runner subprocesses, never the product), an injected clock where precision
matters more than realism. Outcomes are read from the journal, from the
side-effect files the hooks write and from the database clock.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections

from scheduler_app import db, journal, scheduler, wakeup
from scheduler_app.exceptions import Conflict
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Runner, Status, Task
from scheduler_app.runner import claims
from scheduler_app.runner.clock import FakeClock
from tests import hooks
from tests.factories import T0, definition, inline_runner, ran_once, transitions, unknown_as_a_crash_leaves_it
from tests.system.faults import (  # noqa: F401 - runners is a fixture
    FaultyRunner,
    ThrowawayPostgres,
    kill_backend,
    reached,
    release,
    stamps,
    ticks,
)
from tests.system.processes import ROOT, starts
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

needs_server = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="process tests need PostgreSQL or MariaDB"
)

NEVER = "0 0 1 1 *"
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
MISFIRE = re.compile(r"misfire: missed (\d+) fire times? between (\S+)Z and (\S+)Z")


def execution_of(occurrence_id: Any) -> Execution:
    return Execution.objects.get(occurrence_id=occurrence_id)


def status_of(occurrence_id: Any) -> str:
    return execution_of(occurrence_id).status


def events_of(occurrence_id: Any) -> list[ExecutionEvent]:
    return list(ExecutionEvent.objects.filter(execution__occurrence_id=occurrence_id).order_by("id"))


def database_now() -> datetime:
    return db.probe().now


# -- lost connections inside the claim and the lease renewal ----------------------------------


@pytest.mark.processes
@needs_server
def test_a_connection_killed_inside_the_claim_rolls_it_back_and_the_occurrence_runs_once(runners):
    scheduler.register(definition(cron=NEVER, idempotent=False))
    runner = runners.start("claimer", fault="pause_in_claim")
    execution = scheduler.trigger("report", params={"result": "once"})
    occurrence = str(execution.occurrence_id)
    backend = wait_for(lambda: runners.reached("pause_in_claim"), message="claim transaction")
    # The due row is locked inside the claim; nothing is committed yet.
    assert status_of(occurrence) == Status.PENDING
    kill_backend(backend)
    runners.release("pause_in_claim")

    wait_for(lambda: status_of(occurrence) == Status.SUCCESS, timeout=20)
    done = execution_of(occurrence)
    assert (done.attempt, done.owner, done.result) == (1, "claimer", "once")
    # The killed claim left no trace: one claim, one start, one outcome.
    assert transitions(occurrence) == [
        ("", Status.PENDING),
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
        (Status.RUNNING, Status.SUCCESS),
    ]
    assert runners.starts() == ran_once("report", occurrence)
    assert runner.alive
    assert runner.stop() == 0


@pytest.mark.processes
@needs_server
def test_a_connection_killed_inside_the_lease_renewal_is_replaced_and_the_attempt_keeps_its_lease(runners):
    scheduler.register(definition(cron=NEVER, idempotent=False))
    runner = runners.start("renewer", fault="pause_in_renewal", lease=3)
    # Runs longer than one lease: it finishes only if renewals resume after the killed one.
    execution = scheduler.trigger("report", params={"block": 4.5})
    occurrence = str(execution.occurrence_id)
    backend = wait_for(lambda: runners.reached("pause_in_renewal"), message="lease renewal")
    assert status_of(occurrence) in (Status.CLAIMED, Status.RUNNING)
    kill_backend(backend)
    runners.release("pause_in_renewal")

    wait_for(lambda: status_of(occurrence) == Status.SUCCESS, timeout=20)
    done = execution_of(occurrence)
    assert (done.attempt, done.owner, done.result) == (1, "renewer", {"ok": True, "attempt": 1})
    assert transitions(occurrence) == [
        ("", Status.PENDING),
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
        (Status.RUNNING, Status.SUCCESS),
    ]
    assert runners.starts() == ran_once("report", occurrence)
    assert runner.alive
    assert runner.stop() == 0


# -- self-fencing on the runner's own clock ------------------------------------------------------


@pytest.mark.processes
@needs_server
@pytest.mark.parametrize("idempotent", [False, True], ids=["not-idempotent", "idempotent"])
def test_a_runner_that_cannot_renew_its_lease_stops_the_handler_on_its_own_clock(runners, idempotent):
    """Renewals fail while the database stays reachable: nobody tells the runner it lost the lease.

    It cancels the handler by itself once its lease is spent and writes no outcome; recovery
    makes the row unknown, or pending again for an idempotent task, which then runs as attempt 2.
    """
    scheduler.register(definition(cron=NEVER, idempotent=idempotent, retry={"max_attempts": 2}))
    fenced = runners.start("fenced", fault="renew_fails,ticker", lease=2)
    execution = scheduler.trigger("report", params={"ticker": 6, "ticker_attempts": 1})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.ticks(occurrence), message="side effects")
    claimed = execution_of(occurrence)
    assert (claimed.status, claimed.owner) == (Status.RUNNING, "fenced")

    wait_for(lambda: "cancelled" in dict(runners.ticks(occurrence)), timeout=10, message="self-fence")
    first = runners.ticks(occurrence)
    cancelled_at = dict(first)["cancelled"]
    # Cancelled about one lease after the claim, well before the handler's own 6 s, and for good:
    # the fence margin (0.1 s here) before the lease ends, a little earlier still by the time the
    # probe took to reach the database (the local deadline errs early by design).
    lease_end = claimed.lease_expires_at.timestamp()
    assert lease_end - 0.1 - 0.05 < cancelled_at < lease_end + 0.5
    assert [kind for kind, _ in first].count("cancelled") == 1
    assert max(at for _, at in first) == cancelled_at

    rescuer = runners.start("rescuer", lease=2)
    wait_for(lambda: Runner.objects.filter(node_id="rescuer").exists(), message="rescuer up")
    if not idempotent:
        wait_for(lambda: status_of(occurrence) == Status.UNKNOWN, timeout=15)
        unknown = execution_of(occurrence)
        assert (unknown.attempt, unknown.error["reason"], unknown.result) == (1, "lease expired", None)
        assert runners.starts() == ran_once("report", occurrence)
    else:
        wait_for(lambda: status_of(occurrence) == Status.SUCCESS, timeout=20)
        rerun = execution_of(occurrence)
        assert (rerun.attempt, rerun.result) == (2, {"ok": True, "attempt": 2})
        assert (Status.RUNNING, Status.PENDING) in transitions(occurrence)
        assert runners.starts() == ran_once("report", occurrence, 1, 2)
    # Attempt 1 ended without an outcome written by its runner, and no effect of it came after the cancel.
    ends_of_attempt_one = [
        event for event in events_of(occurrence) if event.attempt == 1 and event.from_status == Status.RUNNING
    ]
    assert [event.reason for event in ends_of_attempt_one] == [
        "lease expired while running; idempotent, will run again"
        if idempotent
        else "lease expired while running; outcome unknown"
    ]
    assert runners.ticks(occurrence) == first
    assert fenced.alive
    assert rescuer.stop() == 0
    assert fenced.stop() == 0


@pytest.mark.processes
@needs_server
def test_side_effects_stop_before_the_database_lease_expires_when_the_database_answers_late(runners):
    """The lease must run out on the runner's clock before it runs out in the database.

    The probe's answer reaches the runner 0.5 s after the database read its clock (a slow
    server, network or process); renewals fail. The handler must be cancelled, and its side
    effects stop, before the row's lease_expires_at, so that no effect follows a recovery.
    """
    scheduler.register(definition(cron=NEVER, idempotent=False))
    runners.start("late", fault="renew_fails,ticker,probe_delay=0.5", lease=2)
    execution = scheduler.trigger("report", params={"ticker": 6})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.ticks(occurrence), timeout=10, message="side effects")
    lease_end = execution_of(occurrence).lease_expires_at.timestamp()
    wait_for(lambda: status_of(occurrence) == Status.UNKNOWN, timeout=15, message="recovery")
    wait_for(lambda: "cancelled" in dict(runners.ticks(occurrence)), timeout=10, message="cancel")
    recovered_at = events_of(occurrence)[-1].at.timestamp()
    effects = runners.ticks(occurrence)
    last_effect = max(at for kind, at in effects if kind == "tick")
    assert (last_effect < recovered_at, dict(effects)["cancelled"] < lease_end) == (True, True), (
        f"last effect {last_effect - lease_end:+.3f}s, cancel {dict(effects)['cancelled'] - lease_end:+.3f}s, "
        f"recovery {recovered_at - lease_end:+.3f}s after the database lease expired"
    )


# -- skewed clocks ------------------------------------------------------------------------------


def skewed(offset: str) -> dict[str, str]:
    """Environment that shifts a child's wall clock by ``offset`` (libfaketime), checked to work."""
    if not os.path.exists(LIBFAKETIME):
        pytest.skip("libfaketime is not installed (Debian package faketime)")
    env = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    seen = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    shift = float(seen.stdout) - time.time()
    expected = 300 if offset.startswith("+") else -300
    assert abs(shift - expected) < 5, f"libfaketime did not shift the child's clock: {shift:+.1f}s"
    return env


@pytest.mark.processes
@needs_server
@pytest.mark.parametrize("offset", ["+5m", "-5m"])
def test_a_runner_with_a_clock_five_minutes_off_keeps_its_lease_and_loses_it_on_time(runners, offset):
    scheduler.register(definition(cron=NEVER, idempotent=False))
    runner = runners.start("skewed", lease=2, **skewed(offset))
    execution = scheduler.trigger("report", params={"block": 600})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: status_of(occurrence) == Status.RUNNING, message="start")
    correct = runners.start("correct", lease=2)

    # Three leases long: the lease moves forward and always ends within one lease of the database's now.
    leases: set[datetime] = set()

    def renewed_often() -> bool:
        row = execution_of(occurrence)
        now = database_now()
        assert (row.status, row.owner) == (Status.RUNNING, "skewed")
        assert timedelta(0) < row.lease_expires_at - now <= timedelta(seconds=2.5)
        leases.add(row.lease_expires_at)
        return len(leases) >= 9

    wait_for(renewed_often, timeout=15, interval=0.05)
    assert transitions(occurrence) == [
        ("", Status.PENDING),
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
    ]

    # Dead, its lease runs out at the database's expiry, not five minutes off.
    runner.kill()
    killed_at = database_now()
    wait_for(lambda: status_of(occurrence) == Status.UNKNOWN, timeout=10)
    recovery = events_of(occurrence)[-1]
    assert recovery.node == "correct"
    assert recovery.at - killed_at < timedelta(seconds=2 + 2)
    assert correct.stop() == 0


@pytest.mark.minute
@pytest.mark.processes
@needs_server
def test_runners_with_clocks_five_minutes_off_fire_each_minute_on_time(runners):
    tasks = [f"minutely-{n}" for n in range(4)]
    for task_id in tasks:
        scheduler.register(definition(task_id, cron="* * * * *", idempotent=False))
    minute = Task.objects.get(id=tasks[0]).next_run_at
    # Leases of 10 s, not the faulty runners' 2: a lease stamped on a skewed clock would be five
    # minutes off either way, and a loaded machine (the CI's) stalled a runner past 2 s once, so
    # that its attempt of a non-idempotent task ended unknown.
    ahead = runners.start("ahead", "--workers", "2", fault="db_stamp", lease=10, **skewed("+5m"))
    behind = runners.start("behind", "--workers", "2", fault="db_stamp", lease=10, **skewed("-5m"))

    def nothing_early_and_all_done() -> bool:
        rows = list(Execution.objects.values_list("task_id", "scheduled_for", "status"))
        now = database_now()
        early = [row for row in rows if row[1] > now]
        assert not early, f"occurrences created before their minute: {early}"
        return len([row for row in rows if row[1] == minute and row[2] == Status.SUCCESS]) == len(tasks)

    try:
        wait_for(nothing_early_and_all_done, timeout=90, interval=0.1)
    except AssertionError as failure:
        # What the journal and the runners said, for a failure seen once on a loaded CI machine.
        rows = list(Execution.objects.values_list("task_id", "scheduled_for", "status"))
        raise AssertionError(
            f"{failure}; minute {minute}, database now {database_now()}; rows {rows};"
            f" ahead said {ahead.lines[-15:]}; behind said {behind.lines[-15:]}"
        ) from None
    started = stamps(runners.effects)
    # A slow machine may already have reached the next minute: its occurrences are not this check's.
    rows = list(Execution.objects.filter(scheduled_for=minute))
    assert sorted(row.task_id for row in rows) == tasks
    for row in rows:
        # Started by the database clock at or after the minute, and promptly.
        assert minute <= started[str(row.occurrence_id)] < minute + timedelta(seconds=5)
    of_minute = {str(row.occurrence_id) for row in rows}
    starts = Counter({line: n for line, n in runners.starts().items() if line.split(",")[1] in of_minute})
    assert starts == sum((ran_once(row.task_id, row.occurrence_id) for row in rows), Counter())
    assert ahead.alive and behind.alive
    assert ahead.stop() == 0
    assert behind.stop() == 0


# -- three days without any runner -------------------------------------------------------------


def test_three_days_without_runners_catch_up_with_one_misfire_record_per_task(clock):
    """The cluster stopped three days ago; one tick records what was missed and runs only the present."""
    down_at = T0 - timedelta(days=3)
    clock.set(down_at - timedelta(seconds=30))
    scheduler.register(definition("minutely", cron="* * * * *", idempotent=False))
    scheduler.register(definition("hourly", cron="0 * * * *"))
    scheduler.register(definition("nightly", cron="30 2 * * *", timezone="Europe/Berlin"))
    scheduler.register(definition("buffered", cron="*/5 * * * *", overlap="buffer_one"))
    scheduler.register(definition("manual", cron=NEVER))
    scheduler.register(definition("crashed", cron=NEVER, idempotent=False))
    scheduler.register(definition("crashed-idem", cron=NEVER, idempotent=True, retry={"max_attempts": 2}))
    Task.objects.bulk_create(
        Task(id=f"bulk-{n:03d}", name="bulk", cron="* * * * *", next_run_at=down_at) for n in range(100)
    )
    # Work in flight when everything stopped: a manual trigger waiting, two attempts running.
    running = []
    for task_id in ("crashed", "crashed-idem"):
        scheduler.trigger(task_id)
        (claim,), _, _ = claims.claim(clock.now(), "dead-node", 1, 30)
        assert journal.transition(
            claim.execution.sequence,
            Status.CLAIMED,
            Status.RUNNING,
            at=clock.now(),
            reason="started",
            token=claim.token,
            attempt=1,
            fields={"started_at": clock.now()},
        )
        running.append(claim.execution)
    waiting = scheduler.trigger("manual", params={"result": "late but once"})

    clock.set(T0 + timedelta(seconds=20))
    runner = inline_runner(clock, workers=300)
    for _ in range(3):
        runner.tick()

    def rows(task_id: str) -> list[tuple[str, datetime | None, str]]:
        found = Execution.objects.filter(task_id=task_id).order_by("scheduled_for", "sequence")
        return [(row.status, row.scheduled_for, (row.error or {}).get("message", "")) for row in found]

    minute = timedelta(minutes=1)
    assert rows("minutely") == [
        (
            Status.INTERRUPTED,
            down_at,
            "misfire: missed 4320 fire times between 2026-02-27T09:00Z and 2026-03-02T08:59Z",
        ),
        (Status.SUCCESS, T0, ""),
    ]
    assert rows("hourly") == [
        (
            Status.INTERRUPTED,
            down_at,
            "misfire: missed 72 fire times between 2026-02-27T09:00Z and 2026-03-02T08:00Z",
        ),
        (Status.SUCCESS, T0, ""),
    ]
    # 02:30 in Berlin is 01:30Z in winter; nothing of it is within grace now.
    assert rows("nightly") == [
        (
            Status.INTERRUPTED,
            datetime(2026, 2, 28, 1, 30, tzinfo=UTC),
            "misfire: missed 3 fire times between 2026-02-28T01:30Z and 2026-03-02T01:30Z",
        )
    ]
    assert rows("buffered") == [
        (
            Status.INTERRUPTED,
            down_at,
            "misfire: missed 864 fire times between 2026-02-27T09:00Z and 2026-03-02T08:55Z",
        ),
        (Status.SUCCESS, T0, ""),
    ]
    for n in range(100):
        assert [status for status, _, _ in rows(f"bulk-{n:03d}")] == [Status.INTERRUPTED, Status.SUCCESS]
    # What was in flight: the waiting trigger runs once, the lost attempts follow crash recovery.
    assert (execution_of(waiting.occurrence_id).status, execution_of(waiting.occurrence_id).result) == (
        Status.SUCCESS,
        "late but once",
    )
    lost, rerun = (execution_of(row.occurrence_id) for row in running)
    assert (lost.status, lost.attempt, lost.error["reason"]) == (Status.UNKNOWN, 1, "lease expired")
    assert (rerun.status, rerun.attempt) == (Status.SUCCESS, 2)
    # No flood: one misfire record per scheduled task, one run of the present minute, nothing else.
    assert Execution.objects.count() == 2 * 103 + 1 + 3
    assert len(hooks.CALLS) == 103 + 1 + 1
    assert Task.objects.get(id="minutely").next_run_at == T0 + minute
    assert Task.objects.get(id="nightly").next_run_at == datetime(2026, 3, 3, 1, 30, tzinfo=UTC)

    # And the next minute is an ordinary one.
    clock.set(T0 + minute + timedelta(seconds=1))
    runner.tick()
    runner.tick()
    assert rows("minutely")[2:] == [(Status.SUCCESS, T0 + minute, "")]
    assert Execution.objects.count() == 2 * 103 + 1 + 3 + 101


@pytest.mark.processes
@needs_server
def test_runners_started_after_three_days_down_record_each_task_once_and_do_not_flood(runners):
    now = database_now()
    down_at = now.replace(second=0, microsecond=0) - timedelta(days=3)
    Task.objects.bulk_create(
        Task(id=f"t{n:03d}", name="t", cron="* * * * *", next_run_at=down_at) for n in range(100)
    )
    started = [runners.start(f"node-{n}", "--workers", "8", lease=30) for n in range(2)]
    wait_for(
        lambda: (
            Execution.objects.filter(status=Status.INTERRUPTED).count() == 100
            and not Execution.objects.exclude(status__in=(Status.INTERRUPTED, Status.SUCCESS)).exists()
            and Execution.objects.filter(status=Status.SUCCESS).count() >= 100
        ),
        timeout=60,
    )
    for process in started:
        assert process.stop() == 0
    for task_id in Task.objects.values_list("id", flat=True):
        found = list(Execution.objects.filter(task_id=task_id).order_by("scheduled_for"))
        misfire, *ran = found
        # One record of the missed span, then the present minute (and the next, if it came meanwhile).
        assert 1 <= len(ran) <= 2
        assert misfire.status == Status.INTERRUPTED and all(row.status == Status.SUCCESS for row in ran)
        count, first, last = MISFIRE.fullmatch(misfire.error["message"]).groups()
        first_at = datetime.fromisoformat(first).replace(tzinfo=UTC)
        last_at = datetime.fromisoformat(last).replace(tzinfo=UTC)
        assert (misfire.scheduled_for, first_at) == (down_at, down_at)
        assert int(count) == (last_at - first_at) // timedelta(minutes=1) + 1 >= 3 * 24 * 60
        # Nothing between the missed span and the first run but at most one minute coalesced within grace.
        assert timedelta(minutes=1) <= ran[0].scheduled_for - last_at <= timedelta(minutes=2)
    assert max(starts(runners.effects).values()) == 1


# -- racing operators ---------------------------------------------------------------------------


def unknown_executions(count: int) -> list[Execution]:
    """``count`` executions left unknown by a node that died while running them."""
    scheduler.register(definition(cron=NEVER, idempotent=False, max_concurrency=count))
    for _ in range(count):
        scheduler.trigger("report")
    # The resolving threads read the real clock: only the crash and its recovery run on this one.
    return unknown_as_a_crash_leaves_it(FakeClock(datetime.now(UTC)), count)


def resolve_at_once(execution: Execution, statuses: tuple[str, ...]) -> dict[str, Any]:
    """Resolve one execution from one thread per status, released together; status -> result or error."""
    outcomes: dict[str, Any] = {}
    barrier = threading.Barrier(len(statuses))

    def resolve(status: str) -> None:
        try:
            barrier.wait(5)
            outcomes[status] = scheduler.executions.resolve_unknown(
                execution.occurrence_id, status, expected_updated_at=execution.updated_at, by=status
            )
        except Exception as exc:
            outcomes[status] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resolve, args=(status,)) for status in statuses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_two_operators_resolving_the_same_unknown_execution_at_once_exactly_one_wins():
    """Each thread has its own connection; both pass the same expected_updated_at at the same instant.

    The loser is refused with Conflict: the row changed since it read it (the winner's commit).
    """
    executions = unknown_executions(12)
    for execution in executions:
        outcomes = resolve_at_once(execution, ("success", "discarded"))
        winners = [status for status, value in outcomes.items() if isinstance(value, Execution)]
        losers = [value for value in outcomes.values() if not isinstance(value, Execution)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert isinstance(losers[0], Conflict), losers
        final = execution_of(execution.occurrence_id)
        assert final.status == winners[0]
        resolutions = [
            event for event in events_of(execution.occurrence_id) if event.from_status == Status.UNKNOWN
        ]
        assert [(event.to_status, event.node) for event in resolutions] == [(winners[0], winners[0])]
        assert ExecutionLog.objects.get(occurrence_id=execution.occurrence_id).status == winners[0]


@pytest.mark.processes
@needs_server
@pytest.mark.parametrize("status", ["success", "discarded"])
def test_an_operator_resolving_while_a_late_runner_finishes_wins_and_the_fenced_write_is_empty(
    runners, status
):
    """The runner returns from the handler, then stalls past its lease: renewals fail, and its own
    deadline check is switched off, so its late outcome reaches the database fence."""
    scheduler.register(definition(cron=NEVER, idempotent=False))
    late = runners.start("late", fault="pause_after_handler,renew_fails,no_self_fence", lease=2)
    execution = scheduler.trigger("report", params={"result": "from the late runner"})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.reached("pause_after_handler") == occurrence, message="handler returned")
    wait_for(lambda: status_of(occurrence) == Status.UNKNOWN, timeout=15, message="recovery")
    unknown = execution_of(occurrence)

    # The operator and the late runner at the same moment.
    runners.release("pause_after_handler")
    resolved = scheduler.executions.resolve_unknown(
        occurrence, status, expected_updated_at=unknown.updated_at, by="alice"
    )
    wait_for(lambda: "outcome not recorded" in late.output(), timeout=10, message="the late write")

    assert resolved.status == status
    final = execution_of(occurrence)
    assert (final.status, final.result, final.updated_at) == (status, None, resolved.updated_at)
    assert transitions(occurrence) == [
        ("", Status.PENDING),
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
        (Status.RUNNING, Status.UNKNOWN),
        (Status.UNKNOWN, status),
    ]
    assert events_of(occurrence)[-1].node == "alice"
    assert runners.starts() == ran_once("report", occurrence)
    assert late.alive
    assert late.stop() == 0


# -- PostgreSQL stopped for two minutes ----------------------------------------------------------

OUTAGE_SECONDS = 125
OUTAGE_LEASE = 20


@pytest.fixture
def own_postgres():
    """A PostgreSQL cluster of the test's own: the shared server is never stopped."""
    try:
        cluster = ThrowawayPostgres()
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot create a PostgreSQL cluster: {exc}")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


class OwnDatabase:
    """The scheduler's database on the throwaway cluster: migrated by a child, read with plain SQL."""

    name = "outage"

    def __init__(self, cluster: ThrowawayPostgres) -> None:
        self.cluster = cluster
        self.env = {
            "SCHEDULER_TEST_DB": "postgres",
            "PGHOST": "127.0.0.1",
            "PGPORT": str(cluster.port),
            "SCHEDULER_DB_NAME": self.name,
        }
        with cluster.connect() as conn:
            conn.execute(f"CREATE DATABASE {self.name}")
        self.django("from django.core.management import call_command; call_command('migrate', verbosity=0)")

    def django(self, code: str) -> None:
        """Run ``code`` in a child process with Django set up on this database."""
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        subprocess.run(
            [sys.executable, "-c", f"import django\ndjango.setup()\n{code}"],
            cwd=ROOT,
            env=environment,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        tables = {
            "task": Task._meta.db_table,
            "execution": Execution._meta.db_table,
            "event": ExecutionEvent._meta.db_table,
            "runner": Runner._meta.db_table,
        }
        with self.cluster.connect(self.name) as conn:
            return conn.execute(sql.format(**tables), params).fetchall()

    def executions(self, task_id: str) -> list[tuple[Any, ...]]:
        """(scheduled_for, status, error, occurrence_id) of a task, in minute order."""
        return self.rows(
            "SELECT scheduled_for, status, error, occurrence_id FROM {execution}"
            " WHERE task_id = %s ORDER BY scheduled_for",
            task_id,
        )


@pytest.mark.minute
@pytest.mark.processes
@pytest.mark.skipif(
    os.environ.get("SCHEDULER_TEST_DB") != "postgres", reason="stops a PostgreSQL cluster of its own"
)
def test_postgresql_stopped_for_two_minutes_runners_recover_without_restart_and_follow_the_misfire_policy(
    own_postgres, runners
):
    database = OwnDatabase(own_postgres)
    tasks = [f"minutely-{n}" for n in range(3)]
    database.django(
        "from scheduler_app import scheduler\n"
        f"for task_id in {tasks!r}:\n"
        "    scheduler.register({'id': task_id, 'name': task_id, 'cron': '* * * * *'})\n"
        f"scheduler.register({{'id': 'long', 'name': 'long', 'cron': {NEVER!r}}})\n"
        "scheduler.trigger('long', params={'ticker': 600})\n"
    )
    # Due now (within grace), so the minute before the outage runs without waiting for a boundary.
    database.rows(
        "UPDATE {task} SET next_run_at = date_trunc('minute', now()) WHERE id <> 'long' RETURNING id"
    )
    ((long_occurrence,),) = database.rows("SELECT occurrence_id FROM {execution} WHERE task_id = 'long'")
    nodes = [
        runners.start(node, "--workers", "2", fault="ticker", lease=OUTAGE_LEASE, **database.env)
        for node in ("node-a", "node-b")
    ]
    pids = {node.node_id: node.pid for node in nodes}

    def settled_away_from_a_boundary() -> bool:
        ((second,),) = database.rows("SELECT extract(second FROM now())")
        busy = database.rows(
            "SELECT 1 FROM {execution} WHERE task_id <> 'long' AND status IN ('pending', 'claimed', 'running')"
        )
        ran = database.rows("SELECT DISTINCT task_id FROM {execution} WHERE status = 'success'")
        # Both runners started (a slow start could otherwise still be retrying when the outage begins).
        started = dict(database.rows("SELECT node_id, pid FROM {runner}")) == pids
        return (
            3 <= second < 45
            and not busy
            and len(ran) == len(tasks)
            and bool(runners.ticks(long_occurrence))
            and started
        )

    wait_for(settled_away_from_a_boundary, timeout=90, interval=0.2)
    before = {task_id: database.executions(task_id) for task_id in tasks}
    assert all(status == Status.SUCCESS for rows in before.values() for _, status, _, _ in rows)
    assert (
        database.rows("SELECT status, owner FROM {execution} WHERE task_id = 'long'")[0][0] == Status.RUNNING
    )

    own_postgres.stop("fast")
    stopped_at = time.time()
    outage_ends = time.monotonic() + OUTAGE_SECONDS

    def outage_over() -> bool:
        assert all(node.alive for node in nodes), "a runner died while the database was down"
        return time.monotonic() >= outage_ends

    wait_for(outage_over, timeout=OUTAGE_SECONDS + 10, interval=0.5)
    # While the database was down the running attempt was cancelled on its runner's own clock,
    # within one lease of the last renewal the database could have accepted.
    effects = runners.ticks(long_occurrence)
    assert "cancelled" in dict(effects)
    assert max(at for _, at in effects) < stopped_at + OUTAGE_LEASE
    own_postgres.start()
    restarted_at = datetime.now(UTC)

    def recovered() -> bool:
        long_status = database.rows("SELECT status FROM {execution} WHERE task_id = 'long'")[0][0]
        after = [
            rows
            for rows in (database.executions(task_id) for task_id in tasks)
            if any(
                status == Status.SUCCESS and minute > restarted_at - timedelta(minutes=1)
                for minute, status, _, _ in rows
            )
        ]
        return long_status == Status.UNKNOWN and len(after) == len(tasks)

    wait_for(recovered, timeout=150, interval=0.5)
    for node in nodes:
        assert node.alive and node.pid == pids[node.node_id]
    assert dict(database.rows("SELECT node_id, pid FROM {runner}")) == pids, (
        database.rows("SELECT owner, count(*) FROM {execution} GROUP BY owner"),
        [node.output()[-3000:] for node in nodes],
    )

    # No duplicates: each occurrence started once (the long one included), one row per task and minute.
    started = runners.starts()
    assert set(started.values()) == {1}
    assert f"long,{long_occurrence},1" in started
    ((lost,),) = database.rows("SELECT error FROM {execution} WHERE task_id = 'long'")
    assert lost["reason"] == "lease expired"
    for task_id in tasks:
        rows = database.executions(task_id)
        minutes = [minute for minute, _, _, _ in rows]
        assert len(minutes) == len(set(minutes))
        last_before = max(minute for minute, _, _, _ in before[task_id])
        misfires = [row for row in rows if row[1] == Status.INTERRUPTED]
        # Exactly one record of the minutes missed during the outage, counting them all.
        assert len(misfires) == 1, rows
        missed_at, _, error, _ = misfires[0]
        assert error["reason"] == "misfire"
        count, first, last = MISFIRE.fullmatch(error["message"]).groups()
        first_at = datetime.fromisoformat(first).replace(tzinfo=UTC)
        last_at = datetime.fromisoformat(last).replace(tzinfo=UTC)
        assert missed_at == first_at == last_before + timedelta(minutes=1)
        assert int(count) == (last_at - first_at) // timedelta(minutes=1) + 1 >= 1
        assert last_at.timestamp() < restarted_at.timestamp()
        # Everything else ran; at most one minute was coalesced into the first run after the outage.
        ran = [minute for minute, status, _, _ in rows if status == Status.SUCCESS]
        assert len(ran) == len(rows) - 1
        after = [minute for minute in ran if minute > last_at]
        assert timedelta(minutes=1) <= after[0] - last_at <= timedelta(minutes=2)
        assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(after))
        assert {
            f"{task_id},{occurrence},1" for _, status, _, occurrence in rows if status == Status.SUCCESS
        } <= set(started)
    for node in nodes:
        assert node.stop() == 0


class OwnRedis:
    """A redis-server of the test's own on a free port, so stopping it disturbs nobody else."""

    def __init__(self) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_for(self.ping, message="redis-server answers")

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5)

    def ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def subscribers(self) -> int:
        return int(
            self.client().pubsub_numpat() + sum(n for _, n in self.client().pubsub_numsub(wakeup.CHANNEL))
        )

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.mark.processes
@needs_server
def test_redis_stopped_and_flushed_mid_run_leaves_the_runner_polling_and_wake_ups_resume(runners, settings):
    """Tick 10 s. Three triggers in a row each started within 1 s prove wake-ups (a tick alone
    would do that about once in a thousand); a trigger run while Redis is down proves polling."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = OwnRedis()
    server.start()
    try:
        scheduler.register(definition(cron=NEVER))
        runner = runners.start("redis-outage", "--tick-interval", "10", SCHEDULER_REDIS_URL=server.url)
        settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": server.url}
        wait_for(lambda: server.subscribers() >= 1, timeout=30, message="the runner's listener subscribes")

        def run(value: int, wait: float) -> float:
            execution = scheduler.trigger("report", params={"result": value}, wait=wait)
            assert (execution.status, execution.result) == (Status.SUCCESS, value)
            return (execution.started_at - execution.created_at).total_seconds()

        assert max(run(value, wait=15) for value in (1, 2, 3)) < 1
        server.client().flushall()
        server.kill()
        run(4, wait=40)  # Redis is down: the runner's next tick finds it
        assert runner.alive
        server.start()
        wait_for(lambda: server.subscribers() >= 1, timeout=30, message="the listener subscribes again")
        assert max(run(value, wait=15) for value in (5, 6, 7)) < 1
        assert runner.alive
        assert runner.stop() == 0
    finally:
        server.kill()
