"""Resolving unknown executions: a confirmation page with the evidence, then one service call per row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import ngettext

from scheduler_app.admin.common import actor, tell
from scheduler_app.exceptions import Conflict, InvalidState, SchedulerError
from scheduler_app.models import Execution, Status
from scheduler_app.services import scheduler

EXPECTED_PREFIX = "expected_"
TEMPLATE = "admin/scheduler_app/execution/resolve_confirmation.html"


def confirm_or_resolve(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Execution], status: str
) -> TemplateResponse | None:
    """Show the confirmation page; once confirmed, resolve each row with the value the page showed."""
    if request.POST.get("post") == "yes":
        resolve_confirmed(modeladmin, request, queryset, status)
        return None
    return confirmation_page(modeladmin, request, queryset, status)


def confirmation_page(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Execution], status: str
) -> TemplateResponse:
    executions = list(queryset.order_by("updated_at").prefetch_related("events"))
    now = timezone.now()
    rows = [evidence(execution, now) for execution in executions]
    opts = modeladmin.model._meta
    context: dict[str, Any] = {
        **modeladmin.admin_site.each_context(request),
        "title": f"Resolve unknown executions as {status}?",
        "subtitle": None,
        "opts": opts,
        "app_label": opts.app_label,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "status": status,
        "rows": rows,
        "resolvable": [row for row in rows if row["resolvable"]],
        "refused": [row for row in rows if not row["resolvable"]],
        "expected_prefix": EXPECTED_PREFIX,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def evidence(execution: Execution, now: datetime) -> dict[str, Any]:
    """What an operator needs to decide: the history, the last attempt, its owner and lease."""
    events = list(execution.events.all())
    last_attempt = [event for event in events if event.attempt == execution.attempt and event.attempt]
    return {
        "execution": execution,
        "pk": execution.pk,
        "events": events,
        "last_attempt": last_attempt,
        "lease_expired": execution.lease_expires_at is not None and execution.lease_expires_at <= now,
        "resolvable": execution.status == Status.UNKNOWN,
        # The exact value read, microseconds included: the compare-and-set of resolve_unknown.
        "expected": execution.updated_at.isoformat(),
    }


def resolve_confirmed(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Execution], status: str
) -> None:
    done: list[str] = []
    conflicts: list[str] = []
    refused: list[str] = []
    for execution in queryset.order_by("updated_at"):
        name = f"{execution.task_id} {str(execution.occurrence_id)[:8]}"
        expected = _parse(request.POST.get(f"{EXPECTED_PREFIX}{execution.pk}", ""))
        if expected is None:
            refused.append(f"{name} (not confirmed on the confirmation page)")
            continue
        try:
            scheduler.executions.resolve_unknown(
                execution.occurrence_id, status, expected_updated_at=expected, by=actor(request)
            )
        except Conflict:
            conflicts.append(name)
            continue
        except InvalidState:
            if execution.updated_at != expected:
                conflicts.append(name)
            else:
                refused.append(f"{name} ({execution.status}, not unknown)")
            continue
        except SchedulerError as exc:
            refused.append(f"{name} ({exc.explained()})")
            continue
        modeladmin.log_change(request, execution, f"Resolved unknown as {status}.")
        done.append(name)
    tell(
        modeladmin,
        request,
        ngettext(
            "Resolved %(count)d unknown execution as %(status)s: %(items)s.",
            "Resolved %(count)d unknown executions as %(status)s: %(items)s.",
            len(done),
        ),
        done,
        messages.SUCCESS,
        status=status,
    )
    tell(
        modeladmin,
        request,
        ngettext(
            "%(count)d execution changed after the confirmation page was shown and was left alone "
            "(conflict; review it again): %(items)s.",
            "%(count)d executions changed after the confirmation page was shown and were left alone "
            "(conflict; review them again): %(items)s.",
            len(conflicts),
        ),
        conflicts,
        messages.WARNING,
    )
    tell(
        modeladmin,
        request,
        ngettext(
            "Refused to resolve %(count)d execution: %(items)s.",
            "Refused to resolve %(count)d executions: %(items)s.",
            len(refused),
        ),
        refused,
        messages.ERROR,
    )


def _parse(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
