"""The js handler: validation, context and result, async code, and hostile code that must not hang or kill the runner."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from scheduler_app import scheduler
from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.handlers import javascript, js_pool
from scheduler_app.handlers.base import HandlerError
from scheduler_app.handlers.js_pool import Pool, close_shared_pool
from scheduler_app.models import Execution, Status, Task
from tests.factories import definition, inline_runner
from tests.system.processes import RunnerProcess
from tests.waiting import wait_for

SPIN = "() => { while (true) {} }"


def js(code: str, **options: Any) -> dict[str, Any]:
    return {"kind": "js", "code": code, **options}


def run_due(clock) -> dict[str, Execution]:
    """Run every task due in the next minute on an inline runner; the executions by task id."""
    runner = inline_runner(clock)
    clock.advance(60)
    runner.tick()
    return {execution.task_id: execution for execution in Execution.objects.all()}


def event_for(code: str, timeout: float = 30) -> TaskEvent:
    task = Task(id="direct", name="Direct", cron="* * * * *", handler=js(code, timeout=timeout))
    context = ExecutionContext("occurrence", 1, 1, "token", "direct", {}, "manual", "")
    return TaskEvent(task=task, context=context)


def in_thread(handler_event: TaskEvent) -> tuple[threading.Thread, list[BaseException]]:
    """Run the handler in a thread; what it raised ends up in the returned list."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            javascript.JavaScriptHandler().run(handler_event)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, raised


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# -- validation -------------------------------------------------------------


@pytest.mark.django_db
def test_a_syntax_error_is_refused_at_register_with_code_030():
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition(handler=js("(context) => {")))
    (message,) = caught.value.errors["handler.code"]
    assert message.startswith("scheduler:030 SyntaxError: ")
    assert not Task.objects.exists()


@pytest.mark.django_db
def test_an_update_with_a_syntax_error_changes_nothing():
    scheduler.register(definition(handler=js("(context) => 1")))
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.update_task("report", handler=js("(context) => )"))
    assert caught.value.errors["handler.code"][0].startswith("scheduler:030 ")
    assert Task.objects.get().handler == js("(context) => 1")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("handler", "field"),
    [
        (js("() => 1", url="https://example.com"), "handler"),
        ({"kind": "js"}, "handler.code"),
        (js(""), "handler.code"),
        (js("   "), "handler.code"),
        ({"kind": "js", "code": 5}, "handler.code"),
        (js("() => 1" + " " * javascript.MAX_CODE_CHARS), "handler.code"),
        (js("() => 1", timeout=0), "handler.timeout"),
        (js("() => 1", timeout=-1), "handler.timeout"),
        (js("() => 1", timeout="5"), "handler.timeout"),
        (js("() => 1", timeout=True), "handler.timeout"),
        (js("() => 1", timeout=3601), "handler.timeout"),
    ],
)
def test_bad_configs_are_refused(handler, field):
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition(handler=handler))
    assert list(caught.value.errors) == [field]


