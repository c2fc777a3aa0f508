"""Manual trigger latency, with PostgreSQL's wake-ups and with Redis'.

One warm, idle runner process (`run_scheduler --workers 2 --tick-interval
1.0`) and one no-op task (cron "0 0 1 1 *", never due). The script calls
scheduler.trigger(task, wait=10) --triggers times, one after the other, and
measures trigger-to-start latency (Execution.started_at - created_at) p50/p99,
trigger-to-finish latency, the round trip of each trigger(wait=10) call, and
end-to-end executions per second of the sequential loop.

Two passes, each a subprocess of this script with its own database
(bench_trigger_plain, bench_trigger_redis), on PostgreSQL: without Redis a trigger
wakes the runner through PostgreSQL's LISTEN/NOTIFY (on other databases the
runner would find the work at its next tick); with SCHEDULER_REDIS_URL (runner
and triggering process alike) through Redis. Five unmeasured triggers warm up.

Run (from the repository root):

    .venv/bin/python bench/trigger_latency.py [--triggers 200] [--redis-url redis://127.0.0.1:6379/0]

Writes bench/results/trigger_latency.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Processes, bench_database, summary, wait_until, write_results

TASK = "bench-noop"
WARMUP = 5


def one_pass(triggers: int, redis_url: str | None) -> dict[str, Any]:
    name = "bench_trigger_redis" if redis_url else "bench_trigger_plain"
    with bench_database(name, redis_url=redis_url) as db, Processes() as procs:
        from scheduler_app import scheduler
        from scheduler_app.models import Execution, Runner

        scheduler.register({"id": TASK, "name": "No-op", "cron": "0 0 1 1 *"})
        runner = procs.start_runner(db, "bench-trigger", "--workers", "2", "--tick-interval", "1.0")
        if not wait_until(lambda: Runner.objects.filter(node_id="bench-trigger").exists(), 60, 0.2):
            raise SystemExit("runner did not start:\n" + runner.log_tail())
        for _ in range(WARMUP):
            warm = scheduler.trigger(TASK, source="warmup", wait=30)
            if warm.status != "success":
                raise SystemExit(f"warm-up trigger ended {warm.status}:\n{runner.log_tail()}")
        round_trips = []
        statuses: dict[str, int] = {}
        loop_start = time.perf_counter()
        for _ in range(triggers):
            start = time.perf_counter()
            execution = scheduler.trigger(TASK, source="bench", wait=10)
            round_trips.append(time.perf_counter() - start)
            statuses[execution.status] = statuses.get(execution.status, 0) + 1
        loop_seconds = time.perf_counter() - loop_start
        runner.sample_rss()
        exit_code = procs.terminate(runner)
        rows = Execution.objects.filter(task_id=TASK, trigger_source="bench").values_list(
            "created_at", "started_at", "finished_at"
        )
        to_start = [(s - c).total_seconds() * 1000 for c, s, _ in rows if s]
        to_finish = [(f - c).total_seconds() * 1000 for c, _, f in rows if f]
        return {
            "redis": bool(redis_url),
            "triggers": triggers,
            "statuses": statuses,
            "trigger_to_start_ms": summary(to_start, 1),
            "trigger_to_finish_ms": summary(to_finish, 1),
            "trigger_wait_round_trip_ms": summary([t * 1000 for t in round_trips], 1),
            "executions_per_second": round(triggers / loop_seconds, 2),
            "runner_peak_rss_mb": round(runner.peak_rss_kb / 1024, 1),
            "runner_exit_code": exit_code,
        }


def redis_reachable(url: str) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=200)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--pass", dest="which", choices=["plain", "redis"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.which:  # a child: one pass, figures to --out
        figures = one_pass(args.triggers, args.redis_url if args.which == "redis" else None)
        Path(args.out).write_text(json.dumps(figures))
        return

    results: dict[str, Any] = {}
    passes = ["plain"] + (["redis"] if redis_reachable(args.redis_url) else [])
    if "redis" not in passes:
        print(f"Redis not reachable at {args.redis_url}: redis pass skipped")
    with tempfile.TemporaryDirectory() as folder, Processes(grace=60) as procs:
        for which in passes:
            out = Path(folder) / f"{which}.json"
            argv = [
                sys.executable,
                __file__,
                "--pass",
                which,
                "--out",
                str(out),
                "--triggers",
                str(args.triggers),
                "--redis-url",
                args.redis_url,
            ]
            child = procs.start(f"pass-{which}", argv, {})
            code = child.popen.wait()
            if code != 0 or not out.exists():
                print(f"pass {which} failed (exit {code}):\n{child.log_tail(40)}")
                continue
            results[which] = json.loads(out.read_text())

    print(
        f"{'pass':<6} {'start p50':>10} {'start p99':>10} {'finish p50':>11} {'call p50':>9} {'exec/s':>7}  statuses"
    )
    for which, r in results.items():
        s, f, c = r["trigger_to_start_ms"], r["trigger_to_finish_ms"], r["trigger_wait_round_trip_ms"]
        print(
            f"{which:<6} {s['p50']:>8}ms {s['p99']:>8}ms {f['p50']:>9}ms {c['p50']:>7}ms {r['executions_per_second']:>7}"
            f"  {r['statuses']} (runner exit {r['runner_exit_code']}, peak RSS {r['runner_peak_rss_mb']} MB)"
        )
    write_results("trigger_latency", results)


if __name__ == "__main__":
    main()
