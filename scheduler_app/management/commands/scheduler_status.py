"""manage.py scheduler_status: runners, late runs, unknown executions, log failures and tasks that
cannot be scheduled, each with its own exit code; --node-id checks one runner's liveness only (a
probe for that runner)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from scheduler_app import database_errors, health
from scheduler_app.db import probe
from scheduler_app.management.base import OfflineChecksCommand
from scheduler_app.models import Runner


class Command(OfflineChecksCommand):
    help = (
        "Report runners, late runs, unknown executions, log failures and tasks that cannot be"
        " scheduled; exit 0 when all is well, else 2 no live runner, 3 late runs, 4 unknown"
        " executions, 5 silent runners, 6 log failures, 7 unschedulable tasks (the lowest code of"
        " those found), 1 when the database cannot be read."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node-id", help="Check only that this runner is alive (exit 2 if not).")
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            # Runners write their heartbeat on the database clock: compare on it too.
            now = probe().now
            if options["node_id"]:
                self.one_runner(health.runners(now, options["node_id"]), options)
                return
            report = health.check(now)
        except DatabaseError as exc:
            raise CommandError(database_errors.describe(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            for runner in report.runners:
                self.write_runner(runner)
            for condition in report.conditions:
                self.stdout.write(f"ALERT {condition.name}: {condition.message}")
        if report.conditions:
            first = min(report.conditions, key=lambda c: c.exit_code)
            raise CommandError(first.message, returncode=first.exit_code)

    def one_runner(self, runners: list[Runner], options: dict[str, Any]) -> None:
        alive = any(getattr(r, "state", "") == "alive" for r in runners)
        if options["json"]:
            states = {r.node_id: getattr(r, "state", "") for r in runners}
            self.stdout.write(
                json.dumps(
                    {"ok": alive, "node_id": options["node_id"], "state": states.get(options["node_id"])}
                )
            )
        else:
            for runner in runners:
                self.write_runner(runner)
        if not alive:
            raise CommandError(f"runner {options['node_id']} is not alive", returncode=2)

    def write_runner(self, runner: Runner) -> None:
        self.stdout.write(
            f"{runner.node_id}\t{getattr(runner, 'state', '')}\tlast seen {runner.last_seen_at:%Y-%m-%dT%H:%M:%SZ}"
        )
