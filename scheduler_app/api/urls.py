"""Mount with ``path("api/scheduler/", include("scheduler_app.api.urls"))``."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import DefaultRouter

from scheduler_app.api import views
from scheduler_app.api.schema import HAS_SPECTACULAR

app_name = "scheduler_api"


class Router(DefaultRouter):
    include_format_suffixes = False
    # DRF's root view would take the host's default permissions, not the scheduler's.
    include_root_view = False


router = Router()
router.register("tasks", views.TaskViewSet, basename="task")
router.register("logs", views.LogViewSet, basename="log")
router.register("executions", views.ExecutionViewSet, basename="execution")

urlpatterns: list[URLPattern | URLResolver] = list(router.urls)


def _schema_view() -> Any:
    from drf_spectacular.views import SpectacularAPIView

    from scheduler_app import __version__
    from scheduler_app.api import errors, permissions

    class SchemaView(SpectacularAPIView):
        def get_exception_handler(self) -> Any:
            return errors.exception_handler

        def get_permissions(self) -> list[Any]:
            return [cls() for cls in permissions.permission_classes()]

        def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            # Paths are relative to where the host mounted these urls.
            mount = request.path.removesuffix("schema/").rstrip("/")
            self.custom_settings = {**(self.custom_settings or {}), "SERVERS": [{"url": mount}]}
            return super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]

    return SchemaView.as_view(
        patterns=list(router.urls),
        custom_settings={
            "TITLE": "scheduler_app",
            "DESCRIPTION": "Tasks, triggers, logs and execution repairs of scheduler_app.",
            "VERSION": __version__,
            "COMPONENT_SPLIT_REQUEST": True,
            "SCHEMA_PATH_PREFIX": "",
            "ENUM_NAME_OVERRIDES": {"ExecutionStatusEnum": "scheduler_app.models.Status"},
        },
    )


if HAS_SPECTACULAR:
    urlpatterns.append(path("schema/", _schema_view(), name="schema"))
