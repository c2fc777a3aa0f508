"""Helpers the tests share: task definitions and an inline runner on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from scheduler_app import claims, journal
from scheduler_app.claims import Claim
from scheduler_app.clock import FakeClock
from scheduler_app.engine import Runner
from scheduler_app.models import Status

T0 = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)


def definition(task_id: str = "report", **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"id": task_id, "name": task_id.title(), "cron": "* * * * *"}
    data.update(overrides)
    return data


def inline_runner(clock: FakeClock, **options: Any) -> Runner:
    options.setdefault("workers", 4)
    options.setdefault("lease_seconds", 30)
    runner = Runner(node_id=options.pop("node_id", "node-a"), clock=clock, inline=True, **options)
    runner.start()
    return runner


def expire_lease(
    clock: FakeClock, *, node: str = "dead-node", lease: float = 30, start: bool = True
) -> Claim:
    """Claim (and maybe start) one attempt as a node that then dies; return it once its lease ran out."""
    (claim,), _ = claims.claim(clock.now(), node, 1, lease)
    if start:
        assert journal.transition(
            claim.execution.sequence,
            Status.CLAIMED,
            Status.RUNNING,
            at=clock.now(),
            reason="started",
            token=claim.token,
            attempt=claim.execution.attempt,
            fields={"started_at": clock.now()},
        )
    clock.advance(lease + 1)
    return claim
