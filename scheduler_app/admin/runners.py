"""The runner admin: which nodes are alive, since when, and what they hold."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from scheduler_app.admin import display
from scheduler_app.admin.common import ReadOnlyAdmin, tell
from scheduler_app.db import probe
from scheduler_app.models import LEASED, Execution, Runner, RunnerQuerySet

STATES = ("alive", "silent", "stopped")
ACKNOWLEDGE_PERMISSION = "scheduler_app.change_runner"


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in STATES:
            return queryset.filter(state=self.value())
        return queryset


@admin.register(Runner)
class RunnerAdmin(ReadOnlyAdmin):
    list_display = ("node_id", "state", "started", "last_seen", "holds", "ran", "host", "pid", "version")
    list_filter = (StateFilter,)
    search_fields = ("node_id", "host")
    actions = ["mark_stopped"]

    def has_acknowledge_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(ACKNOWLEDGE_PERMISSION))

    @admin.action(description="Mark selected silent runners as stopped", permissions=["acknowledge"])
    def mark_stopped(self, request: HttpRequest, queryset: QuerySet[Runner]) -> None:
        """A runner killed without a clean stop stays silent, and scheduler_status reports it for a
        day: the operator who knows it is gone says so. Only runners silent at the database's now
        are marked (their leases have expired: other runners recover what they held); a heartbeat
        from one of them later makes it alive again."""
        chosen = [runner.node_id for runner in queryset]
        silent = Runner.objects.filter(node_id__in=chosen, stopped_at=None, silent_after__lt=Now())
        marked = sorted(silent.values_list("node_id", flat=True))
        silent.filter(node_id__in=marked).update(stopped_at=Now())
        for runner in queryset.filter(node_id__in=marked):
            self.log_change(request, runner, "Marked as stopped.")
        tell(
            self,
            request,
            ngettext(
                "Marked %(count)d silent runner as stopped: %(items)s.",
                "Marked %(count)d silent runners as stopped: %(items)s.",
                len(marked),
            ),
            marked,
            messages.SUCCESS,
        )
        tell(
            self,
            request,
            ngettext(
                "Left %(count)d runner as it is (alive or already stopped): %(items)s.",
                "Left %(count)d runners as they are (alive or already stopped): %(items)s.",
                len(set(chosen) - set(marked)),
            ),
            sorted(set(chosen) - set(marked)),
            messages.WARNING,
        )

    def get_queryset(self, request: HttpRequest) -> RunnerQuerySet:
        held = (
            Execution.objects.filter(owner=OuterRef("node_id"), status__in=LEASED)
            .order_by()
            .values("owner")
            .annotate(n=Count("sequence"))
            .values("n")
        )
        runners = super().get_queryset(request)
        assert isinstance(runners, RunnerQuerySet)
        # The same rule as manage.py scheduler_status, on the database clock.
        return runners.with_state(probe().now).annotate(
            held=Coalesce(Subquery(held, output_field=IntegerField()), 0)
        )

    @admin.display(description="state", ordering="state")
    def state(self, runner: Runner) -> str:
        return str(getattr(runner, "state", ""))

    started = display.instant_column("started_at", "started")
    last_seen = display.instant_column("last_seen_at", "last heartbeat")

    @admin.display(description="executions")
    def ran(self, runner: Runner) -> SafeString:
        return format_html(
            '<a href="{}">every one it held</a>', display.changelist("execution", owner=runner.node_id)
        )

    @admin.display(description="holds (claimed or running)", ordering="held")
    def holds(self, runner: Runner) -> SafeString | int:
        held = int(getattr(runner, "held", 0))
        if not held:
            return 0
        query = urlencode({"owner": runner.node_id, "status__in": ",".join(LEASED)})
        url = f"{reverse('admin:scheduler_app_execution_changelist')}?{query}"
        return format_html('<a href="{}">{}</a>', url, held)
