"""The background instance worker: same instances as in-process generation, errors reach the caller, and the child
never outlives its parent (closed, or SIGKILLed).

    .venv/bin/pytest tests/test_worker.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from harness.tasks import generate_many, get_task
from harness.tasks.worker import InstanceWorker, WorkerError

TASK = get_task("mapf")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_worker_matches_in_process_generation_and_reports_errors():
    cj = TASK.default_config().model_dump_json()
    w = InstanceWorker()
    try:
        a, bad, b = w.submit("mapf", cj, [4, 5, 6]), w.submit("mapf", "{not json", [1]), w.submit("mapf", cj, [7])
        assert a.result(timeout=60) == generate_many("mapf", cj, [4, 5, 6])
        with pytest.raises(WorkerError, match="ValidationError"):
            bad.result(timeout=60)
        assert [i.seed for i in b.result(timeout=60)[0]] == [7]  # answers stay in order after an error
    finally:
        w.close(timeout=30)  # idle: it exits at once; the generous timeout only keeps a loaded machine from killing it
    assert w._proc.returncode == 0
    with pytest.raises(WorkerError, match="not running"):
        w.submit("mapf", cj, [1]).result(timeout=5)


def test_worker_exits_when_its_parent_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = ("import sys, time\nfrom harness.tasks.worker import InstanceWorker\nw = InstanceWorker()\n"
            f"open({str(pid_file)!r}, 'w').write(str(w._proc.pid))\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the worker outlived its SIGKILLed parent"


def test_a_ctrl_c_leaves_the_worker_to_its_run():
    """Ctrl-C reaches the terminal's whole process group: the worker died of it with a KeyboardInterrupt traceback
    printed over the run's own message. Now it ignores SIGINT and goes on until the run closes its stdin."""
    cj = TASK.default_config().model_dump_json()
    w = InstanceWorker()
    try:
        assert w.submit("mapf", cj, [1]).result(timeout=60)  # started and serving (SIGINT ignored from its start)
        os.kill(w._proc.pid, signal.SIGINT)
        time.sleep(0.5)
        assert w._proc.poll() is None, "the worker died of SIGINT"
        assert [i.seed for i in w.submit("mapf", cj, [3]).result(timeout=60)[0]] == [3]
    finally:
        w.close(timeout=30)
    assert w._proc.returncode == 0
