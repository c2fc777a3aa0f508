"""manage.py scheduler_status: which runners are alive; exit 1 when none is (or --node-id is not)."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from scheduler_app import database_errors
from scheduler_app.conf import scheduler_settings
from scheduler_app.db import probe
from scheduler_app.management.base import OfflineChecksCommand
from scheduler_app.models import Runner


class Command(OfflineChecksCommand):
    help = "List runners and fail when no runner (or the given one) has been seen within one lease."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node-id", help="Check this runner only.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            # Runners write last_seen_at on the database clock: compare on it too.
            lease = timedelta(seconds=float(scheduler_settings.LEASE_SECONDS))
            runners = list(Runner.objects.with_state(probe().now, lease))
        except DatabaseError as exc:
            raise CommandError(database_errors.describe(exc)) from None
        if options["node_id"]:
            runners = [runner for runner in runners if runner.node_id == options["node_id"]]
        alive = 0
        for runner in runners:
            state = str(getattr(runner, "state", ""))
            alive += state == "alive"
            self.stdout.write(
                f"{runner.node_id}\t{state}\tlast seen {runner.last_seen_at:%Y-%m-%dT%H:%M:%SZ}"
            )
        if not alive:
            raise CommandError("no live runner")
