"""Prometheus metrics of the whole cluster, read from the database at each scrape, so any node can
serve them: mount ``path("metrics/", scheduler_app.metrics.view)``. Needs the ``metrics`` extra
(prometheus-client). Every figure comes from an indexed query of bounded cost, none per task."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from scheduler_app import health, lateness
from scheduler_app.db import probe
from scheduler_app.logs import log_alias
from scheduler_app.models import TERMINAL, Execution, ExecutionLog, Status

WINDOW = timedelta(hours=1)
# The histograms read at most this many of the executions that ended within WINDOW, the newest.
SAMPLE = 10_000
LAG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# One count per status, each answered by the partial index of its status on PostgreSQL.
ACTIVE = (Status.PENDING, Status.CLAIMED, Status.RUNNING, Status.UNKNOWN)


class ClusterCollector:
    """What the journal says now; collected at each scrape."""

    def collect(self) -> Iterator[Metric]:
        now = probe().now
        report = health.check(now)
        states = GaugeMetricFamily(
            "scheduler_executions", "Executions waiting, claimed, running or unknown now.", labels=["status"]
        )
        for status in ACTIVE:
            count = (
                report.unknown
                if status == Status.UNKNOWN
                else Execution.objects.filter(status=status).count()
            )
            states.add_metric([status], count)
        yield states
        yield GaugeMetricFamily(
            "scheduler_executions_late",
            "Pending executions due for longer than the misfire grace.",
            value=report.late,
        )
        oldest = report.oldest_unknown
        yield GaugeMetricFamily(
            "scheduler_unknown_oldest_age_seconds",
            "How long the oldest unknown execution has waited for an operator; 0 when none.",
            value=(now - oldest).total_seconds() if oldest else 0.0,
        )
        yield GaugeMetricFamily(
            "scheduler_log_failures", "Executions whose log rows wait for repair.", value=report.log_failures
        )
        yield GaugeMetricFamily(
            "scheduler_tasks_unschedulable",
            "Enabled tasks that will not fire: their stored schedule cannot be evaluated.",
            value=len(report.unschedulable),
        )
        runners = GaugeMetricFamily("scheduler_runners", "Runners by state.", labels=["state"])
        by_state = {"alive": 0, "silent": 0, "stopped": 0}
        for runner in report.runners:
            by_state[str(getattr(runner, "state", ""))] += 1
        for state, n in by_state.items():
            runners.add_metric([state], n)
        yield runners
        recent = Execution.objects.filter(status__in=TERMINAL, finished_at__gte=now - WINDOW)
        ended = GaugeMetricFamily(
            "scheduler_executions_ended_last_hour",
            "Executions that ended in the last hour, by status and trigger type.",
            labels=["status", "trigger_type"],
        )
        counted = recent.order_by().values("status", "trigger_type").annotate(n=Count("sequence"))
        for row in counted.values_list("status", "trigger_type", "n"):
            ended.add_metric([row[0], row[1]], row[2])
        yield ended
        # One log row per ended attempt: a failed attempt counts whether or not it is retried,
        # where the executions above show only their final status.
        attempts = GaugeMetricFamily(
            "scheduler_attempts_ended_last_hour",
            "Attempts that ended in the last hour, by status, retried failures included.",
            labels=["status"],
        )
        logged = (
            ExecutionLog.objects.using(log_alias())
            .filter(finished_at__gte=now - WINDOW)
            .order_by()
            .values("status")
            .annotate(n=Count("id"))
        )
        for outcome, n in logged.values_list("status", "n"):
            attempts.add_metric([outcome], n)
        yield attempts
        # The records of misfires (one per task and catch-up, counting the fire times it skipped).
        records = recent.filter(status=Status.INTERRUPTED, error__reason="misfire").order_by("-finished_at")
        yield GaugeMetricFamily(
            "scheduler_fire_times_missed_last_hour",
            "Scheduled fire times skipped as misfires (not run) in the last hour.",
            value=sum(
                (missed or {}).get("count", 0)
                for missed in records.values_list("missed_fire_times", flat=True)[:SAMPLE]
            ),
        )
        times = list(
            recent.exclude(started_at=None)
            .order_by("-finished_at")
            .values_list("due_at", "started_at", "finished_at", "created_at")[:SAMPLE]
        )
        yield _histogram(
            "scheduler_start_lag_seconds",
            "Due-to-start lag of the executions that ended in the last hour (the newest 10,000).",
            [lateness.start_lag(due, created, started) for due, started, _, created in times if started],
            LAG_BUCKETS,
        )
        yield _histogram(
            "scheduler_duration_seconds",
            "Last attempt's duration of the executions that ended in the last hour (the newest 10,000).",
            [
                (finished - started).total_seconds()
                for _, started, finished, _ in times
                if started and finished
            ],
            DURATION_BUCKETS,
        )


def _histogram(name: str, documentation: str, values: list[float], bounds: tuple[float, ...]) -> Metric:
    buckets = [(str(bound), float(sum(1 for v in values if v <= bound))) for bound in bounds]
    buckets.append(("+Inf", float(len(values))))
    return GaugeHistogramMetricFamily(name, documentation, buckets=buckets, gsum_value=sum(values))


def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """The metrics in Prometheus' text format. It reads no user input and shows no task ids:
    protect it as your other internal endpoints (a network policy, or wrap it in your auth)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
