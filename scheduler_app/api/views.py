"""API views: each one reads the request, calls a service and renders the result."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Q, QuerySet
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from scheduler_app import audit, definitions, health, listing
from scheduler_app.api import errors, permissions
from scheduler_app.api.parsers import JSONParser
from scheduler_app.api.schema import auto_schema, described, document, example
from scheduler_app.api.serializers import (
    BackfilledSerializer,
    BackfillSerializer,
    ErrorSerializer,
    ExecutionDetailSerializer,
    ExecutionPageSerializer,
    ExecutionQuerySerializer,
    ExecutionRowSerializer,
    ExecutionSerializer,
    ExecutionWindowSerializer,
    LogPageSerializer,
    LogQuerySerializer,
    LogSerializer,
    NextRunsQuerySerializer,
    NextRunsSerializer,
    PauseSerializer,
    RepairSerializer,
    ResolveSerializer,
    RunnerSerializer,
    TaskChangeSerializer,
    TaskHistorySerializer,
    TaskQuerySerializer,
    TaskSerializer,
    TriggeredSerializer,
    TriggerManySerializer,
    TriggerSerializer,
    WindowQuerySerializer,
)
from scheduler_app.db import probe
from scheduler_app.exceptions import TaskNotFound
from scheduler_app.models import (
    CHANGE_HANDLER_PERMISSION,
    RESOLVE_UNKNOWN_PERMISSION,
    ChangeVia,
    Execution,
    ExecutionLog,
    Runner,
    Task,
    TaskChange,
)
from scheduler_app.services import MAX_PAGE_SIZE, LogPage, scheduler

NIGHTLY_REPORT = {
    "id": "nightly-report",
    "name": "Nightly report",
    "cron": "0 2 * * *",
    "timezone": "Europe/Berlin",
    "retry": {"max_attempts": 3, "backoff": [10, 60]},
    "idempotent": True,
    "params": {"channel": "ops"},
}


DECLARED = described(
    ErrorSerializer,
    "The task is declared in code (declared_in settings or code): its fields other than enabled "
    "are changed in its declaration, and it is not deleted here (scheduler:044).",
)


def _errors(*codes: int) -> dict[int, Any]:
    """Error responses of an operation, with those any call can get."""
    descriptions = {
        400: "Invalid input (code scheduler:012 or scheduler:022, with fields).",
        401: "Not authenticated (with authentication schemes that send a challenge).",
        403: "Not authenticated, or not allowed.",
        404: "No such task or execution.",
        409: "Conflict with the current state.",
        415: "The body is not JSON.",
        500: "Internal error, with a correlation id.",
        503: "The database refused the operation (scheduler:026), with a correlation id.",
    }
    return {code: described(ErrorSerializer, descriptions[code]) for code in (*codes, 401, 403, 500, 503)}


class Pagination(PageNumberPagination):
    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE


class SchedulerViewSet(viewsets.GenericViewSet):
    """JSON only, one exception handler, and the permissions each action needs."""

    parser_classes = [JSONParser]
    pagination_class: type[Pagination] | None = Pagination
    schema = auto_schema()
    action_permissions: dict[str, tuple[str, ...]] = {}

    def get_exception_handler(self) -> Callable[..., Any]:
        return errors.exception_handler

    def get_permissions(self) -> list[BasePermission]:
        checks = [cls() for cls in permissions.permission_classes()]
        if self.action is not None and self.action not in self.action_permissions:
            # OPTIONS ("metadata") among others: it would need no permission, and on a detail
            # URL its answer tells whether the id exists.
            checks.append(permissions.Refused())
        if self.action == "resolve":
            checks.append(permissions.CanResolveUnknown())
        return checks

    def required_permissions(self, request: Request) -> tuple[str, ...]:
        return self.action_permissions.get(self.action or "", ())

    def by(self) -> str:
        return str(self.request.user.get_username())

    def acting(self) -> AbstractContextManager[None]:
        """Task changes made inside are recorded as this API client's."""
        return audit.acting(self.by(), via=ChangeVia.API)

    def window(
        self,
        request: Request,
        listed: Callable[..., Sequence[Any]],
        whole: QuerySet[Any],
        serializer: type[serializers.BaseSerializer[Any]],
    ) -> Response:
        """``listed(limit=, offset=)`` as a window with the count of ``whole`` and links to its neighbours."""
        query = WindowQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        limit, offset = query.validated_data["limit"], query.validated_data["offset"]
        rows = listed(limit=limit, offset=offset)
        count = whole.count()
        url = request.build_absolute_uri()
        following = replace_query_param(url, "offset", offset + limit) if offset + limit < count else None
        preceding = replace_query_param(url, "offset", max(0, offset - limit)) if offset > 0 else None
        return Response(
            {
                "count": count,
                "next": following,
                "previous": preceding,
                "results": serializer(rows, many=True).data,
            }
        )


