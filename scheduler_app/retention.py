"""What is kept and for how long: the journal (JOURNAL_RETENTION_DAYS) and the logs (MAX_LOGS,
RETENTION_DAYS), pruned by one runner of the cluster at a time, at most once a minute each; the
rows of runners not seen for RUNNER_RETENTION, at most once an hour."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import router, transaction

from scheduler_app.conf import scheduler_settings
from scheduler_app.logs import ids_of, log_alias
from scheduler_app.models import TERMINAL, Execution, ExecutionEvent, ExecutionLog, MaintenanceMark, Runner

logger = logging.getLogger("scheduler_app")

EVERY = timedelta(minutes=1)
LOG_MARK = "log-retention"
JOURNAL_MARK = "journal-retention"
# Executions deleted per transaction: short enough that no claim waits on it for long.
JOURNAL_BATCH = 1000
# Log rows are deleted by their ids, one per attempt: a batch of retried executions names more.
LOG_IDS_PER_DELETE = 5000
# Seconds one turn may spend deleting; the rest waits for the next turn, a minute later.
JOURNAL_BUDGET_SECONDS = 10.0
RUNNER_MARK = "runner-retention"
# A runner not seen for this long is history (each restart adds a row: the node id is host:pid):
# its row goes, so that health checks, metrics and the dashboard read a bounded table.
RUNNER_RETENTION = timedelta(days=7)
RUNNER_EVERY = timedelta(hours=1)
_next_runner_turn = 0.0


@dataclass(frozen=True)
class Pruned:
    """What one turn of journal retention deleted, and how long it took."""

    executions: int = 0
    events: int = 0
    logs: int = 0
    seconds: float = 0.0


def take_turn(name: str, now: datetime, every: timedelta = EVERY) -> bool:
    """True for the one caller in the cluster whose turn at chore ``name`` it is (at most once
    per ``every``): a compare-and-set on its MaintenanceMark row."""
    MaintenanceMark.objects.get_or_create(name=name, defaults={"last_run_at": now - every})
    return bool(
        MaintenanceMark.objects.filter(name=name, last_run_at__lte=now - every).update(last_run_at=now)
    )


def prune(now: datetime) -> None:
    """Every chore, each when its settings ask for it and its turn has come."""
    prune_logs(now)
    prune_journal(now)
    global _next_runner_turn
    # Asked at most once an hour by each runner: an idle one sends no statement for it otherwise.
    if time.monotonic() >= _next_runner_turn:
        _next_runner_turn = time.monotonic() + RUNNER_EVERY.total_seconds()
        prune_runners(now)


def prune_runners(now: datetime) -> int:
    """Delete the rows of runners last seen more than RUNNER_RETENTION ago; how many went."""
    if not take_turn(RUNNER_MARK, now, RUNNER_EVERY):
        return 0
    return int(Runner.objects.filter(last_seen_at__lt=now - RUNNER_RETENTION).delete()[0])


def prune_logs(now: datetime) -> int:
    """Apply MAX_LOGS and RETENTION_DAYS to the log rows (never the journal); how many went."""
    max_logs = scheduler_settings.MAX_LOGS
    days = scheduler_settings.RETENTION_DAYS
    if not max_logs and not days:
        return 0
    if not take_turn(LOG_MARK, now):
        return 0
    logs = ExecutionLog.objects.using(log_alias())
    deleted = 0
    if days:
        deleted += logs.filter(finished_at__lt=now - timedelta(days=days)).delete()[0]
    if max_logs:
        boundary = list(
            logs.order_by("-finished_at", "-id").values_list("finished_at", "id")[max_logs : max_logs + 1]
        )
        if boundary:
            finished_at, oldest_kept = boundary[0]
            deleted += logs.filter(finished_at__lt=finished_at).delete()[0]
            deleted += logs.filter(finished_at=finished_at, id__lte=oldest_kept).delete()[0]
    return deleted


def prune_journal(
    now: datetime, *, batch: int = JOURNAL_BATCH, budget_seconds: float = JOURNAL_BUDGET_SECONDS
) -> Pruned:
    """Delete executions that ended (success, failed, interrupted, discarded) more than
    JOURNAL_RETENTION_DAYS ago, with their events and log rows, oldest first, ``batch`` at a time,
    until none is left or ``budget_seconds`` have passed. Never an unknown, pending, claimed or
    running one."""
    days = scheduler_settings.JOURNAL_RETENTION_DAYS
    if not days or not take_turn(JOURNAL_MARK, now):
        return Pruned()
    cutoff = now - timedelta(days=days)
    started = time.monotonic()
    executions = events = logs = 0
    while True:
        gone, events_gone, logs_gone = _delete_batch(cutoff, batch)
        executions, events, logs = executions + gone, events + events_gone, logs + logs_gone
        if gone < batch or time.monotonic() - started >= budget_seconds:
            break
    pruned = Pruned(executions, events, logs, round(time.monotonic() - started, 3))
    if executions:
        logger.info(
            "journal retention: deleted %s executions, %s events and %s log rows that ended before %s in %.3fs",
            executions,
            events,
            logs,
            cutoff.isoformat(timespec="seconds"),
            pruned.seconds,
        )
    return pruned


def _delete_batch(cutoff: datetime, batch: int) -> tuple[int, int, int]:
    """One short transaction: up to ``batch`` ended executions older than ``cutoff`` (rows another
    transaction holds are left for the next turn) and their events; then their log rows."""
    alias = router.db_for_write(Execution)
    with transaction.atomic(using=alias):
        rows = list(
            Execution.objects.using(alias)
            .select_for_update(skip_locked=True)
            .filter(status__in=TERMINAL, finished_at__lt=cutoff)
            .order_by("finished_at")
            .values_list("sequence", "occurrence_id", "attempt")[:batch]
        )
        if not rows:
            return 0, 0, 0
        _, deleted = (
            Execution.objects.using(alias)
            .filter(sequence__in=[sequence for sequence, _, _ in rows])
            .only("sequence")
            .delete()
        )
    ids = [log for _, occurrence, attempts in rows for log in ids_of(occurrence, attempts)]
    logs = 0
    for start in range(0, len(ids), LOG_IDS_PER_DELETE):
        chunk = ids[start : start + LOG_IDS_PER_DELETE]
        logs += ExecutionLog.objects.using(log_alias()).filter(id__in=chunk).delete()[0]
    return deleted.get(Execution._meta.label, 0), deleted.get(ExecutionEvent._meta.label, 0), logs
