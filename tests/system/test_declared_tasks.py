"""Runner processes started together with new declarations (TASKS and @job) all start at once."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from scheduler_app.models import Task
from tests.system.processes import RunnerProcess
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="holds the task table with LOCK TABLE"),
]

RUNNERS = 4


def waiting_on_the_task_table() -> int:
    """How many other sessions wait for a lock on the task table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
            [Task._meta.db_table],
        )
        return int(cursor.fetchone()[0])


def test_runners_started_together_with_new_declarations_all_start_at_their_first_try(tmp_path):
    # The table is held until every runner waits in its sync, so that all of them sync at the same
    # instant: each finds the declared tasks missing and inserts them, and all but one lose the race.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Task._meta.db_table} IN EXCLUSIVE MODE")
        processes = [
            RunnerProcess(tmp_path, f"node-{n}", "--once", DJANGO_SETTINGS_MODULE="tests.declared_settings")
            for n in range(RUNNERS)
        ]
        try:
            wait_for(lambda: waiting_on_the_task_table() >= RUNNERS, timeout=60)
        except BaseException:
            for process in processes:
                process.kill()
            raise
    codes = [process.process.wait(timeout=60) for process in processes]
    for process in processes:
        process.kill()  # joins the stderr reader
    outputs = [process.output() for process in processes]
    assert codes == [0] * RUNNERS, outputs
    assert not [output for output in outputs if "cannot start" in output], outputs
    tasks = dict(Task.objects.values_list("id", "declared_in"))
    assert tasks == {"declared-report": "code", "declared-cleanup": "settings"}
    assert set(Task.objects.values_list("revision", flat=True)) == {1}