def test_the_syntax_check_runs_once_per_distinct_source(monkeypatch):
    calls: list[str] = []
    ask = javascript._ask

    def counting_ask(code: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(code)
        return ask(code, *args, **kwargs)

    monkeypatch.setattr(javascript, "_ask", counting_ask)
    handler = javascript.JavaScriptHandler()
    source = f"(context) => {time.monotonic_ns()}"
    for _ in range(3):
        assert handler.validate(js(source)) == {}
        assert "code" in handler.validate(js(source + " +"))
    assert calls == [source, source + " +"]


# -- results ----------------------------------------------------------------


@pytest.mark.django_db
def test_the_function_receives_the_context_and_its_value_is_the_result(clock):
    code = "(context) => ({ context, keys: Object.keys(context) })"
    scheduler.register(definition(cron="0 0 1 1 *", params={"a": 1}, handler=js(code)))
    execution = scheduler.trigger("report", source="billing", params={"b": [2]})
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.SUCCESS
    assert execution.result == {
        "context": {
            "taskId": "report",
            "occurrenceId": str(execution.occurrence_id),
            "sequence": execution.sequence,
            "attempt": 1,
            "params": {"a": 1, "b": [2]},
            "trigger": {"type": "manual", "source": "billing"},
        },
        "keys": ["taskId", "occurrenceId", "sequence", "attempt", "params", "trigger"],
    }


@pytest.mark.django_db
def test_a_scheduled_run_sees_its_trigger_as_scheduled_by_cron(clock):
    scheduler.register(definition(handler=js("(context) => context.trigger")))
    execution = run_due(clock)["report"]
    assert (execution.status, execution.result) == (Status.SUCCESS, {"type": "scheduled", "source": "cron"})


@pytest.mark.django_db
def test_async_functions_promises_and_timers_within_the_attempt_are_awaited(clock):
    scheduler.register(
        definition(
            "async",
            params={"n": 21},
            handler=js(
                "async (context) => { await new Promise((resolve) => setTimeout(resolve, 0));"
                " return context.params.n * 2; }"
            ),
        )
    )
    scheduler.register(definition("promise", handler=js("() => Promise.resolve({ done: true })")))
    scheduler.register(definition("nothing", handler=js("() => {}")))
    executions = run_due(clock)
    assert executions["async"].result == 42
    assert executions["promise"].result == {"done": True}
    assert (executions["nothing"].status, executions["nothing"].result) == (Status.SUCCESS, None)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("() => 10n", "The result is not JSON: TypeError: Do not know how to serialize a BigInt"),
        ("() => { const node = {}; node.self = node; return node; }", "The result is not JSON: TypeError: "),
        ("() => () => 1", "The result is not JSON."),
        ("() => ({ toJSON() { throw new Error('no'); } })", "The result is not JSON: Error: no"),
        ("() => { throw new TypeError('bad input'); }", "TypeError: bad input"),
        ("async () => { throw new RangeError('nope'); }", "RangeError: nope"),
        ("() => { throw 'plain'; }", "Uncaught plain"),
        ("() => missing.value", "ReferenceError: missing is not defined"),
        ("42", "The code must be a function expression."),
    ],
)
def test_exceptions_and_results_that_are_not_json_fail_with_024(clock, code, message):
    scheduler.register(definition(handler=js(code)))
    execution = run_due(clock)["report"]
    assert execution.status == Status.FAILED
    assert execution.error["code"] == "scheduler:024"
    assert execution.error["message"].startswith(message)


@pytest.mark.django_db
def test_error_messages_are_short(clock):
    scheduler.register(definition(handler=js("() => { throw new Error('x'.repeat(10 ** 7)); }")))
    error = run_due(clock)["report"].error
    assert error["code"] == "scheduler:024"
    assert error["message"].startswith("Error: xxx") and len(error["message"]) <= 500


@pytest.mark.django_db
@override_settings(SCHEDULER_APP={"JS": {"RESULT_MAX_BYTES": 10}})
def test_a_result_over_result_max_bytes_fails(clock):
    scheduler.register(definition("small", handler=js("() => 'é'.repeat(4)")))
    scheduler.register(definition("large", handler=js("() => 'é'.repeat(5)")))
    executions = run_due(clock)
    assert executions["small"].result == "éééé"
    assert executions["large"].error == {
        "code": "scheduler:024",
        "message": "The result is larger than 10 bytes.",
    }


@pytest.mark.django_db
def test_code_that_no_longer_compiles_fails_with_030_at_run_time(clock):
    scheduler.register(definition(handler=js("() => 1")))
    Task.objects.update(handler=js("() => {"))
    error = run_due(clock)["report"].error
    assert error["code"] == "scheduler:030" and error["message"].startswith("SyntaxError: ")


