"""What a runner keeps in memory: only the libraries of the handler kinds it runs
(bench/runner_rss.py measures the resulting RSS)."""

from __future__ import annotations

import logging

from django.test import override_settings

from scheduler_app.handlers import BUILTIN, registry
from scheduler_app.handlers.fake import FakeHandler
from scheduler_app.handlers.python import PythonHandler


class CountedHandler(FakeHandler):
    made = 0

    def __init__(self) -> None:
        CountedHandler.made += 1


def test_each_handler_kind_is_loaded_on_its_first_use_only():
    handlers = {"counted": "tests.test_runner_memory.CountedHandler"}
    with override_settings(SCHEDULER_APP={"HANDLERS": handlers}):
        CountedHandler.made = 0
        assert isinstance(registry.for_config({"kind": "python"}), PythonHandler)
        assert CountedHandler.made == 0  # another kind's use loads only that kind
        handler = registry.get("counted")
        assert registry.get("counted") is handler
        assert CountedHandler.made == 1


def test_a_kind_that_cannot_be_imported_is_logged_once_and_left_out(caplog):
    handlers = {"fake": "scheduler_app.handlers.fake.FakeHandler", "broken": "tests.no_such_module.Handler"}
    with (
        override_settings(SCHEDULER_APP={"HANDLERS": handlers}),
        caplog.at_level(logging.ERROR, "scheduler_app"),
    ):
        assert registry.get("broken") is None
        assert registry.get("broken") is None
        assert registry.get("telepathy") is None
        assert registry.kinds() == sorted([*BUILTIN, "fake"])
    assert [record.getMessage() for record in caplog.records] == [
        "handler kind 'broken' cannot be imported from 'tests.no_such_module.Handler'"
    ]
