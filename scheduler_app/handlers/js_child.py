"""The JavaScript child process: answers its parent's requests, each in a fresh V8 isolate.

Run as ``python -P js_child.py MEMORY_LIMIT_MB``; it imports only the standard library and
py_mini_racer (the ``js`` extra: without it, every answer is the error ``scheduler:033``).
Requests arrive on stdin and answers leave on the original stdout, each a frame of a 4-byte
big-endian length and UTF-8 JSON:

    request  {"code": str, "context": object, "check": bool, "deadline": float,
              "memory_bytes": int, "result_max_bytes": int}
    answer   {"result": "<JSON text>"} or {"code": "scheduler:0NN", "error": str}

``check`` only compiles the code. ``deadline`` is a ``time.monotonic()`` value of the parent:
on Linux and macOS that clock is system-wide. The process ends when stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import signal
import struct
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
HEADER = struct.Struct("!I")
JS_FAILED = "scheduler:024"
JS_COMPILE_FAILED = "scheduler:030"
JS_UNAVAILABLE = "scheduler:033"
UNAVAILABLE = (
    "mini-racer is not installed on this node: install django-scheduler-app[js] to run js tasks here."
)
MESSAGE_CHARS = 500
# Seconds past the deadline after which the child ends itself, should its parent be gone.
ALARM_MARGIN = 10

# Built-ins are taken before the task's code runs, so that code cannot swap them under the wrapper.
# The prefix of the returned string says what it is: R (a JSON result), E (an error), C (no compile).
# Text leaves V8 well-formed: mini-racer cannot decode a lone surrogate, so its answer would never
# arrive. JSON.stringify escapes them itself; messages get U+FFFD in their place.
SCRIPT = """(() => {
  const stringify = JSON.stringify, toText = String, isError = (e) => e instanceof Error;
  const apply = Reflect.apply, toWellFormed = String.prototype.toWellFormed;
  const describe = (error) => {
    try {
      return apply(toWellFormed, isError(error) ? `${error.name}: ${error.message}` : `Uncaught ${toText(error)}`, []);
    } catch { return "An exception was thrown."; }
  };
  const tooLarge = "EThe result is larger than %(max)d bytes.";
  const encode = (value) => {
    let budget = %(max)d;
    // Counting as it goes stops a huge result before its text is built.
    const count = (key, item) => {
      budget -= key.length + (typeof item === "string" ? item.length : 1);
      if (budget < 0) throw tooLarge;
      return item;
    };
    try {
      const text = value === undefined ? "null" : stringify(value, count);
      return typeof text === "string" ? "R" + text : "EThe result is not JSON.";
    } catch (error) { return error === tooLarge ? error : "EThe result is not JSON: " + describe(error); }
  };
  // An async function settles as a native promise with its own text, whatever "then" the value has.
  const NativePromise = Promise;
  const settle = async (promise) => {
    try { return encode(await promise); } catch (error) { return "E" + describe(error); }
  };
  const setTimeout = globalThis.setTimeout;
  if (typeof setTimeout === "function") {
    // mini-racer 0.14 throws for a zero delay.
    globalThis.setTimeout = (fn, delay, ...args) => setTimeout(fn, Math.max(1, Number(delay) || 0), ...args);
  }
  let factory;
  try { factory = new Function(`return (${%(code)s}\\n);`); }
  catch (error) { return "C" + describe(error); }
  if (%(check)s) return "Rnull";
  try {
    const fn = factory();
    if (typeof fn !== "function") return "EThe code must be a function expression.";
    const value = fn(%(context)s);
    return value instanceof NativePromise ? settle(value) : encode(value);
  } catch (error) { return "E" + describe(error); }
})()"""


def main() -> None:
    """Start V8, cap memory, then answer requests until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from py_mini_racer import mini_racer
    except ImportError:
        # One clear answer per request rather than a traceback on the runner's stderr and a
        # replacement child that dies the same way.
        while read_frame(0) is not None:
            write_frame(1, {"code": JS_UNAVAILABLE, "error": UNAVAILABLE})
        return
    memory_limit_mb = int(sys.argv[1])
    # A late callback from a closed isolate would print a traceback on every timeout.
    sys.unraisablehook = lambda unraisable: None
    answers = os.dup(1)
    os.dup2(2, 1)
    loop = EventLoop()
    with mini_racer(loop.loop) as racer:
        racer.eval("0")
    limit_data(2 * memory_limit_mb * 1024 * 1024)
    while (request := read_frame(0)) is not None:
        deadline = request["deadline"]
        signal.alarm(max(1, math.ceil(deadline - time.monotonic())) + ALARM_MARGIN)
        answer = run(request, loop)
        signal.alarm(0)
        write_frame(answers, answer)


