"""tests.settings with tasks declared in code: TASKS and an app whose @job declares one."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, SCHEDULER_APP

INSTALLED_APPS = [*INSTALLED_APPS, "tests.declaredapp"]
SCHEDULER_APP = {**SCHEDULER_APP, "TASKS": [{"id": "declared-cleanup", "cron": "30 3 * * *"}]}