@pytest.mark.django_db
def test_each_attempt_gets_a_fresh_global_scope(clock):
    code = "() => { globalThis.count = (globalThis.count || 0) + 1; return globalThis.count; }"
    scheduler.register(definition("first", handler=js(code)))
    scheduler.register(definition("second", handler=js(code)))
    executions = run_due(clock)
    assert executions["first"].result == executions["second"].result == 1


# -- text that is not well-formed --------------------------------------------

REPLACED = "\N{REPLACEMENT CHARACTER}"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("() => { throw new Error('bad\\ud800thing'); }", f"Error: bad{REPLACED}thing"),
        ("() => { throw 'lone \\udc00'; }", f"Uncaught lone {REPLACED}"),
        ("async () => { throw new TypeError('x\\ud800'); }", f"TypeError: x{REPLACED}"),
        ("() => Promise.reject('\\udfff\\ud800y')", f"Uncaught {REPLACED}{REPLACED}y"),
        (
            "() => ({ toJSON() { throw new Error('\\ud800'); } })",
            f"The result is not JSON: Error: {REPLACED}",
        ),
    ],
)
def test_lone_surrogates_in_error_messages_become_replacement_characters(code, message):
    # A timeout would end the attempt as "timed out": the exact message shows the error arrived.
    with pytest.raises(HandlerError) as caught:
        javascript.JavaScriptHandler().run(event_for(code, timeout=20))
    assert (caught.value.code, caught.value.message) == ("scheduler:024", message)


def test_a_result_with_lone_surrogates_and_nul_comes_back_escaped():
    result = javascript.JavaScriptHandler().run(
        event_for("() => ({ '\\ud800': '\\u0000x\\udc00' })", timeout=20)
    )
    assert result == {"\ud800": "\x00x\udc00"}


def test_a_promise_with_its_own_then_cannot_hand_back_raw_text():
    code = "() => { const promise = Promise.resolve(1); promise.then = () => 'raw \\ud800'; return promise; }"
    assert javascript.JavaScriptHandler().run(event_for(code, timeout=20)) == 1


def test_text_that_cannot_be_decoded_fails_the_attempt_at_once():
    # A replaced Promise.prototype.then hands mini-racer a lone surrogate, past the wrapper.
    code = (
        "() => { Promise.prototype.then = function (resolve, reject) { reject('\\ud800'); };"
        " return Promise.resolve(1); }"
    )
    handler = javascript.JavaScriptHandler()
    with pytest.raises(HandlerError) as caught:
        handler.run(event_for(code, timeout=20))
    assert (caught.value.code, caught.value.message) == (
        "scheduler:024",
        "The value from JavaScript is not well-formed text.",
    )
    assert handler.run(event_for("() => 'next'")) == "next"


def test_a_compile_error_with_a_lone_surrogate_is_reported_with_a_replacement_character():
    code = "() => /(\ud800/"
    message = f"SyntaxError: Invalid regular expression: /({REPLACED}/: Unterminated group"
    handler = javascript.JavaScriptHandler()
    assert handler.validate(js(code)) == {"code": [f"scheduler:030 {message}"]}
    with pytest.raises(HandlerError) as caught:
        handler.run(event_for(code, timeout=20))
    assert (caught.value.code, caught.value.message) == ("scheduler:030", message)


FAKE_CHILD = """
import os, struct
os.read(0, struct.unpack("!I", os.read(0, 4))[0])
os.write(1, struct.pack("!I", len(BODY)) + BODY)
"""


@pytest.mark.parametrize(
    "body",
    [b"[1]", b"null", b'{"result": 5}', b'{"error": "no code"}', b'{"code": "x", "error": 5}', b"\xff\xfe"],
)
def test_an_answer_of_the_wrong_shape_fails_with_024(tmp_path, monkeypatch, body):
    child = tmp_path / "child.py"
    child.write_text(f"BODY = {body!r}\n{FAKE_CHILD}")
    monkeypatch.setattr(js_pool, "CHILD", child)
    pool = Pool(128)
    with pytest.raises(HandlerError) as caught:
        pool.ask({}, time.monotonic() + 10)
    assert (caught.value.code, caught.value.message) == (
        "scheduler:024",
        "The JavaScript process sent a malformed answer.",
    )
    pool.close()