class TaskViewSet(SchedulerViewSet):
    """Task definitions: list, create, retrieve, replace, update, delete, trigger."""

    queryset = Task.objects.all()
    serializer_class = TaskSerializer
    lookup_value_regex = "[^/]+"
    action_permissions = {
        "list": ("scheduler_app.view_task",),
        "retrieve": ("scheduler_app.view_task",),
        "create": ("scheduler_app.add_task",),
        "update": ("scheduler_app.change_task",),
        "partial_update": ("scheduler_app.change_task",),
        "destroy": ("scheduler_app.delete_task",),
        "trigger": ("scheduler_app.add_execution",),
        "trigger_many": ("scheduler_app.add_execution",),
        "backfill": ("scheduler_app.add_execution",),
        "history": ("scheduler_app.view_task",),
        "next_runs": ("scheduler_app.view_task",),
        # Pausing and resuming change enabled: as a PATCH of it does.
        "pause": ("scheduler_app.change_task",),
        "resume": ("scheduler_app.change_task",),
    }

    def task_id(self) -> str:
        task_id = str(self.kwargs["pk"])
        # An id that cannot be valid cannot exist; some databases refuse to compare with it (NUL).
        if not definitions.ID_PATTERN.match(task_id):
            raise TaskNotFound()
        return task_id

    def get_object(self) -> Task:
        task = Task.objects.filter(id=self.task_id()).first()
        if task is None:
            raise TaskNotFound()
        return task

    def check_handler_change(self, task: Task | None, handler: Any) -> None:
        """Changing what a task runs (JavaScript code, HTTP targets) needs its own permission, as in the admin."""
        stored = task.handler if task is not None else None
        if handler != stored and not self.request.user.has_perm(CHANGE_HANDLER_PERMISSION):
            raise exceptions.PermissionDenied(
                f"{permissions.missing_message([CHANGE_HANDLER_PERMISSION])} Changing what a task runs needs it."
            )

    @document(
        parameters=[TaskQuerySerializer], responses={200: TaskSerializer(many=True), **_errors(400, 404)}
    )
    def list(self, request: Request) -> Response:
        query = TaskQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        tasks: QuerySet[Task] = Task.objects.all()
        if query.validated_data.get("enabled") is not None:
            tasks = tasks.filter(enabled=query.validated_data["enabled"])
        if search := query.validated_data.get("search"):
            tasks = tasks.filter(Q(id__icontains=search) | Q(name__icontains=search))
        page = self.paginate_queryset(tasks)
        return self.get_paginated_response(TaskSerializer(page, many=True).data)

    @document(
        request=TaskSerializer,
        responses={201: TaskSerializer, **_errors(400, 409, 415)},
        examples=example("nightly report", NIGHTLY_REPORT),
    )
    def create(self, request: Request) -> Response:
        serializer = TaskSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        self.check_handler_change(None, serializer.validated_data.get("handler"))
        with self.acting():
            task = scheduler.register(serializer.validated_data)
        return Response(TaskSerializer(task).data, status=status.HTTP_201_CREATED)

    @document(responses={200: TaskSerializer, **_errors(404)})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(TaskSerializer(self.get_object()).data)

    @document(
        request=TaskSerializer,
        responses={200: TaskSerializer, **_errors(400, 404, 415), 409: DECLARED},
        description="Replace the definition: fields left out take their defaults.",
        examples=example("replace", {"cron": "30 1 * * *", "name": "Nightly report", "enabled": False}),
    )
    def update(self, request: Request, pk: str) -> Response:
        task = self.get_object()
        serializer = TaskSerializer(task, data=request.data)
        serializer.is_valid(raise_exception=True)
        # A handler left out of a whole definition is cleared: a change like any other.
        self.check_handler_change(task, serializer.validated_data.get("handler"))
        with self.acting():
            task = scheduler.replace_task(self.task_id(), serializer.validated_data)
        return Response(TaskSerializer(task).data)

    @document(
        request=TaskSerializer,
        responses={200: TaskSerializer, **_errors(400, 404, 415), 409: DECLARED},
        description="Change the fields given; null clears retry, handler and timezone.",
        examples=example("disable and clear the retry policy", {"enabled": False, "retry": None}),
    )
    def partial_update(self, request: Request, pk: str) -> Response:
        task = self.get_object()
        serializer = TaskSerializer(task, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        if "handler" in serializer.validated_data:
            self.check_handler_change(task, serializer.validated_data["handler"])
        with self.acting():
            task = scheduler.update_task(self.task_id(), **serializer.validated_data)
        return Response(TaskSerializer(task).data)

    @document(responses={204: None, **_errors(404), 409: DECLARED})
    def destroy(self, request: Request, pk: str) -> Response:
        with self.acting():
            scheduler.unregister(self.task_id())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @document(
        request=PauseSerializer,
        responses={
            200: described(TaskSerializer, "The task, paused: enabled false, with its reason and until."),
            **_errors(400, 404, 415),
            409: described(
                ErrorSerializer,
                "Disabled because its declaration is gone (scheduler:042): declare it again, resume or delete it.",
            ),
        },
        examples=example(
            "paused for a migration", {"reason": "warehouse migration", "until": "2026-03-07T06:00:00+01:00"}
        ),
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        """Pause the task (enabled false) with a reason and, optionally, when it resumes by itself;
        pausing a paused task changes both. Declared tasks can be paused too."""
        task_id = self.task_id()
        serializer = PauseSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        with self.acting():
            task = scheduler.pause(task_id, reason=values.get("reason"), until=values.get("until"))
        return Response(TaskSerializer(task).data)

    @document(request=None, responses={200: TaskSerializer, **_errors(404)})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        """Resume the task (enabled true), its schedule from the next fire time: the paused minutes
        are not run. Nothing changes for an enabled task."""
        with self.acting():
            task = scheduler.resume(self.task_id())
        return Response(TaskSerializer(task).data)

    @document(parameters=[NextRunsQuerySerializer], responses={200: NextRunsSerializer, **_errors(400, 404)})
    @action(detail=True, url_path="next-runs")
    def next_runs(self, request: Request, pk: str) -> Response:
        """The task's next fire times after now (n, default 10, at most 100), in UTC and on the
        task's clock, daylight saving time applied; a disabled task has them too."""
        query = NextRunsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        task = self.get_object()
        times = scheduler.next_runs(task.id, query.validated_data["n"])
        # A stored timezone no zone database knows gives no fire times, so it is never read here.
        runs = [
            {
                "at": moment,
                "local": moment.astimezone(ZoneInfo(task.timezone or "UTC")).isoformat(),
                "due": task.due_time(moment),
                "runs": not task.pause_skips(moment),
            }
            for moment in times
        ]
        # The task's fields the serializer shows beside the fire times: its schedule.
        shown = set(NextRunsSerializer().fields) - {"task_id", "next_runs"}
        schedule = {field: getattr(task, field) for field in shown}
        return Response(NextRunsSerializer({"task_id": task.id, **schedule, "next_runs": runs}).data)

    @document(
        request=BackfillSerializer,
        responses={
            200: described(BackfilledSerializer, "A dry run's fire times, or a backfill that created none."),
            202: described(BackfilledSerializer, "The executions created, pending, to run in turn."),
            **_errors(400, 404, 415),
            409: described(
                ErrorSerializer,
                "The task's stored schedule cannot be evaluated (scheduler:042), or the task changed "
                "during the backfill (scheduler:041). A paused task's backfill is accepted: its "
                "executions wait for the resume.",
            ),
        },
        examples=example(
            "preview a night", {"start": "2026-03-01T00:00:00+01:00", "end": "2026-03-02T00:00:00+01:00"}
        ),
    )
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, pk: str) -> Response:
        """The task's fire times in [start, end) that have no execution and that the runners have
        passed: listed (dry_run, the default) or created as the scheduled occurrences they would
        have been, at most 1,000 per call."""
        task = self.get_object()
        serializer = BackfillSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        dry_run = values.get("dry_run", True)
        with self.acting():
            executions = scheduler.backfill(task.id, values.get("start"), values.get("end"), dry_run=dry_run)
        # The schedule was evaluated in this zone: the zone database knows it.
        zone = ZoneInfo(task.timezone or "UTC")
        fire_times = [e.scheduled_for for e in executions if e.scheduled_for is not None]
        data = {
            "task_id": task.id,
            "dry_run": dry_run,
            "count": len(executions),
            "fire_times": [{"at": at, "local": at.astimezone(zone).isoformat()} for at in fire_times],
            "executions": [] if dry_run else executions,
        }
        code = status.HTTP_202_ACCEPTED if executions and not dry_run else status.HTTP_200_OK
        return Response(BackfilledSerializer(data).data, status=code)

    @document(parameters=[WindowQuerySerializer], responses={200: TaskHistorySerializer, **_errors(400, 404)})
    @action(detail=True)
    def history(self, request: Request, pk: str) -> Response:
        """The task's changes, newest first: who made each (via admin, api, python, code or
        runner), when, and every changed field as [old, new], the handler masked. Kept after
        the task is deleted."""
        task_id = self.task_id()
        return self.window(
            request,
            lambda limit, offset: scheduler.task_history(task_id, limit=limit, offset=offset),
            TaskChange.objects.filter(task_id=task_id),
            TaskChangeSerializer,
        )

    @document(
        request=TriggerSerializer,
        responses={
            202: described(
                ExecutionSerializer, "A new execution, pending, due now or at run_at / after delay."
            ),
            200: described(ExecutionSerializer, "The execution this idempotency key created before."),
            **_errors(400, 404, 415),
            409: described(
                ErrorSerializer, "The idempotency key was used with other params (scheduler:041)."
            ),
        },
        examples=example(
            "with an idempotency key",
            {"source": "billing", "idempotency_key": "2026-10", "params": {"channel": "finance"}},
        ),
    )
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, pk: str) -> Response:
        task_id = self.task_id()
        serializer = TriggerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        source = values.get("source")
        execution, created = scheduler.get_or_trigger(
            task_id,
            source=self.by() if source in (None, "") else source,
            idempotency_key=values.get("idempotency_key"),
            params=values.get("params"),
            run_at=values.get("run_at"),
            delay=values.get("delay"),
        )
        code = status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK
        return Response(ExecutionSerializer(execution).data, status=code)

    @document(
        request=TriggerManySerializer,
        responses={
            202: described(TriggeredSerializer, "The executions, in order; at least one is new."),
            200: described(TriggeredSerializer, "The executions their idempotency keys created before."),
            **_errors(400, 404, 415),
            409: described(
                ErrorSerializer,
                "An idempotency key was used with other params (scheduler:041); nothing written.",
            ),
        },
        description="Many manual triggers of the task in one transaction, with trigger's rules for each.",
        examples=example(
            "three customers, one key each",
            {
                "source": "billing",
                "triggers": [
                    {"idempotency_key": f"2026-10/{n}", "params": {"customer": n}} for n in (1, 2, 3)
                ],
            },
        ),
    )
    @action(detail=True, methods=["post"], url_path="trigger-many")
    def trigger_many(self, request: Request, pk: str) -> Response:
        task_id = self.task_id()
        serializer = TriggerManySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        source = values.get("source")
        results = scheduler.get_or_trigger_many(
            task_id, values.get("triggers"), source=self.by() if source in (None, "") else source
        )
        created = sum(1 for _, new in results if new)
        data = TriggeredSerializer({"created": created, "executions": [e for e, _ in results]}).data
        return Response(data, status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK)


