"""Pieces the scheduler's admin pages share: the base admin, read-only admins and action reports."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import get_fields_from_path, quote, unquote
from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import BadRequest, PermissionDenied
from django.core.paginator import Page, Paginator
from django.db import connections, router
from django.db.models import QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from scheduler_app import audit
from scheduler_app.models import ChangeVia
from scheduler_app.statements import compiled_without_jit, journal_statements

LISTED_NAMES = 10
# How many rows past the first of the page shown a filtered list of the journal counts.
COUNT_AHEAD = 10_000
# How many tasks past the first of the page shown a filtered task list counts (two pages): a task's
# health and last outcome are worked out per task from its history, so each match counted costs
# a read of a task's history, and counting every match reads every task's.
TASK_COUNT_AHEAD = 200
# The deepest row a list's pages reach: a page further down answers as a page that does not
# exist (Django's redirect). A page reads the rows before it (OFFSET), and its count as many.
DEEPEST_ROW = 1_000_000


class SchedulerAdmin(admin.ModelAdmin):
    """The base of every scheduler admin: its list takes only the filters it offers, and no NUL.

    Django accepts a query-string filter on any local field (``?params__token__startswith=...``,
    ``?handler__icontains=...``): counting the rows it matches would reveal, one guess at a
    time, values the pages never show. Only the parameters of ``list_filter``,
    ``date_hierarchy`` and ``linked_lookups`` are accepted; anything else answers 400.
    """

    # Query-string filters other scheduler pages link to, beyond those the list offers.
    linked_lookups: tuple[str, ...] = ()
    # No "Show all": a list of the journal can hold millions of rows, each task of the task list
    # costs a read of its history, and a bounded count is no bound on all of them.
    list_max_show_all = 0

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in self.offered_lookups(request)

    def offered_lookups(self, request: HttpRequest) -> set[str]:
        """The query-string parameters the list's own filters read."""
        offered = set(self.linked_lookups)
        if self.date_hierarchy:
            offered.update(f"{self.date_hierarchy}{LOOKUP_SEP}{part}" for part in ("year", "month", "day"))
        item: Any
        for item in self.get_list_filter(request):
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                offered.add(str(item.parameter_name))
                continue
            if isinstance(item, type) and issubclass(item, admin.ListFilter):
                spec = item(request, {}, self.model, self)
            else:
                path, filter_class = (
                    item if isinstance(item, (list, tuple)) else (item, admin.FieldListFilter.create)
                )
                field = get_fields_from_path(self.model, path)[-1]
                spec = filter_class(field, request, {}, self.model, self, field_path=path)
            offered.update(str(name) for name in spec.expected_parameters() if name)
        return offered

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        # PostgreSQL refuses to compare text with NUL: a filter, search or selection holding one
        # would be a 500.
        for query in (request.GET, request.POST):
            if any("\x00" in "".join((key, *values)) for key, values in query.lists()):
                raise BadRequest("NUL characters in the request.")
        if request.method != "GET":  # an action: its writes keep their own transactions
            return super().changelist_view(request, extra_context)
        with compiled_without_jit(router.db_for_read(self.model)):
            response = super().changelist_view(request, extra_context)
            # The rows, and the cells drawn from them, are read as the page renders.
            if isinstance(response, TemplateResponse):
                response.render()
        return response

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        paginator = super().get_paginator(request, queryset, per_page, orphans, allow_empty_first_page)
        if isinstance(paginator, BoundedCountPaginator):
            # Counted from the page asked for, so that every page of matches can be reached.
            try:
                page = int(request.GET.get(PAGE_VAR, 1))
            except ValueError:
                page = 1
            paginator.first_row = max(0, page - 1) * per_page
            if paginator.first_row > DEEPEST_ROW:
                raise IncorrectLookupParameters("the page is deeper than a list's pages reach")
        return paginator

    def action_checkbox(self, obj: Any) -> SafeString:
        # What Django's own draws through a form widget's template, a tenth of a list's time.
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            str(obj.pk),
            label,
        )

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        # No key holds a NUL: the object is missing, as Django says of any other id that cannot exist.
        if "\x00" in object_id:
            return None
        return super().get_object(request, object_id, from_field)


class BoundedCountPaginator(Paginator):
    """A paginator that never counts millions of rows: Django's admin counts the whole filtered
    list for each page. An unfiltered list takes the database's estimate of the table's rows
    (PostgreSQL's statistics); a filtered one counts at most ``ahead`` rows past the first of the
    page shown (``first_row``, set by ``SchedulerAdmin.get_paginator``), and says "more than"
    beyond: each page of matches down to DEEPEST_ROW can be reached, and none costs more than its
    distance from the first."""

    ahead = COUNT_AHEAD
    first_row = 0
    estimated = False
    capped = False

    @property
    def limit(self) -> int:
        """The most rows this page's count says exactly."""
        return self.first_row + self.ahead

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet):
            estimate = _estimated_rows(rows)
            if estimate is not None and estimate > self.limit:
                self.estimated = True
                return estimate
            # Only the key, in no order: the count needs neither the columns nor the annotations
            # the list shows (a task's health is worked out from its history).
            found = rows.order_by().values("pk")[: self.limit + 1].count()
            # Capped, the count is what is known: more than the limit. Django must not take the
            # limit for the whole list (a last page, or a list that fits on one).
            self.capped = found > self.limit
            return found
        return super().count


