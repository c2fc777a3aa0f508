"""The ``js`` handler kind: a function expression run in a fresh V8 isolate per attempt, in a child process.

V8 comes with the ``js`` extra (mini-racer), which only the child processes import. Where it is
missing, js tasks can still be registered (a web node may lack it while the runners have it), and
their attempts fail with ``scheduler:033``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

from scheduler_app.conf import scheduler_settings
from scheduler_app.events import TaskEvent
from scheduler_app.handlers.base import Handler, HandlerError
from scheduler_app.handlers.js_child import JS_COMPILE_FAILED, JS_FAILED, JS_UNAVAILABLE, UNAVAILABLE
from scheduler_app.handlers.js_pool import Pool, shared_pool
from scheduler_app.handlers.v8 import v8_available
from scheduler_app.values import is_number

KEYS = frozenset({"kind", "code", "timeout"})
MAX_TIMEOUT = 3600
MAX_CODE_CHARS = 100_000
CHECK_SECONDS = 10
DEFAULT_RESULT_MAX_BYTES = 64 * 1024
MAX_CHECKED = 1024

# Compile errors by SHA-256 of the source, "" when it compiles.
_checked: dict[str, str] = {}
_checked_lock = threading.Lock()


class JavaScriptHandler(Handler):
    """Calls ``code`` with the attempt's context; its JSON-serialisable value is the result."""

    kind = "js"

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        unknown = sorted(str(key) for key in config if key not in KEYS)
        if unknown:
            errors[""] = [f"Unknown keys: {', '.join(unknown)}."]
        code = config.get("code")
        if not isinstance(code, str) or not code.strip():
            errors["code"] = ["Must be a function expression, such as (context) => context.params."]
        elif len(code) > MAX_CODE_CHARS:
            errors["code"] = [f"Must be at most {MAX_CODE_CHARS} characters."]
        elif problem := compile_error(code):
            errors["code"] = [f"{JS_COMPILE_FAILED} {problem}"]
        timeout = config.get("timeout", 1)
        if not is_number(timeout) or not 0 < timeout <= MAX_TIMEOUT:
            errors["timeout"] = [f"Must be a number of seconds above 0 and at most {MAX_TIMEOUT}."]
        return errors

    def run(self, event: TaskEvent) -> Any:
        config = event.task.handler or {}
        deadline = time.monotonic() + config.get("timeout", scheduler_settings.JS["TIMEOUT"])
        answer = _ask(config.get("code", ""), deadline, event.cancelled, context=_context(event))
        if "error" in answer:
            raise HandlerError(answer["code"], answer["error"])
        try:
            return json.loads(answer["result"], parse_constant=_refuse)
        except (ValueError, RecursionError):
            raise HandlerError(JS_FAILED, "The result is not JSON.") from None


def compile_error(code: str) -> str:
    """Why ``code`` does not compile ("" when it does); checked once per distinct source.

    Where V8 is not installed there is nothing to check with: "", and the first attempt on a
    runner that has V8 compiles the code (scheduler:030).
    """
    if not v8_available():
        return ""
    # surrogatepass: code sent as JSON may hold lone surrogates; V8 reports them as U+FFFD.
    digest = hashlib.sha256(code.encode(errors="surrogatepass")).hexdigest()
    with _checked_lock:
        known = _checked.get(digest)
    if known is not None:
        return known
    try:
        answer = _ask(code, time.monotonic() + CHECK_SECONDS, threading.Event(), check=True)
    except HandlerError as exc:
        return "" if exc.code == JS_UNAVAILABLE else f"The code could not be checked: {exc.message}"
    problem = str(answer.get("error", ""))
    with _checked_lock:
        if len(_checked) >= MAX_CHECKED:
            _checked.clear()
        _checked[digest] = problem
    return problem


def pool() -> Pool:
    """The child processes of this process for the current MEMORY_LIMIT_MB."""
    return shared_pool(int(scheduler_settings.JS["MEMORY_LIMIT_MB"]))


def _ask(
    code: str, deadline: float, cancelled: threading.Event, *, context: Any = None, check: bool = False
) -> dict[str, Any]:
    if not v8_available():
        raise HandlerError(JS_UNAVAILABLE, UNAVAILABLE)
    js_settings = scheduler_settings.JS
    request = {
        "code": code,
        "check": check,
        "context": context,
        "deadline": deadline,
        "memory_bytes": int(js_settings["MEMORY_LIMIT_MB"]) * 1024 * 1024,
        "result_max_bytes": int(js_settings.get("RESULT_MAX_BYTES", DEFAULT_RESULT_MAX_BYTES)),
    }
    answer = pool().ask(request, deadline, cancelled)
    if answer.get("code") == JS_UNAVAILABLE:
        # The child could not import mini-racer although this process finds it (a broken install).
        raise HandlerError(JS_UNAVAILABLE, answer["error"])
    return answer


def _context(event: TaskEvent) -> dict[str, Any]:
    """What the function receives: the context with camelCase keys, never the execution token."""
    context = event.context
    return {
        "taskId": context.task_id,
        "occurrenceId": context.occurrence_id,
        "sequence": context.sequence,
        "attempt": context.attempt,
        "params": context.params,
        "trigger": {"type": context.trigger_type, "source": context.trigger_source},
    }


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")
