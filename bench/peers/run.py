"""Peers: W1, W2 and IDLE against django-q2, Procrastinate and this project, on one PostgreSQL.

Run from the repository root with the project's interpreter:

    .venv/bin/python bench/peers/run.py [--repeat 3] [--only w1,w2,idle]
                                        [--systems django-q2,procrastinate,ours,ours-tuned]

It creates bench/peers/.venv (git-ignored) with `python -m venv` and installs the pinned
peers of bench/peers/requirements.txt there from PyPI (again whenever that file changes);
the peers never enter the project's environment. It starts a private PostgreSQL cluster
on port 5561 (durable commits, pg_stat_statements preloaded), gives every pass a new
database and starts two runner processes per system, loopback only:

- django-q2: `manage.py qcluster` (bench/peers/q2_settings.py): the ORM broker on the same
  database, 16 workers per cluster (32 at once in all), every other setting its default.
  W1: 1,000 `Schedule` rows of type CRON whose cron names the due minute, next_run that
  minute (what Schedule.save() sets). Its scheduler runs in each cluster's guard loop
  every 30 s from the cluster's start, so its latency includes where that cycle falls.
- Procrastinate: `procrastinate worker --concurrency 16` (bench/peers/procrastinate_app.py,
  PsycopgConnector; 16 jobs at once per worker, 32 in all), every other option its
  default. W1: periodic tasks, 1,000 periodic_ids of one task (`app.periodic(cron=...)`)
  with the cron of the due minute.
- ours defaults: `run_scheduler` with no --workers (16 on PostgreSQL), no Redis, Django's default
  database OPTIONS, a new empty journal. W1: 1,000 tasks whose cron names the due minute.
- ours tuned: `--workers 16`, SCHEDULER_APP REDIS_URL (--redis-url) and
  BENCH_PREPARE_THRESHOLD=5 (bench/settings.py).

Every system runs the same no-op: one line `<task id>,<time>,<occurrence id>` per execution
(bench/noop_hook.py), from which executions, latencies and duplicates are counted.

- W1: --tasks tasks due at the minute T; the runners start at least --lead s before T.
  p99 of (side-effect time - T). Every task must run exactly once.
- W2: one task triggered --triggers times (ours: scheduler.trigger, max_concurrency 32;
  django-q2: async_task; Procrastinate: defer) by one producer after 20 warm-up triggers;
  executions/s = triggers / (last side effect - first trigger call).
- IDLE: 0 tasks; the runners of every system at once, each system on its own database;
  statements per second per runner over --idle-window s, from pg_stat_statements: the
  top-level statements the clients sent, BEGIN and COMMIT included (the JSON also has
  the statements run inside Procrastinate's SQL functions).

After the last execution of a W1 or W2 pass its runners stay up --settle s for late
duplicates; that settle overlaps the next pass's start (in W1 it ends before the next
due minute; in W2 it overlaps the next system's run too: the settling runners are idle). Peak RSS per runner is VmHWM summed over the runner's process
tree (django-q2's cluster forks a sentinel, a pusher, a monitor and its workers, which
share pages: the sum overstates it; the JSON has the main process alone). Each figure is
the median of --repeat passes (RSS: of each repeat's largest runner); duplicates and
missing executions are summed over all passes. Writes bench/results/peers.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._common import (
    ROOT,
    Processes,
    _create,
    _drop,
    _pg_admin,
    cpu_seconds,
    percentile,
    pg_conninfo,
    private_postgres,
    vm_hwm_kb,
    wait_until,
    write_results,
)
from bench.noop_hook import read_side_effects

PEERS = ROOT / "bench" / "peers"
VENV = PEERS / ".venv"
REQUIREMENTS = PEERS / "requirements.txt"
PORT = 5561
WARMUP = 20  # bench/peers/driver.py's warm-up triggers


@dataclass(frozen=True)
class System:
    key: str
    label: str
    kind: str  # the driver's SYSTEM
    tuned: bool = False


SYSTEMS = [
    System("django-q2", "django-q2", "django-q2"),
    System("procrastinate", "Procrastinate", "procrastinate"),
    System("ours", "ours defaults", "ours"),
    System("ours-tuned", "ours tuned", "ours", tuned=True),
]


def peer_python() -> str:
    """bench/peers/.venv's interpreter, made (python -m venv, pip from PyPI) when missing or stale."""
    python = VENV / "bin" / "python"
    stamp = VENV / "requirements.txt"
    wanted = REQUIREMENTS.read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    if Path(sys.prefix).resolve() == VENV.resolve():
        raise SystemExit("run this with the project's interpreter, not the peers'")
    print(f"installing the peers into {VENV.relative_to(ROOT)}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True, timeout=900)
    stamp.write_text(wanted)
    return str(python)


def statements(db: str) -> tuple[int, int]:
    """(top-level, all) statements executed so far in database ``db`` (not counting pg_stat readers)."""
    import psycopg

    with psycopg.connect(pg_conninfo() + " dbname=postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls) FILTER (WHERE toplevel), 0), coalesce(sum(calls), 0)"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"
            " AND query NOT LIKE '%%pg_stat%%'",
            [db],
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def process_trees(roots: list[int]) -> list[list[int]]:
    """Each root pid with its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    trees = []
    for root in roots:
        tree, todo = [], [root]
        while todo and len(tree) < 500:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, []))
        trees.append(tree)
    return trees


class Pass:
    """One pass of one workload on one system: a new database, a side-effect folder, two runners."""

    def __init__(self, system: System, workload: str, repeat: int, args: argparse.Namespace) -> None:
        self.system, self.workload, self.args = system, workload, args
        self.python = sys.executable if system.kind == "ours" else args.peer_python
        self.stack = ExitStack()
        self.folder = self.stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-effects-"))
        self.db = f"peers_{workload}_{system.key.replace('-', '_')}_{repeat}"
        _create("postgres", self.db)
        self.stack.callback(_drop, "postgres", self.db)
        self.procs = self.stack.enter_context(Processes(grace=20))
        self.env = self._env()
        self.peaks: list[dict[int, int]] = []  # per runner: pid -> VmHWM kB
        self.result: dict[str, Any] = {"database": self.db}
        self.final_lines: list[tuple[str, float, str]] | None = None

    def _env(self) -> dict[str, str]:
        env = {
            "PYTHONPATH": str(ROOT),
            "PGHOST": "127.0.0.1",
            "PGPORT": str(PORT),
            "TZ": "UTC",
            "BENCH_SIDE_EFFECTS": self.folder,
            "BENCH_DB_NAME": self.db,
        }
        if self.system.kind == "ours":
            tuned = self.system.tuned
            env.update(
                DJANGO_SETTINGS_MODULE="bench.settings",
                SCHEDULER_TEST_DB="postgres",
                SCHEDULER_DB_NAME=self.db,
                SCHEDULER_REDIS_URL=self.args.redis_url if tuned else "",
                BENCH_PREPARE_THRESHOLD="5" if tuned else "",
            )
        elif self.system.kind == "django-q2":
            env["DJANGO_SETTINGS_MODULE"] = "bench.peers.q2_settings"
        return env

    def drive(self, *argv: str, timeout: float = 120) -> str:
        """One bench/peers/driver.py step in the system's interpreter; its standard output."""
        done = subprocess.run(
            [self.python, "-m", "bench.peers.driver", self.system.kind, *argv],
            env={**os.environ, **self.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise SystemExit(f"{self.system.key} {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start_runners(self, env: dict[str, str] | None = None) -> None:
        self.started = time.time()
        for k in range(2):
            name = f"{self.db}-{k}"
            if self.system.kind == "ours":
                argv = [self.python, "-m", "django", "run_scheduler", "--node-id", name]
                argv += ["--workers", "16"] if self.system.tuned else []
            elif self.system.kind == "django-q2":
                argv = [self.python, "-m", "django", "qcluster"]
            else:
                app = "--app=bench.peers.procrastinate_app.app"
                argv = [self.python, "-m", "procrastinate", app, "worker", "--concurrency", "16"]
            self.procs.start(name, argv, {**self.env, **(env or {})})
            self.peaks.append({})

    def ready(self) -> bool:
        if self.system.kind == "django-q2":
            return all(re.search(r"Q Cluster .* running", c.log_tail(400)) for c in self.procs.children)
        import psycopg

        table = "scheduler_app_runner" if self.system.kind == "ours" else "procrastinate_workers"
        try:
            with psycopg.connect(f"{pg_conninfo()} dbname={self.db}", autocommit=True) as conn:
                row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        except psycopg.Error:
            return False
        return bool(row) and row[0] >= 2

    def wait_ready(self, timeout: float) -> bool:
        ok = wait_until(self.ready, max(timeout, 1.0), 0.2, self.sample)
        if not ok:
            print(
                f"  {self.system.key}: runners not ready in {timeout:.0f} s:\n{self.procs.children[0].log_tail()}"
            )
        return ok

    def sample(self) -> None:
        live = [(k, c.popen.pid) for k, c in enumerate(self.procs.children) if c.popen.poll() is None]
        for (k, _), tree in zip(live, process_trees([pid for _, pid in live]), strict=True):
            peaks = self.peaks[k]
            for pid in tree:
                peaks[pid] = max(peaks.get(pid, 0), vm_hwm_kb(pid) or 0)

    def cpu_seconds(self) -> float:
        """CPU seconds so far of the runners' live processes."""
        live = [c.popen.pid for c in self.procs.children if c.popen.poll() is None]
        return cpu_seconds({pid for tree in process_trees(live) for pid in tree})["given processes"]

    def lines(self) -> list[tuple[str, float, str]]:
        return self.final_lines if self.final_lines is not None else read_side_effects(self.folder)

    def close(self) -> None:
        """Stop the runners, drop the database; the side-effect lines are kept. Idempotent."""
        if self.final_lines is not None:
            return
        self.sample()
        lines = read_side_effects(self.folder)
        mains = [c.popen.pid for c in self.procs.children]
        # One SIGTERM each (Processes.stop_all signals a child again while it waits for it).
        for child in self.procs.children:
            if child.popen.poll() is None:
                child.popen.send_signal(signal.SIGTERM)
        for child in self.procs.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(20)
        codes = list(self.procs.stop_all().values())  # kills what is left
        self.result["runner_exit_codes"] = codes
        if any(codes):
            self.result["runner_log_tail"] = [c.log_tail(15) for c in self.procs.children]
        self.stack.close()
        self.final_lines = lines
        self.result["peak_rss_mb"] = [round(sum(p.values()) / 1024, 1) for p in self.peaks]
        self.result["main_process_peak_rss_mb"] = [
            round(p.get(pid, 0) / 1024, 1) for p, pid in zip(self.peaks, mains, strict=True)
        ]
        self.result["processes_per_runner"] = [len(p) for p in self.peaks]


def settle(p: Pass) -> None:
    """The rest of the pass's settle for late duplicates, then stop it."""
    wait_until(lambda: time.time() >= p.settle_end, p.args.settle + 5, 0.5, p.sample)
    p.close()


def pipelined(
    order: list[System],
    args: argparse.Namespace,
    start: Callable[[System, int], Pass],
    run: Callable[[Pass], None],
    finish: Callable[[Pass], dict[str, Any]],
    overlap_run: bool,
) -> dict[str, list[dict[str, Any]]]:
    """--repeat passes of each system; a pass's settle overlaps the next pass's start, and its
    run too when ``overlap_run`` (and the next pass is of another system)."""
    out: dict[str, list[dict[str, Any]]] = {s.key: [] for s in order}
    with ExitStack() as open_passes:
        previous: Pass | None = None
        for r in range(args.repeat):
            for system in order:
                p = start(system, r)
                open_passes.callback(p.close)
                if previous is not None and not (overlap_run and previous.system != system):
                    settle(previous)
                    out[previous.system.key].append(finish(previous))
                    previous = None
                run(p)
                if previous is not None:
                    settle(previous)
                    out[previous.system.key].append(finish(previous))
                previous = p
        if previous is not None:
            settle(previous)
            out[previous.system.key].append(finish(previous))
    return out


# -- W1 -------------------------------------------------------------------------------------


def w1_start(system: System, r: int, args: argparse.Namespace) -> Pass:
    p = Pass(system, "w1", r, args)
    p.drive("setup", "w1")
    due = math.ceil((time.time() + args.lead + 5) / 60) * 60  # + the time to store the tasks
    p.drive("w1", str(args.tasks), str(due))
    env = {}
    if system.kind == "procrastinate":
        t = time.gmtime(due)
        env = {
            "BENCH_PERIODIC_TASKS": str(args.tasks),
            "BENCH_PERIODIC_CRON": f"{t.tm_min} {t.tm_hour} {t.tm_mday} {t.tm_mon} *",
        }
    p.start_runners(env)
    p.result.update(due=due, lead_s=round(due - p.started, 1))
    return p


def w1_run(p: Pass) -> None:
    """Wait for the runners (before T) and for every task's line (bounded by --w1-timeout after T)."""
    due, n = p.result["due"], p.args.tasks
    p.result["ready_before_due"] = p.wait_ready(due - 5 - time.time())
    budget = due + p.args.w1_timeout - time.time()
    p.result["all_ran"] = wait_until(
        lambda: len({task for task, _, _ in p.lines()}) >= n, max(budget, 1.0), 0.2, p.sample
    )
    p.settle_end = time.time() + p.args.settle


def w1_finish(p: Pass) -> dict[str, Any]:
    lines = [line for line in p.lines() if line[0].startswith("w1-")]
    tasks = {task for task, _, _ in lines}
    latency = [at - p.result["due"] for _, at, _ in lines]
    p.result.update(
        side_effects=len(lines),
        duplicates=len(lines) - len(tasks),
        missing=p.args.tasks - len(tasks),
        p50_s=round(percentile(latency, 50) or 0, 3),
        p99_s=round(percentile(latency, 99) or 0, 3) if latency else None,
        max_s=round(max(latency), 3) if latency else None,
    )
    report(p, f"W1 p99 {p.result['p99_s']} s (lead {p.result['lead_s']} s)")
    return p.result


# -- W2 -------------------------------------------------------------------------------------


def w2_start(system: System, r: int, args: argparse.Namespace) -> Pass:
    p = Pass(system, "w2", r, args)
    p.drive("setup", "w2")
    p.start_runners()
    return p


def w2_run(p: Pass) -> None:
    p.result["ready"] = p.wait_ready(90)
    produced = json.loads(p.drive("w2", str(p.args.triggers), timeout=400).splitlines()[-1])
    expected = WARMUP + produced["sent"]
    p.result["all_ran"] = wait_until(
        lambda: len({o for _, _, o in p.lines()}) >= expected, p.args.w2_timeout, 0.1, p.sample
    )
    p.result.update(produced)
    p.settle_end = time.time() + p.args.settle


def w2_finish(p: Pass) -> dict[str, Any]:
    lines, first = p.lines(), p.result["first"]
    effects = [at for _, at, _ in lines if at >= first]
    last = max(effects, default=first)
    occurrences = {o for _, _, o in lines}
    p.result.update(
        side_effects=len(effects),
        duplicates=len(lines) - len(occurrences),
        missing=WARMUP + p.args.triggers - len(occurrences),
        executions_per_second=round(len(effects) / (last - first), 1) if last > first else None,
        producer_triggers_per_second=round(p.result["sent"] / (p.result["produced"] - first), 1),
    )
    report(p, f"W2 {p.result['executions_per_second']} executions/s")
    return p.result


# -- IDLE -----------------------------------------------------------------------------------


def idle_pass(order: list[System], r: int, args: argparse.Namespace) -> list[Pass]:
    """Every system's two idle runners at once, each system on its own database."""
    with ExitStack() as stack:
        passes = []
        for system in order:
            p = Pass(system, "idle", r, args)
            stack.callback(p.close)
            p.drive("setup", "idle")
            p.start_runners()
            passes.append(p)
        deadline = time.monotonic() + 90
        for p in passes:
            p.result["ready"] = p.wait_ready(deadline - time.monotonic())

        def sample_all() -> None:
            for p in passes:
                p.sample()

        wait_until(lambda: False, args.idle_settle, 0.5, sample_all)
        before, start = [(statements(p.db), p.cpu_seconds()) for p in passes], time.monotonic()
        wait_until(lambda: False, args.idle_window, 0.5, sample_all)
        after = [(statements(p.db), p.cpu_seconds()) for p in passes]
        seconds = time.monotonic() - start
        for p, (b, cpu_b), (a, cpu_a) in zip(passes, before, after, strict=True):
            p.close()
            p.result.update(
                window_s=round(seconds, 1),
                cpu_percent_per_runner=round((cpu_a - cpu_b) / seconds / 2 * 100, 2),
                statements_per_second_per_runner=round((a[0] - b[0]) / seconds / 2, 3),
                with_nested_per_second_per_runner=round((a[1] - b[1]) / seconds / 2, 3),
                duplicates=0,
                missing=0,
            )
            report(p, f"IDLE {p.result['statements_per_second_per_runner']} statements/s per runner")
    return passes


def run_idle(order: list[System], args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {s.key: [] for s in order}
    for r in range(args.repeat):
        for p in idle_pass(order, r, args):
            out[p.system.key].append(p.result)
    return out


# -- the table -------------------------------------------------------------------------------


def report(p: Pass, what: str) -> None:
    r = p.result
    print(
        f"  {p.system.label}, {p.workload}: {what}, {r['duplicates']} duplicates, {r['missing']} missing,"
        f" peak RSS {r['peak_rss_mb']} MB",
        flush=True,
    )


def median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def figures(passes: dict[str, list[dict[str, Any]]], repeat: int) -> dict[str, Any]:
    w1, w2, idle = passes.get("w1", []), passes.get("w2", []), passes.get("idle", [])
    everything = w1 + w2 + idle
    rss = [
        max((max(p["peak_rss_mb"]) for p in everything if p["repeat"] == r), default=None)
        for r in range(repeat)
    ]
    return {
        "w1_p99_s": median([p["p99_s"] for p in w1]),
        "w2_executions_per_second": median([p["executions_per_second"] for p in w2]),
        "idle_statements_per_second_per_runner": median(
            [p["statements_per_second_per_runner"] for p in idle]
        ),
        "duplicates": sum(p["duplicates"] for p in everything) if everything else None,
        "missing": sum(p["missing"] for p in everything) if everything else None,
        "peak_rss_mb_per_runner": median(rss),
    }


ROWS = [
    ("W1 p99 due-to-start (s)", "w1_p99_s", "{:.3f}"),
    ("W2 executions/s", "w2_executions_per_second", "{:.0f}"),
    ("IDLE statements/s per runner", "idle_statements_per_second_per_runner", "{:.2f}"),
    ("duplicates (all passes)", "duplicates", "{:d}"),
    ("missing executions (all passes)", "missing", "{:d}"),
    ("peak RSS per runner (MB)", "peak_rss_mb_per_runner", "{:.1f}"),
]


def table(medians: dict[str, dict[str, Any]], order: list[System]) -> str:
    peers = [s for s in order if s.kind != "ours"]
    ours = [s for s in order if s.kind == "ours"]
    ratios = [(o, p) for o in ours for p in peers]
    head = [s.label for s in order] + [f"{o.label.split()[1]} / {p.label}" for o, p in ratios]
    out = ["| figure | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for label, key, fmt in ROWS:
        cells = [medians[s.key][key] for s in order]
        row = [("n/a" if v is None else fmt.format(v)) for v in cells]
        for o, p in ratios:
            a, b = medians[o.key][key], medians[p.key][key]
            counted = key in ("duplicates", "missing")
            row.append("" if counted or a is None or not b else f"{a / b:.2f}")
        out.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="w1,w2,idle", help="comma-separated workloads")
    parser.add_argument("--systems", default=",".join(s.key for s in SYSTEMS))
    parser.add_argument("--tasks", type=int, default=1000, help="W1 tasks")
    parser.add_argument("--triggers", type=int, default=2000, help="W2 triggers")
    parser.add_argument("--lead", type=float, default=40.0, help="W1: runners start this long before T")
    parser.add_argument("--settle", type=float, default=35.0, help="W1, W2: seconds kept for late duplicates")
    parser.add_argument("--w1-timeout", type=float, default=120.0, help="W1: seconds after T to wait for all")
    parser.add_argument("--w2-timeout", type=float, default=300.0)
    parser.add_argument("--idle-window", type=float, default=60.0)
    parser.add_argument("--idle-settle", type=float, default=10.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="ours tuned")
    args = parser.parse_args()
    workloads = [w for w in args.only.split(",") if w]
    order = [s for s in SYSTEMS if s.key in args.systems.split(",")]
    if set(workloads) - {"w1", "w2", "idle"} or not order:
        raise SystemExit("--only takes w1, w2, idle; --systems " + ", ".join(s.key for s in SYSTEMS))
    args.peer_python = peer_python()
    began = time.monotonic()
    passes: dict[str, dict[str, list[dict[str, Any]]]] = {s.key: {} for s in order}
    with private_postgres(PORT):
        _pg_admin("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for workload in workloads:
            print(f"{workload}:", flush=True)
            if workload == "idle":
                done = run_idle(order, args)
            elif workload == "w1":
                done = pipelined(order, args, lambda s, r: w1_start(s, r, args), w1_run, w1_finish, False)
            else:
                done = pipelined(order, args, lambda s, r: w2_start(s, r, args), w2_run, w2_finish, True)
            for key, results in done.items():
                for r, result in enumerate(results):
                    result["repeat"] = r
                passes[key][workload] = results
    medians = {s.key: figures(passes[s.key], args.repeat) for s in order}
    printed = table(medians, order)
    minutes = (time.monotonic() - began) / 60
    print(f"\nMedians of {args.repeat} passes ({minutes:.1f} min); ratio = ours / peer:\n")
    print(printed)
    write_results(
        "peers",
        {
            "peers": [line for line in REQUIREMENTS.read_text().splitlines() if "==" in line],
            "settings": {k: v for k, v in vars(args).items() if k != "peer_python"},
            "medians": medians,
            "table": printed,
            "passes": passes,
        },
    )


if __name__ == "__main__":
    main()
