"""The runner process: tick loop, claims, lease renewal, dispatch to workers and shutdown."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections, router, transaction

from scheduler_app import __version__, alerts, database_errors, db, journal, logs, retention, wakeup
from scheduler_app.conf import scheduler_settings
from scheduler_app.exceptions import StorageError
from scheduler_app.models import ENDED, LEASED, Execution, Runner, Status
from scheduler_app.runner import claims, limits, pauses, scheduling
from scheduler_app.runner.attempt import Attempt, run_attempt
from scheduler_app.runner.clock import Clock, DatabaseClock
from scheduler_app.runner.workers import WorkerPool
from scheduler_app.runner.writer import JournalWriter
from scheduler_app.services import scheduler
from scheduler_app.statements import journal_statements

logger = logging.getLogger("scheduler_app")

MAX_BACKOFF = 30.0
# At most one tick per this many seconds is started by trigger wake-ups.
TRIGGER_GATHER = 0.1
# Wake this long after a known due instant, so the probe's clock has passed it.
EVENT_SLACK = 0.002
# How long after a probing tick that claimed the next ticks may claim without probing: the most a
# busy runner delays a minute come due or an expired lease (bench/w1_burst.py --top showed the
# probe, once per claim, as a fifth of PostgreSQL's time in a burst).
PROBE_REUSE_SECONDS = 0.25
DATABASE_ERRORS = (DatabaseError, InterfaceError)
# Worker threads when WORKERS is None. Threads start as work arrives and end after a minute
# without any (runner/workers.py), so an idle runner holds none. SQLite takes one write at a time:
# more threads there would only queue on its lock.
DEFAULT_WORKERS = 16
SQLITE_WORKERS = 4
# A runner writes its heartbeat (and renews its leases) every third of its lease, or this often
# if that is sooner: a runner that died is seen silent within about two of these.
HEARTBEAT_SECONDS = 30.0
# A threaded runner holds up to this many times its workers in attempts, running or claimed
# ahead: a burst then takes fewer, larger claims, and its workers find their next attempt queued
# (bench/trigger_many.py, bench/w1_burst.py; docs/benchmarks.md).
CLAIM_AHEAD = 8


class RunnerFailed(Exception):
    """``run(once=True)`` could not do its one tick; the message says why, without secrets."""


def default_workers() -> int:
    """WORKERS when it is None, by the journal's database."""
    connection = connections[router.db_for_write(Execution)]
    return (
        SQLITE_WORKERS if journal_statements(connection).writes_one_at_a_time(connection) else DEFAULT_WORKERS
    )


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class SchedulerLoop:
    """One scheduler process: create occurrences, claim them, run them, keep their leases."""

    def __init__(
        self,
        *,
        node_id: str | None = None,
        workers: int | None = None,
        tick_interval: float | None = None,
        lease_seconds: float | None = None,
        clock: Clock | None = None,
        drain_seconds: float | None = None,
        inline: bool = False,
    ) -> None:
        self.node_id = node_id or scheduler_settings.NODE_ID or default_node_id()
        if workers is None:
            workers = scheduler_settings.WORKERS or default_workers()
        self.workers = int(workers)
        self.tick_interval = float(
            tick_interval if tick_interval is not None else scheduler_settings.TICK_INTERVAL
        )
        self.lease_seconds = float(
            lease_seconds if lease_seconds is not None else scheduler_settings.LEASE_SECONDS
        )
        self.drain_seconds = float(
            drain_seconds if drain_seconds is not None else scheduler_settings.DRAIN_SECONDS
        )
        self.heartbeat_seconds = min(self.lease_seconds / 3, max(HEARTBEAT_SECONDS, self.tick_interval))
        self.clock: Clock = clock or DatabaseClock()
        self.in_flight: dict[int, Attempt] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        # Set with ``_wake`` when an attempt ended and the runner can take more: claim at once.
        self._freed = threading.Event()
        self._stopping = threading.Event()
        self._pool: WorkerPool | None = None
        self._writer: JournalWriter | None = None
        self._listener: wakeup.Waker | None = None
        self._last_renewal = 0.0
        self._last_prune = 0.0
        self._pruning: threading.Thread | None = None
        self._last_stop_read = 0.0
        # The last probe: when it was sent (monotonic) and the database time it read.
        self._anchor = (time.monotonic(), datetime.now(UTC))
        self._next_event: float | None = None
        self._tick_started = 0.0
        self._claimed_nothing = False  # the last tick had due rows and claimed none of them
        # Due rows may be waiting that no wake-up will announce: the last claim passed over some,
        # or a tick left due rows unclaimed (its workers were full). See _forget().
        self._due_left = True
        # Until when (monotonic) a tick may claim without probing first: set by a tick that claimed
        # and left nothing else to do; see _probe_skippable.
        self._claim_without_probe_until = 0.0
        self._shutdown_requested = False
        self._shutdown_reason = "shutdown"
        self.inline = inline

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Sync TASKS from settings, record this runner and start its workers."""
        scheduler.refresh_tasks()
        self.clock.observe(db.probe().now)
        now = self.clock.now()
        Runner.objects.update_or_create(
            node_id=self.node_id,
            defaults={
                "host": socket.gethostname()[:200],
                "pid": os.getpid(),
                "started_at": now,
                "last_seen_at": now,
                "silent_after": self._silent_after(now),
                "stopped_at": None,
                "version": __version__,
            },
        )
        self._last_renewal = time.monotonic()
        if self.workers > 0 and not self.inline:
            self._writer = JournalWriter(self.node_id, self.clock)
            self._pool = WorkerPool(self.workers, self._run_attempt)
        logger.info("%s", self.description())

    def description(self) -> str:
        """One line saying who this runner is: version, node, database, workers, wake-ups."""
        wakeups = wakeup.description(self.tick_interval)
        return (
            f"scheduler_app {__version__} runner {self.node_id} started:"
            f" {database_errors.location(DEFAULT_DB_ALIAS)}, {self.workers} workers, {wakeups}"
        )

    def _start_when_database_is_up(self, once: bool) -> bool:
        """Start, retrying with backoff while the database is unreachable; False if shut down first.

        With ``once`` the first failure raises RunnerFailed instead.
        """
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                self.start()
                return True
            except (StorageError, *DATABASE_ERRORS) as exc:
                cause = database_errors.describe(exc)
                db.drop_broken_connections()
                if once:
                    raise RunnerFailed(f"cannot start: {cause}") from None
                logger.warning("cannot start: %s; next try in %.1fs", cause, backoff)
                self._wake.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
        return False

    def run(self, *, once: bool = False, on_start: Callable[[], None] | None = None) -> None:
        """Tick until shutdown() (or once, then drain); ``on_start`` is called once started.

        With ``once``, a tick the database refused raises RunnerFailed after the drain.
        """
        with journal_statements().kept_plans():
            self._run(once, on_start)

    def _run(self, once: bool, on_start: Callable[[], None] | None) -> None:
        try:
            started = self._start_when_database_is_up(once)
        except RunnerFailed:
            self.stop()
            raise
        if not started:
            self.stop()
            return
        if not once:
            # Only a runner that goes on ticking listens (a connection of its own on PostgreSQL).
            self._listener = wakeup.start_listener(self._wake)
        if on_start is not None:
            on_start()
        failure = None
        backoff = 0.0
        try:
            while not self._stopping.is_set():
                retry_now = False
                pause = self.tick_interval
                try:
                    with db.counting_statements([DEFAULT_DB_ALIAS, logs.log_alias()]) as statements:
                        worked = self.tick()
                    backoff = 0.0
                    if not worked:
                        # An idle runner sends at most one statement per tick interval: a tick that
                        # also wrote the heartbeat or pruned logs pays for it with a longer pause.
                        pause = self.tick_interval * max(1, statements.count)
                except DATABASE_ERRORS as exc:
                    failure = database_errors.describe(exc)
                    db.drop_broken_connections()
                    # The first failure is often a connection the server dropped while it sat
                    # idle: reconnect at once; back off only if the database stays unreachable.
                    retry_now = backoff == 0.0 and not once
                    backoff = min(MAX_BACKOFF, max(self.tick_interval, backoff * 2 or 1.0))
                    if not once:
                        logger.warning("%s; next try in %.1fs", failure, 0.0 if retry_now else backoff)
                except Exception:
                    # A bug or bad row must not kill the runner; it retries with backoff.
                    failure = "the tick failed (the traceback is logged)"
                    backoff = min(MAX_BACKOFF, max(self.tick_interval, backoff * 2 or 1.0))
                    logger.exception("tick failed; next try in %.1fs", backoff)
                self.cancel_overdue()
                self.enforce_time_limits()
                self._read_stop_requests()
                if once:
                    self.wait_idle(self.drain_seconds, watch_limits=True)
                    break
                if not retry_now:
                    self._wait_for_next_tick(self._pause(backoff or pause))
        finally:
            self.stop()
        if once and failure is not None:
            raise RunnerFailed(failure)

    def _wait_for_next_tick(self, pause: float) -> None:
        """Sleep ``pause`` at most: less when an attempt ended (claim again at once), a trigger's
        wake-up came, more may be due, or the runner is stopping.

        A stream of triggers starts at most one tick per TRIGGER_GATHER, so those that arrive
        meanwhile share one claim; a lone trigger does not wait, nor does a claim after an attempt
        ended. Runners woken together claim together, and one finds the rows held by the other's
        claim: the one that took nothing waits half a gather more, so that their claims alternate
        instead of colliding.
        """
        woken = self._wake.wait(pause)
        self._wake.clear()
        if self._freed.is_set():
            self._freed.clear()
            if self._listener is not None:
                self._listener.heard.clear()
            return
        if woken and self._listener is not None and self._listener.heard.is_set():
            self._listener.heard.clear()
            gather = TRIGGER_GATHER * (1.5 if self._claimed_nothing else 1.0)
            self._freed.wait(gather - (time.monotonic() - self._tick_started))
            self._freed.clear()

    def shutdown(self, reason: str = "shutdown") -> None:
        """Stop claiming and cancel in-flight attempts; run() then drains and returns."""
        self._shutdown_reason = reason
        self._shutdown_requested = True
        self._stopping.set()
        with self._lock:
            attempts = [attempt for attempt in self.in_flight.values() if not attempt.handed_off]
        self._cancel_for_shutdown(attempts)
        self._wake.set()

    def _cancel_for_shutdown(self, attempts: list[Attempt]) -> None:
        # Those not started yet first: a worker freed by cancelling a running one must find the
        # queued ones already cancelled, so they are released, not started and interrupted.
        for attempt in sorted(attempts, key=lambda attempt: attempt.started is not None):
            attempt.cancel(self._shutdown_reason, release=True)

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.stop()
        if self._pool is not None:
            started = time.monotonic()
            if self.in_flight:
                logger.warning(
                    "stopping: draining %s attempts for up to %ss%s",
                    len(self.in_flight),
                    self.drain_seconds,
                    " (signal again to exit at once)" if self._shutdown_requested else "",
                )
            else:
                logger.info("stopping: no attempt in flight")
            # What follows a handed-off outcome's commit is queued behind the pool's stop: wait for
            # the attempts in flight to end before stopping it.
            idle = self.wait_idle(self.drain_seconds)
            drained = self._pool.stop(max(0.0, self.drain_seconds - (time.monotonic() - started))) and idle
            if not drained:
                logger.warning("drain timed out with %s attempts in flight", len(self.in_flight))
        if self._writer is not None:
            self._writer.stop(self.drain_seconds)
        if self._pruning is not None:
            self._pruning.join(self.drain_seconds)
        with suppress(*DATABASE_ERRORS):
            Runner.objects.filter(node_id=self.node_id).update(
                stopped_at=self.clock.now(), last_seen_at=self.clock.now()
            )
        connections.close_all()

    def wait_idle(self, timeout: float, *, watch_limits: bool = False) -> bool:
        """Wait until no attempt is in flight (used by --once and tests); with ``watch_limits``, enforce
        their time limits meanwhile (only from the loop's own thread)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if watch_limits:
                self.enforce_time_limits()
            with self._lock:
                if not self.in_flight:
                    return True
            self._wake.wait(0.05)
            self._wake.clear()
        return False

    # -- one tick ----------------------------------------------------------

    def tick(self) -> bool:
        """One pass: probe, then schedule, recover, claim, renew and prune only when needed.

        True when the tick created, recovered or claimed executions.
        """
        self._tick_started = time.monotonic()
        # Stop overdue attempts before anything else: this tick may recover their rows.
        self.cancel_overdue()
        self.enforce_time_limits()
        db.drop_broken_connections()
        if self._probe_skippable():
            if not self._needs_work():
                self._due_left = True
                return False
            if self.claim_and_dispatch(self.clock.now()):
                return True
            # Nothing left to claim: probe, to learn when something comes due next.
            self._claim_without_probe_until = 0.0
        sent = time.monotonic()
        probe = db.probe()
        self.clock.observe(probe.now)
        now = self.clock.now()
        self._anchor = (sent, now)
        instants = (probe.next_run_at, probe.next_due_at, probe.next_lease_expiry, probe.next_resume_at)
        upcoming = [t for t in instants if t and t > now]
        self._next_event = self._local(min(upcoming)) + EVENT_SLACK if upcoming else None
        worked = False
        # More tasks to resume or to schedule than one tick takes: the next tick probes again.
        unfinished = False
        if probe.next_resume_at is not None and probe.next_resume_at <= now:
            # The resumed tasks fire from their next fire time on: the next tick's probe sees it.
            more = pauses.resume_ended(now, self.node_id)
            worked = True
            unfinished = more
            if more:
                self._wake.set()
        due = probe.next_due_at is not None and probe.next_due_at <= now
        if probe.next_run_at is not None and probe.next_run_at <= now:
            created, more = scheduling.schedule_due(now, self.node_id)
            worked = bool(created) or more
            for execution, task_name, _ in created:
                if execution.status == Status.INTERRUPTED:
                    self._write_log(execution, task_name, Status.INTERRUPTED)
                else:
                    due = True
            unfinished = unfinished or more
            if more:
                # Claim this batch now and schedule the next one at once, not after every batch.
                self._wake.set()
        if probe.next_lease_expiry is not None and probe.next_lease_expiry < now:
            for ended in claims.recover_expired(now, self.node_id):
                self._write_log(ended.execution, ended.task_name, ended.log_status)
                # The attempt's log row says unknown; an idempotent execution put back to pending is not.
                alerts.ended(ended.execution, ended.execution.status, now)
            worked = True
        self._claimed_nothing = False
        self._claim_without_probe_until = 0.0
        if due and not self._stopping.is_set():
            if self._needs_work():
                claimed = self.claim_and_dispatch(now)
                self._claimed_nothing = claimed == 0
                worked = claimed > 0 or worked
                if claimed and not unfinished:
                    self._claim_without_probe_until = sent + min(self.tick_interval, PROBE_REUSE_SECONDS)
            else:
                self._due_left = True
        if time.monotonic() - self._last_renewal >= self.heartbeat_seconds:
            self.renew_leases()
        if time.monotonic() - self._last_prune >= 60:
            self._last_prune = time.monotonic()
            self._prune(now)
        return worked

    def _probe_skippable(self) -> bool:
        """Whether this tick claims before it probes (when its workers have room), and probes only
        when the claim finds nothing: a threaded runner whose last probing tick claimed, with
        nothing else left to do (no more tasks to schedule or to resume), less than
        PROBE_REUSE_SECONDS ago. While it claims this way a burst costs one probe per
        PROBE_REUSE_SECONDS instead of one per claim; what the probe would have found meanwhile
        (a minute come due, a lease expired) waits for the next probe, at most that long."""
        return not (
            self.inline or self._stopping.is_set() or time.monotonic() >= self._claim_without_probe_until
        )

    def _prune(self, now: datetime) -> None:
        """Retention's turn: on a thread of its own in a runner with workers, so that claims go on
        while it deletes; never two at once."""
        if self._pool is None:
            retention.prune(now)
            return
        if self._pruning is not None and self._pruning.is_alive():
            return

        def prune() -> None:
            try:
                retention.prune(now)
            except DATABASE_ERRORS as exc:
                logger.warning("retention failed: %s; next try in a minute", database_errors.describe(exc))
            except Exception:
                logger.exception("retention failed; next try in a minute")
            finally:
                connections.close_all()

        self._pruning = threading.Thread(target=prune, name="scheduler-retention", daemon=True)
        self._pruning.start()

    def _needs_work(self) -> bool:
        """Claim again once the queued batch has been taken up, so claims stay batched."""
        busy = self._busy()
        return busy < self.workers if self.inline else busy <= self.workers

    def _busy(self) -> int:
        """Attempts in flight that still hold a worker or wait for one (not those handed off)."""
        with self._lock:
            return sum(1 for attempt in self.in_flight.values() if not attempt.handed_off)

    def claim_and_dispatch(self, now: datetime) -> int:
        # A worker that finishes finds its next attempt queued instead of waiting for a claim.
        capacity = self.workers if self.inline else self.workers * CLAIM_AHEAD
        free = capacity - self._busy()
        # Attempts a waiting worker takes at once are started by the claim itself, in its
        # transaction; the others stay claimed until a worker is free to start them.
        start = 0 if self._pool is None else self._pool.idle()
        claimed, ended, self._due_left = claims.claim(
            now, self.node_id, free, self.lease_seconds, start=start
        )
        for item in ended:
            self._write_log(item.execution, item.task_name, item.log_status)
        attempts = []
        for claim in claimed:
            attempt = Attempt(claim, journal=self._writer, follow_up=self._follow_up if self._pool else None)
            if claim.started is not None:
                attempt.started = (claim.started, now)
            assert claim.execution.lease_expires_at is not None
            attempt.lease_deadline = self._local(claim.execution.lease_expires_at)
            with self._lock:
                self.in_flight[claim.execution.sequence] = attempt
            attempts.append(attempt)
        if self._shutdown_requested:
            # A shutdown that came during this claim cancelled what was in flight before these:
            # they end as those did, released, or interrupted where the claim started them.
            self._cancel_for_shutdown(attempts)
        for attempt in attempts:
            if self._pool is None:
                self._run_attempt(attempt)
            else:
                self._pool.submit(attempt)
        return len(attempts)

    def _silent_after(self, now: datetime) -> datetime:
        """When this runner is silent unless it wrote a heartbeat since ``now``: two heartbeat
        periods, and two ticks and a second for a slow tick."""
        return now + timedelta(seconds=2 * self.heartbeat_seconds + 2 * self.tick_interval + 1)

    def _local(self, instant: datetime) -> float:
        """The monotonic time at which the database reaches ``instant``, never later than it does.

        The database read its clock after the probe was sent, so counting from the send
        time errs early, whatever the round trip; a lease therefore ends on this runner's
        clock no later than in the database.
        """
        sent, database_now = self._anchor
        return sent + (instant - database_now).total_seconds()

    def _fence_margin(self) -> float:
        """How long before its lease ends an attempt is cancelled: time for the handler to stop."""
        return max(0.1, min(2.0, self.lease_seconds * 0.05))

    def _pause(self, wanted: float) -> float:
        """Sleep no longer than the next known due instant (a cron minute, a retry, a lease expiry),
        the earliest local lease deadline or time limit, so work starts and overdue attempts are
        cancelled on time."""
        with self._lock:
            deadlines = [
                a.lease_deadline - self._fence_margin()
                for a in self.in_flight.values()
                if not a.cancelled.is_set() and not a.handed_off
            ]
            deadlines += [
                limit.next_deadline()
                for a in self.in_flight.values()
                if (limit := limits.watched(a)) is not None
            ]
        if self._next_event is not None:
            deadlines.append(self._next_event)
        if not deadlines:
            return wanted
        return max(0.0, min(wanted, min(deadlines) - time.monotonic()))

    def cancel_overdue(self) -> None:
        """Cancel attempts whose lease could not be renewed in time: another runner may own them now."""
        now = time.monotonic() + self._fence_margin()
        with self._lock:
            overdue = [
                attempt
                for attempt in self.in_flight.values()
                if now >= attempt.lease_deadline and not attempt.handed_off
            ]
        for attempt in overdue:
            attempt.cancel("lease lost", lease_lost=True)

    def enforce_time_limits(self) -> None:
        """Cancel attempts at their time limit; abandon those whose handler outlived the grace after it
        (recorded unknown, their worker replaced)."""
        now = time.monotonic()
        with self._lock:
            attempts = list(self.in_flight.values())
        for attempt in attempts:
            if attempt.abandoned:
                self._record_abandoned(attempt)  # its first try met a database error
                continue
            step = limits.step(attempt, now)
            if step == limits.CANCEL:
                limits.time_out(attempt, now)
            elif step == limits.ABANDON and attempt.abandon():
                if self._pool is not None:
                    self._pool.replace(attempt)
                self._record_abandoned(attempt)

    def _record_abandoned(self, attempt: Attempt) -> None:
        # Until it is recorded the attempt keeps its lease, renewed with the others', unless the
        # lease is lost: recovery then applies.
        lost = attempt.lease_lost or time.monotonic() + self._fence_margin() >= attempt.lease_deadline
        if lost or limits.record_unknown(attempt, self.node_id, self.clock):
            self._forget(attempt)

    def _forget(self, attempt: Attempt) -> None:
        """Take an attempt out of flight (never a later attempt of the same execution).

        Its worker's room is claimed again at once when due rows may be waiting for it. When the
        last claim took every due row it read, and this attempt ended for good, only new rows can
        fill it, and on a runner with wake-ups they announce themselves: a stream of triggers is
        then claimed once per wake-up's gather, not once per attempt that ends."""
        sequence = attempt.claim.execution.sequence
        with self._lock:
            if self.in_flight.get(sequence) is attempt:
                del self.in_flight[sequence]
        ended = attempt.claim.execution.status in ENDED
        if self._needs_work() and (self._due_left or self._listener is None or not ended):
            self._freed.set()
            self._wake.set()

    def _read_stop_requests(self) -> None:
        """Cancel running attempts an operator asked to stop: one indexed read of their rows, at most
        once per tick interval and only while attempts run, so a stop lands within about a tick
        (the lease renewal reads the flags too, every heartbeat)."""
        if time.monotonic() - self._last_stop_read < self.tick_interval:
            return
        with self._lock:
            running = {
                sequence: attempt
                for sequence, attempt in self.in_flight.items()
                if not attempt.handed_off and not attempt.cancelled.is_set()
            }
        if not running:
            return
        self._last_stop_read = time.monotonic()
        try:
            stopped = Execution.objects.filter(sequence__in=list(running), stop_requested=True).values_list(
                "sequence", flat=True
            )
            for sequence in list(stopped):
                running[sequence].cancel("stop requested")
        except DATABASE_ERRORS as exc:
            # The renewal reads the flags too; a failure here only delays the stop until then.
            logger.warning("reading stop requests failed: %s", database_errors.describe(exc))
            db.drop_broken_connections()

    def renew_leases(self) -> None:
        """Extend the leases of in-flight attempts; cancel those lost or stop-requested."""
        self._last_renewal = time.monotonic()
        now = self.clock.now()
        with self._lock:
            attempts = [attempt for attempt in self.in_flight.values() if not attempt.handed_off]
        try:
            # A heartbeat also undoes an operator's "mark as stopped" of a runner thought gone.
            Runner.objects.filter(node_id=self.node_id).update(
                last_seen_at=now, silent_after=self._silent_after(now), stopped_at=None
            )
            if not attempts:
                return
            tokens = {attempt.claim.execution.sequence: attempt.claim.token for attempt in attempts}
            with transaction.atomic():
                state = {
                    sequence: row[2]
                    for sequence, row in journal.lock_rows(tokens).items()
                    if journal.holds(row, tokens[sequence], *LEASED, starting=False)
                }
                lease_until = now + timedelta(seconds=self.lease_seconds)
                Execution.objects.filter(sequence__in=list(state)).update(lease_expires_at=lease_until)
        except DATABASE_ERRORS:
            logger.warning("lease renewal failed; attempts past their lease will be cancelled")
            raise
        for attempt in attempts:
            sequence = attempt.claim.execution.sequence
            if sequence not in state:
                attempt.cancel("lease lost", lease_lost=True)
            else:
                attempt.lease_deadline = self._local(lease_until)
                if state[sequence]:
                    attempt.cancel("stop requested")

    # -- helpers -------------------------------------------------------------

    def _run_attempt(self, attempt: Attempt) -> None:
        handed_off = False
        try:
            handed_off = run_attempt(attempt, self.node_id, self.clock)
        except Exception:
            logger.exception("attempt of %s crashed the worker", attempt.claim.execution.occurrence_id)
        finally:
            db.drop_broken_connections()
            if not handed_off:
                self._forget(attempt)

    def _follow_up(self, attempt: Attempt, work: Callable[[], object] | None) -> None:
        """Called on the writer's thread once a handed-off outcome is committed (or failed): a worker
        runs what follows, and only then is the attempt out of flight (at once when nothing does)."""
        if work is None:
            self._forget(attempt)
            return

        def follow() -> None:
            try:
                work()
            except Exception:
                logger.exception("recording the outcome of %s failed", attempt.claim.execution.occurrence_id)
            finally:
                db.drop_broken_connections()
                self._forget(attempt)

        assert self._pool is not None
        self._pool.submit(follow)

    def _write_log(self, execution: Execution, task_name: str, status: str) -> None:
        finished = execution.finished_at or self.clock.now()
        log = logs.build_log(
            execution,
            task_name,
            execution.attempt,
            status,
            execution.started_at,
            finished,
            None,
            execution.error,
        )
        logs.write_and_confirm(execution, [log])