# -- hostile code -----------------------------------------------------------

HOSTILE = {
    "busy loop": (SPIN, "timed out"),
    "timer loop": (
        "async () => { setTimeout(() => { while (true) {} }, 0);"
        " await new Promise((resolve) => setTimeout(resolve, 10)); }",
        "timed out",
    ),
    "microtask loop": ("async () => { await null; while (true) {} }", "timed out"),
    "growing array": (
        "() => { const items = []; while (true) items.push({ n: items.length }); }",
        "Out of memory",
    ),
    "huge ArrayBuffer": (
        "() => new ArrayBuffer(2 ** 32).byteLength",
        "RangeError: Array buffer allocation failed",
    ),
    "typed arrays": (
        "() => { const all = []; while (true) all.push(new Uint8Array(2 ** 26).fill(1)); }",
        "RangeError: Array buffer allocation failed",
    ),
    "WebAssembly.Memory": (
        "() => new WebAssembly.Memory({ initial: 65536 }).buffer.byteLength",
        "RangeError: WebAssembly.Memory(): could not allocate memory",
    ),
    "toJSON loops": ("() => ({ toJSON() { while (true) {} } })", "timed out"),
    "async toJSON loops": ("async () => ({ toJSON() { while (true) {} } })", "timed out"),
    "getter loops": (
        "() => { const error = new Error();"
        " Object.defineProperty(error, 'message', { get() { while (true) {} } }); throw error; }",
        "timed out",
    ),
    "100 MB string": ("() => 'x'.repeat(100 * 1024 * 1024)", "The result is larger than 65536 bytes."),
}


def timeout_for(message: str) -> float:
    """Spinning cases end at their timeout; the others get time to reach their limit on a busy machine."""
    return 1 if message == "timed out" else 10


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_code_fails_with_024_and_the_next_task_still_runs(clock, case):
    code, message = HOSTILE[case]
    scheduler.register(definition("hostile", handler=js(code, timeout=timeout_for(message))))
    scheduler.register(definition("next", handler=js("(context) => context.taskId")))
    started = time.monotonic()
    executions = run_due(clock)
    assert time.monotonic() - started < 15  # ended at its limit or its timeout (the message says which)
    hostile = executions["hostile"]
    assert (hostile.status, hostile.error["code"]) == (Status.FAILED, "scheduler:024")
    assert hostile.error["message"].startswith(message)
    assert (executions["next"].status, executions["next"].result) == (Status.SUCCESS, "next")
    assert len(javascript.pool().children()) <= 2


def test_a_child_that_misses_its_deadline_is_killed_and_replaced():
    close_shared_pool()
    handler = javascript.JavaScriptHandler()
    handler.run(event_for("() => 1"))
    (before,) = javascript.pool().children()
    with pytest.raises(HandlerError, match="timed out"):
        handler.run(event_for("async () => { await null; while (true) {} }", timeout=0.2))
    assert not alive(before)
    assert handler.run(event_for("() => 2")) == 2
    assert len(javascript.pool().children()) == 1


def test_after_a_burst_only_a_few_children_wait_for_the_next_request():
    """Each js attempt running at once has a child; once they end, all but MAX_IDLE are ended."""
    from scheduler_app.handlers import js_pool

    close_shared_pool()
    burst = js_pool.MAX_IDLE + 2
    busy = "() => { const end = Date.now() + 3000; while (Date.now() < end) {} return 1 }"
    threads = [in_thread(event_for(busy)) for _ in range(burst)]
    started = wait_for(lambda: (pids := javascript.pool().children()) and len(pids) == burst and pids)
    for thread, raised in threads:
        thread.join(30)
        assert not thread.is_alive() and raised == []
    kept = javascript.pool().children()
    assert len(kept) == js_pool.MAX_IDLE
    assert [pid for pid in started if pid not in kept and alive(pid)] == []


