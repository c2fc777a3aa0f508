"""Who may call the API: staff users holding the model permission of each call, by default.

Each view names the Django permissions a call needs (``required_permissions``).
``SCHEDULER_APP["API_PERMISSION_CLASSES"]`` replaces the default classes;
resolving an unknown execution always needs ``scheduler_app.resolve_unknown``,
changing what a task runs always needs ``scheduler_app.change_task_handler``,
and a call a view lists no permissions for (OPTIONS) is refused to everyone.
A refusal by these classes says why: which permissions are missing, or that
the user is not staff.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from scheduler_app.conf import scheduler_settings
from scheduler_app.models import RESOLVE_UNKNOWN_PERMISSION


def required_permissions(request: Request, view: APIView) -> list[str]:
    getter = getattr(view, "required_permissions", None)
    return list(getter(request)) if getter is not None else []


def missing_message(missing: Iterable[str]) -> str:
    """``Missing permission: scheduler_app.add_execution.``, or the plural with each name."""
    names = list(missing)
    return f"Missing permission{'s' if len(names) > 1 else ''}: {', '.join(names)}."


class HasModelPermissions(BasePermission):
    """Authenticated users holding every permission the call needs."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        missing = [name for name in required_permissions(request, view) if not user.has_perm(name)]
        if missing:
            # DRF answers 403 with the message of the permission that refused.
            self.message = missing_message(missing)
        return not missing


class IsStaffWithModelPermissions(HasModelPermissions):
    """Active staff users holding every permission the call needs: the default."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if user and user.is_authenticated and not getattr(user, "is_staff", False):
            self.message = "Only staff users may call the scheduler API."
            return False
        return super().has_permission(request, view)


class CanResolveUnknown(BasePermission):
    """Users holding the dedicated permission to settle executions in state unknown."""

    message = missing_message([RESOLVE_UNKNOWN_PERMISSION])

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(RESOLVE_UNKNOWN_PERMISSION))


class Refused(BasePermission):
    """Nobody: for the calls a view lists no permissions for, such as OPTIONS."""

    message = "The scheduler API refuses this method here, to everyone."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return False


DEFAULT_CLASSES: tuple[type[BasePermission], ...] = (IsStaffWithModelPermissions,)


def permission_classes() -> list[type[BasePermission]]:
    """The classes named in API_PERMISSION_CLASSES, or the default."""
    configured: Any = scheduler_settings.API_PERMISSION_CLASSES
    if configured is None:
        return list(DEFAULT_CLASSES)
    return [import_string(item) if isinstance(item, str) else item for item in configured]
