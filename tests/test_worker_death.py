"""A killed experiment or `bench scenarios` call takes its worker processes with it (`harness.experiment.
die_with_parent`, in every pool worker's initializer): before, its spawned workers trained on, orphaned, and wrote
into run folders that the re-run then refused as half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PARENT = textwrap.dedent("""
    import concurrent.futures as cf, multiprocessing as mp, os, sys, time
    from harness.experiment import die_with_parent

    def work(path):
        open(path, "w").write(str(os.getpid()))
        time.sleep(60)

    if __name__ == "__main__":
        init = die_with_parent if sys.argv[2] == "yes" else None
        pool = cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=init)
        pool.submit(work, sys.argv[1])
        time.sleep(60)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (dead, not yet reaped) counts as gone
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("init", ["yes", "no"])
def test_a_killed_parent_takes_its_pool_workers_with_it(tmp_path, init):
    """SIGKILL the parent (no cleanup runs): with the initializer its worker is gone within seconds; without it (the
    control, so the test can fail) the worker outlives it. Would catch the initializer not wired or not working."""
    script, pidfile = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(pidfile), init], cwd=os.getcwd())
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        for _ in range(100):
            if not _alive(worker):
                break
            time.sleep(0.05)
        assert _alive(worker) == (init == "no")
    finally:
        if pidfile.exists() and pidfile.read_text() and _alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