def test_a_crashed_child_is_replaced():
    close_shared_pool()
    thread, raised = in_thread(event_for(SPIN))
    (child,) = wait_for(lambda: javascript.pool().children())
    os.kill(child, signal.SIGKILL)
    thread.join(20)  # the attempt's timeout is 30 s
    assert not thread.is_alive()
    assert isinstance(raised[0], HandlerError) and "ended unexpectedly (signal SIGKILL)" in raised[0].message
    assert javascript.JavaScriptHandler().run(event_for("() => 'fine'")) == "fine"
    assert child not in javascript.pool().children()


def test_cancellation_kills_the_child_at_once():
    close_shared_pool()
    event = event_for(SPIN)
    thread, raised = in_thread(event)
    (child,) = wait_for(lambda: javascript.pool().children())
    started = time.monotonic()
    event.cancelled.set()
    thread.join(20)
    assert time.monotonic() - started < 10  # not the 30 s timeout
    assert isinstance(raised[0], HandlerError) and raised[0].code == "scheduler:024"
    assert not alive(child)
    assert javascript.pool().children() == []


def test_closing_the_pool_ends_attempts_in_flight():
    close_shared_pool()
    thread, raised = in_thread(event_for(SPIN))
    wait_for(lambda: javascript.pool().children())
    close_shared_pool()
    thread.join(20)  # the attempt's timeout is 30 s
    assert not thread.is_alive()
    assert isinstance(raised[0], HandlerError) and raised[0].code == "scheduler:024"
    assert javascript.JavaScriptHandler().run(event_for("() => 3")) == 3


def test_children_get_none_of_the_environment_but_what_starts_python(monkeypatch):
    monkeypatch.setenv("SCHEDULER_TEST_SECRET", "do-not-leak")
    close_shared_pool()
    javascript.JavaScriptHandler().run(event_for("() => 1"))
    (child,) = javascript.pool().children()
    environment = Path(f"/proc/{child}/environ").read_bytes()
    assert b"do-not-leak" not in environment
    assert b"PATH=" in environment


# -- a real runner process --------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_runner_process_survives_hostile_code_renews_leases_and_exits_on_sigterm(tmp_path):
    hostile = {re.sub(r"[^a-z0-9]+", "-", case.lower()): HOSTILE[case] for case in HOSTILE}
    handlers = {
        task_id: js(code, timeout=timeout_for(message)) for task_id, (code, message) in hostile.items()
    }
    handlers.update(echo=js("(context) => context.params"), forever=js(SPIN))
    for task_id, handler in handlers.items():
        scheduler.register(definition(task_id, cron="0 0 1 1 *", handler=handler))
    runner = RunnerProcess(tmp_path, "js-node", "--tick-interval", "0.2", lease=3)
    try:
        triggered = {task_id: scheduler.trigger(task_id).pk for task_id in hostile}
        echo = scheduler.trigger("echo", params={"n": 1}, wait=30)
        assert (echo.status, echo.result) == (Status.SUCCESS, {"n": 1})
        for task_id, pk in triggered.items():
            wait_for(lambda pk=pk: Execution.objects.get(pk=pk).status == Status.FAILED)
            error = Execution.objects.get(pk=pk).error
            assert error["code"] == "scheduler:024" and error["message"].startswith(hostile[task_id][1])
        forever = scheduler.trigger("forever")
        wait_for(lambda: Execution.objects.get(pk=forever.pk).status == Status.RUNNING)
        first_lease = Execution.objects.get(pk=forever.pk).lease_expires_at
        # Renewed every lease/3 s while V8 spins in a child: the runner itself is not blocked.
        wait_for(lambda: Execution.objects.get(pk=forever.pk).lease_expires_at > first_lease, timeout=10)
        children = children_of(runner.pid)
        assert children
        started = time.monotonic()
        assert runner.stop(timeout=10) == 0
        assert time.monotonic() - started < 5
        stopped = Execution.objects.get(pk=forever.pk)
        assert (stopped.status, stopped.error["message"]) == (Status.INTERRUPTED, "shutdown")
        wait_for(lambda: not any(alive(pid) for pid in children), timeout=5)
    finally:
        runner.kill()


