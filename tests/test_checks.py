"""System checks over SCHEDULER_APP: one test per check id."""

from __future__ import annotations

import pytest
from django.test import override_settings

from scheduler_app.checks import check_settings


def ids(**settings) -> list[str]:
    with override_settings(SCHEDULER_APP=settings):
        return [message.id for message in check_settings()]


def test_the_defaults_pass():
    assert ids() == []


@pytest.mark.parametrize(
    "settings",
    [
        {"SURPRISE": 1},
        {"WORKERS": 0},
        {"WORKERS": 2.5},
        {"LEASE_SECONDS": "300"},
        {"MISFIRE_GRACE_SECONDS": 0},
        {"MAX_LOGS": 0},
        {"RETENTION_DAYS": "7"},
        {"JS": {"TIMEOUT": 0}},
        {"JS": {"MEMORY_LIMIT_MB": "lots"}},
        {"JS": "fast"},
        {"HTTP": "strict"},
        {"HTTP": {"PROXY": "http://proxy.example"}},
        {"HTTP": {"TIMEOUT": 0}},
        {"HTTP": {"MAX_RESPONSE_BYTES": 1.5}},
        {"HTTP": {"RESULT_MAX_BYTES": "64k"}},
        {"HTTP": {"ALLOW_PRIVATE_NETWORKS": "yes"}},
        {"HTTP": {"ALLOWED_NETWORKS": "10.0.0.0/8"}},
        {"HTTP": {"ALLOWED_NETWORKS": ["10.0.0.0/33"]}},
        {"HTTP": {"ALLOWED_NETWORKS": ["not a host"]}},
    ],
)
def test_e001_reports_bad_values(settings):
    assert "scheduler_app.E001" in ids(**settings)


def test_http_allowed_networks_take_cidrs_and_host_names():
    assert ids(HTTP={"ALLOWED_NETWORKS": ["10.1.0.0/16", "fd00::/8", "127.0.0.1", "billing.internal"]}) == []


def test_e002_reports_bad_declared_tasks():
    assert ids(TASKS=[{"id": "a", "cron": "99 * * * *"}]) == ["scheduler_app.E002"]


@pytest.mark.parametrize(
    "settings",
    [
        {"HOOKS": {"on_task_execute": "tests.nowhere.hook"}},
        {"HOOKS": {"on_task_explode": "tests.hooks.on_task_execute"}},
        {"HANDLERS": {"custom": "tests.nowhere.Handler"}},
        {"HOOKS": ["not", "a", "dict"]},
    ],
)
def test_e003_reports_hooks_and_handlers_that_cannot_be_used(settings):
    assert "scheduler_app.E003" in ids(**settings)


def test_e004_reports_an_unknown_log_database():
    assert ids(LOG_DATABASE="elsewhere") == ["scheduler_app.E004"]


def test_w001_reports_a_redis_url_that_is_not_one():
    assert ids(REDIS_URL="http://localhost:6379") == ["scheduler_app.W001"]