class Undecodable(Exception):
    """mini-racer could not decode a string from V8 (it is not well-formed UTF-16)."""


class EventLoop:
    """The event loop mini-racer runs on, in a thread; a string it cannot decode fails the evaluation at once."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_error)
        self._evaluation: asyncio.Task[Any] | None = None
        self._undecodable = False
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        """The coroutine's value; TimeoutError after ``timeout`` seconds."""
        return asyncio.run_coroutine_threadsafe(self._guard(coroutine, timeout), self.loop).result()

    async def _guard(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        self._evaluation, self._undecodable = asyncio.current_task(), False
        try:
            async with asyncio.timeout(timeout):
                return await coroutine
        except asyncio.CancelledError:
            if self._undecodable:
                raise Undecodable from None
            raise
        finally:
            self._evaluation = None

    def _on_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # mini-racer decodes V8's values in callbacks on this loop: when one fails, the value never
        # reaches the evaluation that waits for it, which would wait for its deadline.
        if not isinstance(context.get("exception"), UnicodeDecodeError):
            loop.default_exception_handler(context)
        elif self._evaluation is not None:
            self._undecodable = True
            self._evaluation.cancel()


def run(request: dict[str, Any], loop: EventLoop) -> dict[str, Any]:
    """Run or check one request in a fresh isolate, always closed before the answer is sent."""
    from py_mini_racer import JSEvalException, JSPromise, JSPromiseError, mini_racer

    deadline = request["deadline"]
    script = SCRIPT % {
        "code": json.dumps(request["code"]),
        "check": "true" if request.get("check") else "false",
        "context": json.dumps(request.get("context")),
        "max": request["result_max_bytes"],
    }
    try:
        with mini_racer(loop.loop) as racer:
            racer.set_hard_memory_limit(request["memory_bytes"])

            async def evaluate() -> Any:
                settled = await racer.eval_cancelable(script)
                return await settled if isinstance(settled, JSPromise) else settled

            try:
                value = loop.run(evaluate(), _remaining(deadline))
            except TimeoutError:
                return {"code": JS_FAILED, "error": "timed out"}
            except (JSEvalException, JSPromiseError) as exc:
                return _failure(exc, racer.was_hard_memory_limit_reached(), request["memory_bytes"])
    except MemoryError:
        return {"code": JS_FAILED, "error": "Out of memory."}
    except Undecodable:
        return {"code": JS_FAILED, "error": "The value from JavaScript is not well-formed text."}
    if not isinstance(value, str) or not value:
        return {"code": JS_FAILED, "error": "The result is not JSON."}
    kind, text = value[0], value[1:]
    if kind == "C":
        return {"code": JS_COMPILE_FAILED, "error": text[:MESSAGE_CHARS]}
    if kind != "R":
        return {"code": JS_FAILED, "error": text[:MESSAGE_CHARS]}
    if len(text.encode()) > request["result_max_bytes"]:
        return {"code": JS_FAILED, "error": f"The result is larger than {request['result_max_bytes']} bytes."}
    return {"result": text}


def _failure(exc: Exception, out_of_memory: bool, memory_bytes: int) -> dict[str, Any]:
    from py_mini_racer import JSOOMException, JSTimeoutException

    if isinstance(exc, JSTimeoutException):
        message = "timed out"
    elif out_of_memory or isinstance(exc, JSOOMException):
        message = f"Out of memory: the limit is {memory_bytes // (1024 * 1024)} MB."
    else:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return {"code": JS_FAILED, "error": message[:MESSAGE_CHARS]}


def _remaining(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def limit_data(extra_bytes: int) -> None:
    """Cap committed memory at its current size plus ``extra_bytes`` (where Linux says what it is)."""
    # RLIMIT_AS would refuse V8's start: its sandbox reserves about a terabyte of address space.
    # RLIMIT_DATA counts private writable memory, so it catches ArrayBuffer and WebAssembly memory.
    try:
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
    except (OSError, StopIteration, ValueError):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = used + extra_bytes if hard == resource.RLIM_INFINITY else min(hard, used + extra_bytes)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def read_frame(fd: int) -> Any:
    """The next request, or None when the parent closed the pipe."""
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(fd, HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def write_frame(fd: int, answer: dict[str, Any]) -> None:
    body = json.dumps(answer).encode()
    data = memoryview(HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


if __name__ == "__main__":
    main()