# -- without mini-racer (the js extra) --------------------------------------

ROOT = Path(__file__).resolve().parent.parent
UNAVAILABLE = {
    "code": "scheduler:033",
    "message": "mini-racer is not installed on this node: install django-scheduler-app[js] to run js tasks here.",
}


@pytest.fixture
def without_v8(monkeypatch):
    """This Python as installed without the js extra: py_mini_racer cannot be imported."""
    monkeypatch.setitem(sys.modules, "py_mini_racer", None)
    close_shared_pool()


def test_v8_is_available_with_the_js_extra_and_not_without_it(monkeypatch):
    assert javascript.v8_available()
    monkeypatch.setitem(sys.modules, "py_mini_racer", None)
    assert not javascript.v8_available()


@pytest.mark.django_db
def test_without_mini_racer_the_attempt_fails_with_033_naming_the_extra_and_starts_no_child(
    clock, without_v8, caplog
):
    scheduler.register(definition(handler=js("(context) => context.taskId")))
    execution = run_due(clock)["report"]
    assert (execution.status, execution.error) == (Status.FAILED, UNAVAILABLE)
    assert javascript.pool().children() == []
    assert [record for record in caplog.records if record.exc_info] == []


@pytest.mark.django_db
def test_without_mini_racer_js_tasks_can_still_be_registered_uncompiled(clock, without_v8):
    # A web node without V8 registers tasks that runners with V8 run: the first attempt compiles.
    scheduler.register(definition(handler=js("(context) => {")))
    scheduler.update_task("report", handler=js("(context) => )"))
    assert Task.objects.get().handler == js("(context) => )")


def test_a_child_that_cannot_import_mini_racer_answers_033_without_a_traceback(tmp_path, monkeypatch, capfd):
    broken = tmp_path / "py_mini_racer"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise ImportError('libmini_racer.so: cannot open shared object file')\n"
    )
    # This process still finds the real mini-racer; only the children see the broken one.
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    close_shared_pool()
    handler = javascript.JavaScriptHandler()
    try:
        for _ in range(2):
            with pytest.raises(HandlerError) as caught:
                handler.run(event_for("() => 1"))
            assert (caught.value.code, caught.value.message) == (UNAVAILABLE["code"], UNAVAILABLE["message"])
        assert handler.validate(js(f"() => {time.monotonic_ns()}")) == {}
        assert len(javascript.pool().children()) == 1
    finally:
        close_shared_pool()
    assert "Traceback" not in capfd.readouterr().err


def test_a_process_tree_without_mini_racer_loads_the_app_passes_its_checks_and_fails_js_with_033(tmp_path):
    # sitecustomize runs in every Python started with this PYTHONPATH: the test's and its JS helpers.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['py_mini_racer'] = None\n")
    script = """
import django
django.setup()
from django.core.management import call_command
from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.handlers import registry
from scheduler_app.handlers.base import HandlerError
from scheduler_app.models import Task

call_command("check")
handler = registry.get("js")
assert handler.validate({"kind": "js", "code": "(context) => 1"}) == {}
task = Task(id="direct", cron="* * * * *", handler={"kind": "js", "code": "() => 1"})
context = ExecutionContext("occurrence", 1, 1, "token", "direct", {}, "manual", "")
try:
    handler.run(TaskEvent(task=task, context=context))
except HandlerError as exc:
    print(exc.code)
"""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    finished = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.splitlines()[-1] == "scheduler:033"
    assert "Traceback" not in finished.stderr
