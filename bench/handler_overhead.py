"""Per-execution overhead of each handler kind beside the no-op hook, and memory after 1,000 JS runs.

For each kind (a no-op hook, a trivial JavaScript function, a GET to a local
HTTP server) the script measures, over --runs executions:

- handler: the handler's own ``run()`` (what the kind adds), and
- attempt: one inline runner tick that claims, starts, runs and finishes one
  execution with its journal events and log row (what a user waits for).

It then reports the runner process's RSS and the JavaScript child's RSS after
the JavaScript runs. PostgreSQL by default.

Run (from the repository root):

    .venv/bin/python bench/handler_overhead.py [--runs 1000] [--db postgres|mysql|sqlite]

Writes bench/results/handler_overhead.json. Creates and drops database bench_handlers.
"""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import bench_database, summary, write_results


class Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(kind: str, handler: dict[str, Any] | None, runs: int) -> dict[str, Any]:
    from django.db.models import Count

    from scheduler_app import scheduler
    from scheduler_app.events import ExecutionContext, TaskEvent
    from scheduler_app.handlers import registry
    from scheduler_app.models import Execution, Task
    from scheduler_app.runner.loop import SchedulerLoop

    task = scheduler.register(
        {"id": f"bench-{kind}", "cron": "0 0 1 1 *", "handler": handler, "max_concurrency": 1}
    )
    implementation = registry.for_config(handler)
    assert implementation is not None
    context = ExecutionContext("occurrence", 1, 1, "token", task.id, {}, "manual", "bench")
    handler_ms = []
    for _ in range(runs):
        started = time.perf_counter()
        implementation.run(TaskEvent(task=task, context=context))
        handler_ms.append((time.perf_counter() - started) * 1000)
    for _ in range(runs):
        scheduler.trigger(task.id)
    runner = SchedulerLoop(node_id=f"bench-{kind}", workers=1, inline=True)
    runner.start()
    attempt_ms = []
    for _ in range(runs):
        started = time.perf_counter()
        runner.tick()
        attempt_ms.append((time.perf_counter() - started) * 1000)
    rows = Execution.objects.filter(task_id=task.id).values("status").annotate(n=Count("sequence"))
    statuses = {row["status"]: row["n"] for row in rows}
    Task.objects.filter(id=task.id).delete()
    return {"handler_ms": summary(handler_ms), "attempt_ms": summary(attempt_ms), "statuses": statuses}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--db", choices=("postgres", "mysql", "sqlite"), default="postgres")
    options = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ok"
    with bench_database("bench_handlers", options.db) as database:
        from django.conf import settings

        settings.SCHEDULER_APP = {
            **settings.SCHEDULER_APP,
            "HOOKS": {"on_task_execute": no_op},
            "HTTP": {"ALLOWED_NETWORKS": ["127.0.0.0/8"]},
        }
        from django.core.signals import setting_changed

        setting_changed.send(sender=None, setting="SCHEDULER_APP", value=settings.SCHEDULER_APP, enter=True)
        results: dict[str, Any] = {"db": database.backend, "runs": options.runs, "kinds": {}}
        kinds = {
            "hook (no-op)": None,
            "js (trivial)": {"kind": "js", "code": "(context) => ({ ok: true, attempt: context.attempt })"},
            "api (GET, local server)": {"kind": "api", "url": url, "method": "GET"},
        }
        for name, handler in kinds.items():
            results["kinds"][name] = measure(name.split()[0], handler, options.runs)
            if name.startswith("js"):
                from scheduler_app.handlers import js_pool

                pool = js_pool._pool
                children = pool.children() if pool is not None else []
                results["rss_after_js_mb"] = {
                    "runner": round(rss_mb(), 1),
                    "javascript_children": [round(rss_mb(pid), 1) for pid in children],
                }
    server.shutdown()
    print(f"handler overhead over {options.runs} runs on {options.db} (ms)")
    for name, figures in results["kinds"].items():
        handler_ms, attempt_ms = figures["handler_ms"], figures["attempt_ms"]
        print(
            f"  {name:26} handler p50 {handler_ms['p50']:7.3f} p99 {handler_ms['p99']:7.3f}"
            f"   attempt p50 {attempt_ms['p50']:7.3f} p99 {attempt_ms['p99']:7.3f}   {figures['statuses']}"
        )
    print(f"  RSS after the JS runs (MB): {results['rss_after_js_mb']}")
    write_results("handler_overhead", results)


def no_op(event: Any) -> None:
    return None


if __name__ == "__main__":
    main()
