"""Mount with ``path("api/scheduler/", include("scheduler_app.api.urls"))``.

Every path under the mount belongs to the API: one that names no endpoint
answers 404 in the API's error shape, not the host's 404 page.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import URLPattern, URLResolver, path
from django.urls.resolvers import RegexPattern
from rest_framework.routers import DefaultRouter

from scheduler_app.api import views
from scheduler_app.api.schema import HAS_SIDECAR, HAS_SPECTACULAR

app_name = "scheduler_api"

NEEDS_OPENAPI = (
    'needs the openapi extra: pip install "django-scheduler-app[openapi]", then restart the server'
)


class Router(DefaultRouter):
    include_format_suffixes = False
    # DRF's root view would take the host's default permissions, not the scheduler's.
    include_root_view = False


class Unrouted(RegexPattern):
    """Any path left under the mount, except those CommonMiddleware would redirect to add a slash."""

    def __init__(self) -> None:
        super().__init__(r"", is_endpoint=False)

    def match(self, path: str) -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
        if settings.APPEND_SLASH and path and not path.endswith("/"):
            # APPEND_SLASH redirects to the path with a slash, which this pattern then answers.
            return None
        return "", (), {}


router = Router()
router.register("tasks", views.TaskViewSet, basename="task")
router.register("logs", views.LogViewSet, basename="log")
router.register("executions", views.ExecutionViewSet, basename="execution")
router.register("runners", views.RunnerViewSet, basename="runner")

urlpatterns: list[URLPattern | URLResolver] = list(router.urls)

if HAS_SPECTACULAR:
    from scheduler_app.api import openapi

    urlpatterns += openapi.schema_patterns(list(router.urls))
else:
    urlpatterns.append(path("schema/", views.not_found(f"The schema {NEEDS_OPENAPI}.")))
if HAS_SPECTACULAR and HAS_SIDECAR:
    urlpatterns += openapi.docs_patterns()
else:
    urlpatterns.append(path("schema/docs/", views.not_found(f"The docs page {NEEDS_OPENAPI}.")))
urlpatterns.append(URLPattern(Unrouted(), views.no_endpoint))
