"""The benchmarks' process harness (bench/_common.py) stops each child with one SIGTERM: a runner
takes a second one as the order to exit at once with status 1, which the scripts would then print
as the runner's exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from _common import Processes

from tests.waiting import wait_for

# Counts the SIGTERMs it gets until a second has passed since the first, then exits with the count.
CHILD = """
import signal, sys, time
seen = []
signal.signal(signal.SIGTERM, lambda *_: seen.append(time.monotonic()))
print("ready", flush=True)
while not seen or time.monotonic() - seen[0] < 1.0:
    time.sleep(0.01)
sys.exit(len(seen))
"""


@pytest.mark.parametrize("stop", ["stop_all", "terminate"])
def test_each_child_is_sent_one_sigterm_and_its_own_exit_code_is_reported(stop: str) -> None:
    with Processes(grace=20) as procs:
        children = [procs.start(f"child-{i}", [sys.executable, "-c", CHILD], {}) for i in range(2)]
        for child in children:
            wait_for(lambda child=child: "ready" in child.log_tail(), timeout=20, message=child.name)
        if stop == "stop_all":
            codes = procs.stop_all()
        else:
            codes = {child.name: procs.terminate(child) for child in children}
    assert codes == {"child-0": 1, "child-1": 1}