class LogViewSet(SchedulerViewSet):
    """The log rows of finished attempts, newest first, with the filters of get_logs."""

    queryset = ExecutionLog.objects.none()
    serializer_class = LogSerializer
    action_permissions = {"list": ("scheduler_app.view_executionlog",)}

    @document(parameters=[LogQuerySerializer], responses={200: LogPageSerializer, **_errors(400)})
    def list(self, request: Request) -> Response:
        query = LogQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        page = scheduler.get_logs(**query.validated_data)
        return Response(self.page_data(request, page))

    def page_data(self, request: Request, page: LogPage) -> dict[str, Any]:
        url = request.build_absolute_uri()
        return {
            "count": page.count,
            "count_exact": page.count_exact,
            "next": replace_query_param(url, "page", page.page + 1) if page.has_next else None,
            "previous": replace_query_param(url, "page", page.page - 1) if page.page > 1 else None,
            "results": LogSerializer(page.results, many=True).data,
        }


class ExecutionViewSet(SchedulerViewSet):
    """The journal, as its safe projection, and the operator's repairs."""

    queryset = Execution.objects.all()
    serializer_class = ExecutionSerializer
    # Its lists page by cursor, or by limit and offset: DRF's page numbers would count millions of rows.
    pagination_class = None
    lookup_field = "occurrence_id"
    lookup_value_regex = "[^/]+"
    action_permissions = {
        "list": ("scheduler_app.view_execution",),
        "retrieve": ("scheduler_app.view_execution",),
        "unknown": ("scheduler_app.view_execution",),
        "log_failures": ("scheduler_app.view_execution",),
        "resolve": ("scheduler_app.view_execution", RESOLVE_UNKNOWN_PERMISSION),
        "repair_log": ("scheduler_app.change_execution",),
        "stop": ("scheduler_app.change_execution",),
    }

    @document(parameters=[ExecutionQuerySerializer], responses={200: ExecutionPageSerializer, **_errors(400)})
    def list(self, request: Request) -> Response:
        """Executions matching every filter given, newest first; follow ``next`` for the next page."""
        query = ExecutionQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        page = scheduler.executions.list(**query.validated_data)
        url = request.build_absolute_uri()
        return Response(
            {
                "next": replace_query_param(url, "cursor", page.next_cursor) if page.next_cursor else None,
                "next_cursor": page.next_cursor,
                "results": ExecutionRowSerializer(page.results, many=True).data,
            }
        )

    @document(responses={200: ExecutionDetailSerializer, **_errors(404)})
    def retrieve(self, request: Request, occurrence_id: str) -> Response:
        return Response(ExecutionDetailSerializer(scheduler.executions.get(occurrence_id)).data)

    @document(parameters=[WindowQuerySerializer], responses={200: ExecutionWindowSerializer, **_errors(400)})
    @action(detail=False)
    def unknown(self, request: Request) -> Response:
        """Executions in state unknown, oldest change first: the ones waiting for an operator."""
        return self.window(
            request, scheduler.executions.list_unknown, listing.unknown(), ExecutionRowSerializer
        )

    @document(parameters=[WindowQuerySerializer], responses={200: ExecutionWindowSerializer, **_errors(400)})
    @action(detail=False, url_path="log-failures")
    def log_failures(self, request: Request) -> Response:
        """Ended and unknown executions whose log rows are not confirmed written, oldest change first."""
        return self.window(
            request, scheduler.executions.list_log_failures, listing.log_failures(), ExecutionRowSerializer
        )

    @document(
        request=ResolveSerializer,
        responses={
            200: ExecutionSerializer,
            **_errors(400, 404, 415),
            409: described(
                ErrorSerializer, "Not unknown (scheduler:042) or changed since read (scheduler:041)."
            ),
        },
        examples=example(
            "discard", {"status": "discarded", "expected_updated_at": "2026-03-02T09:00:00.123456Z"}
        ),
    )
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, occurrence_id: str) -> Response:
        """Settle an unknown execution as success or discarded; needs scheduler_app.resolve_unknown."""
        serializer = ResolveSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        execution = scheduler.executions.resolve_unknown(
            occurrence_id,
            serializer.validated_data.get("status"),
            serializer.validated_data.get("expected_updated_at"),
            by=self.by(),
        )
        return Response(ExecutionSerializer(execution).data)

    @document(request=None, responses={200: RepairSerializer, **_errors(404)})
    @action(detail=True, methods=["post"], url_path="repair-log")
    def repair_log(self, request: Request, occurrence_id: str) -> Response:
        """Rebuild the execution's log rows from its journal; safe to repeat, runs no handler."""
        rows = scheduler.executions.repair_log(occurrence_id)
        # repair_log found the execution, so the id is a valid UUID: answered in its canonical form.
        canonical = str(uuid.UUID(occurrence_id))
        return Response({"occurrence_id": canonical, "logs": LogSerializer(rows, many=True).data})

    @document(
        request=None,
        responses={
            200: ExecutionSerializer,
            **_errors(404),
            409: described(ErrorSerializer, "Not pending, claimed or running (scheduler:042)."),
        },
    )
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, occurrence_id: str) -> Response:
        """Stop an execution: pending ones end now, running ones within about a tick; no result counts after it."""
        return Response(
            ExecutionSerializer(scheduler.executions.request_stop(occurrence_id, by=self.by())).data
        )


class RunnerViewSet(SchedulerViewSet):
    """The runner processes ever recorded, by node id, with their state."""

    queryset = Runner.objects.none()
    serializer_class = RunnerSerializer
    pagination_class = None
    action_permissions = {"list": ("scheduler_app.view_runner",)}

    @document(responses={200: RunnerSerializer(many=True)})
    def list(self, request: Request) -> Response:
        """Every runner: alive until its heartbeat is overdue, silent after, stopped after a clean
        shutdown; on the database clock, as scheduler_status and the admin say."""
        return Response(RunnerSerializer(health.runners(probe().now), many=True).data)


def not_found(message: str) -> Callable[[HttpRequest], JsonResponse]:
    """A view answering 404 in the API's error shape, with DRF's ``not_found`` code, to any method."""

    # It reads nothing and changes nothing: a POST without a CSRF token gets the same 404.
    @csrf_exempt
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
        body = {"code": exceptions.NotFound.default_code, "message": message}
        return JsonResponse(body, status=status.HTTP_404_NOT_FOUND)

    return view


no_endpoint = not_found("No endpoint at this path.")
