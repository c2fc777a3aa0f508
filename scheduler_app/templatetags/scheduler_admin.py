"""Template tags of the scheduler's admin pages."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()

VIEW_PERMISSION = "scheduler_app.view_execution"


@register.inclusion_tag("admin/scheduler_app/dashboard.html", takes_context=True)
def scheduler_dashboard(context: template.Context) -> dict[str, Any]:
    """The dashboard, for users who may see executions."""
    from scheduler_app.admin.dashboard import dashboard

    request = context.get("request")
    if request is None or not request.user.has_perm(VIEW_PERMISSION):
        return {"visible": False}
    return {"visible": True, **dashboard()}


@register.inclusion_tag("admin/scheduler_app/runner_warning.html", takes_context=True)
def scheduler_runner_warning(context: template.Context) -> dict[str, Any]:
    """A warning, for users who may see executions, when no runner is alive: one statement."""
    from django.db.models.functions import Now
    from django.urls import reverse

    from scheduler_app.models import Runner

    request = context.get("request")
    if request is None or not request.user.has_perm(VIEW_PERMISSION):
        return {"visible": False}
    alive = Runner.objects.with_state(Now()).filter(state="alive").exists()
    return {"visible": not alive, "dashboard_url": reverse("admin:app_list", args=["scheduler_app"])}
