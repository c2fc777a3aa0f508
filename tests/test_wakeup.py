"""Redis wake-ups: one kept connection per process, and never an error for the caller."""

import pytest

from scheduler_app import wakeup

REDIS_URL = "redis://127.0.0.1:6379/15"


def redis_or_skip():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("Redis is not reachable")
    return client


def test_wake_ups_reuse_one_connection(settings):
    client = redis_or_skip()
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": REDIS_URL}
    wakeup.notify()
    before = client.info("stats")["total_connections_received"]
    for _ in range(20):
        wakeup.notify()
    assert client.info("stats")["total_connections_received"] == before


def test_a_wake_up_to_an_unreachable_redis_is_silent(settings):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://127.0.0.1:1/0"}
    wakeup.notify()