class TaskCountPaginator(BoundedCountPaginator):
    """The task list's paginator: the whole list is counted exactly (tasks, not the journal). A
    filtered one reads, in the list's order, the keys of at most TASK_COUNT_AHEAD matches past the
    page's first, which stops early wherever matches are common (``?health=failing`` when many
    tasks fail), and reads the page's tasks by those keys: each task the filter tries costs a read
    of its history, and counting the matches, then reading the page as Django does, tried every
    task twice where few match."""

    ahead = TASK_COUNT_AHEAD
    # The keys of the page's tasks, once a filtered list is counted.
    page_keys: list[Any] | None = None

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        if not rows.query.where:
            return rows.count()
        keys = list(rows.values_list("pk", flat=True)[: self.limit + 1])
        self.capped = len(keys) > self.limit
        self.page_keys = keys[self.first_row : self.first_row + self.per_page]
        return len(keys)

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        if self.page_keys is None or (number - 1) * self.per_page != self.first_row:
            return super().page(number)
        return Page(self.listed(), number, self)

    def whole_list(self) -> list[Any] | None:
        """A filtered list that fits on its first page, read by the keys its count found; None for
        any other."""
        if self.page_keys is None or self.first_row or len(self.page_keys) != self.count:
            return None
        return self.listed()

    def listed(self) -> list[Any]:
        """The page's tasks, read by their keys, in the list's order."""
        keys, rows = self.page_keys or [], cast(QuerySet[Any], self.object_list)
        found = {row.pk: row for row in rows.filter(pk__in=keys)} if keys else {}
        return [found[key] for key in keys if key in found]


def _estimated_rows(rows: QuerySet[Any]) -> int | None:
    """The database's estimate of an unfiltered table's rows (PostgreSQL's statistics); None for a
    filtered list, or where there is none."""
    if rows.query.where:
        return None
    connection = connections[rows.db]
    return journal_statements(connection).estimated_rows(connection, rows.model._meta.db_table)


class ReadOnlyAdmin(SchedulerAdmin):
    """An admin for rows only the scheduler writes: no add, change or delete. Its lists can hold
    millions of rows: no exact count, no filter counts."""

    paginator = BoundedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def actor(request: HttpRequest) -> str:
    """Who acts: the admin user's name, recorded as trigger source or event node."""
    return str(request.user.get_username())


def acting(request: HttpRequest) -> AbstractContextManager[None]:
    """Task changes made inside are recorded in the audit trail as this admin user's."""
    return audit.acting(actor(request), via=ChangeVia.ADMIN)


def names(items: Sequence[str]) -> str:
    """The first few names of a list, then how many more."""
    shown = ", ".join(items[:LISTED_NAMES])
    if len(items) > LISTED_NAMES:
        shown += f" and {len(items) - LISTED_NAMES} more"
    return shown


def tell(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    text: str,
    items: Sequence[str],
    level: int,
    **values: str,
) -> None:
    """Send one action message (already chosen with ngettext) when it concerns any row.

    ``values`` fill the message's other placeholders, so the message id stays one string.
    """
    if items:
        modeladmin.message_user(request, text % {**values, "count": len(items), "items": names(items)}, level)


class ObjectActions(SchedulerAdmin):
    """Admin actions offered as buttons on an object's own page, run on that object alone.

    The button posts to ``<id>/act/``, which runs the list's action (with the list's permission
    checks) on a queryset of that one row; an action answering a page (a confirmation) gets it
    shown, and its form posts back to the same URL. Then the object's page again, with the message.
    """

    change_form_template = "admin/scheduler_app/change_form.html"

    def object_actions(self, request: HttpRequest, obj: Any) -> list[str]:
        """The names of the actions that make sense for this object now."""
        return []

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_act"
        act = path("<path:object_id>/act/", self.admin_site.admin_view(self.act_view), name=name)
        return [act, *super().get_urls()]

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404("No such object.")
        if not self.has_view_or_change_permission(request, obj):
            raise PermissionDenied
        chosen = str(request.POST.get("action", ""))
        found = self.get_actions(request).get(chosen)
        if found is None or chosen not in self.object_actions(request, obj):
            raise PermissionDenied
        function, _ = action_parts(found)
        with acting(request):
            response = function(self, request, self.get_queryset(request).filter(pk=obj.pk))
        if response is not None:
            return cast(HttpResponse, response)
        return redirect(
            reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[quote(obj.pk)])
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None:
            actions = self.get_actions(request)
            context["object_actions"] = [
                (name, str(action_parts(found)[1]))
                for name in self.object_actions(request, obj)
                if (found := actions.get(name)) is not None
            ]
        return super().render_change_form(request, context, add, change, form_url, obj)


def action_parts(action: Any) -> tuple[Any, str]:
    """An admin action's function and description: an Action on Django 6.1 (indexing it is
    deprecated), a tuple before."""
    if hasattr(action, "func"):
        return action.func, action.description
    return action[0], action[2]
