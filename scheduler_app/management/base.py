"""What the app's management commands share."""

from __future__ import annotations

from collections.abc import Sequence

from django.apps import AppConfig
from django.core import checks
from django.core.checks.registry import registry
from django.core.management.base import BaseCommand

# The checks of the web side, which import the URLconf and every app's template tag libraries: with
# the REST API mounted, Django REST framework, requests and pygments. A runner serves and renders
# no page; `manage.py check`, `migrate` and `runserver` run these.
WEB_TAGS = {checks.Tags.admin, checks.Tags.templates, checks.Tags.urls}


def start_up_check_tags(include_deployment_checks: bool = False) -> list[str]:
    """The tags of the checks these commands run at start: every registered tag but WEB_TAGS."""
    return sorted(registry.tags_available(include_deployment_checks) - WEB_TAGS)


class OfflineChecksCommand(BaseCommand):
    """A command whose start-up system checks read no database, on every Django version, and leave
    out the web side's.

    Where no tags are asked for, the command runs the checks of every tag but WEB_TAGS; checks
    registered without a tag run with `manage.py check` only.

    Django 6.1 gives the checks every database alias when a command names none (the 6.1
    release notes, "System checks"); the model checks then ask MySQL/MariaDB for its version,
    so an unreachable server fails the checks with the driver's traceback before ``handle()``
    can name the cause (and run_scheduler can wait for the database). An empty list keeps
    Django 5.2's behaviour there: the static checks run, the database ones do not.
    """

    def check(
        self,
        app_configs: Sequence[AppConfig] | None = None,
        tags: Sequence[str] | None = None,
        display_num_errors: bool = False,
        include_deployment_checks: bool = False,
        fail_level: int = checks.ERROR,
        databases: Sequence[str] | None = None,
    ) -> None:
        if tags is None:
            tags = start_up_check_tags(include_deployment_checks)
        super().check(
            app_configs=app_configs,
            tags=tags,
            display_num_errors=display_num_errors,
            include_deployment_checks=include_deployment_checks,
            fail_level=fail_level,
            databases=[] if databases is None else databases,
        )
