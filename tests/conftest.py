"""Shared test setup: nothing a test does may touch the real ~/.evotrainer (the skill library lives there)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep: 2 shared cores
# runs leave torch's threads as the test set them (harness/threads.py): no per-host measurement in the suite's
# arithmetic; tests/test_threads.py unsets it to test `auto`
os.environ.setdefault("EVOTRAINER_THREADS", "default")
# pytest-xdist runs workers side by side: each worker's share of the cores (`policies.cores`), so `recipe.pipeline: auto`
# does not start a second loop in every worker on a machine they already fill
if (_workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT")) and "EVOTRAINER_CORES" not in os.environ:
    from policies import machine_cores

    os.environ["EVOTRAINER_CORES"] = str(max(1, machine_cores() // max(1, int(_workers))))


@pytest.fixture(autouse=True, scope="session")
def _isolated_home():
    old = os.environ.get("EVOTRAINER_HOME")
    with tempfile.TemporaryDirectory(prefix="evotrainer-test-home-") as d:
        os.environ["EVOTRAINER_HOME"] = d
        yield
    if old is None:
        os.environ.pop("EVOTRAINER_HOME", None)
    else:
        os.environ["EVOTRAINER_HOME"] = old


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test's in-process training (modules opt in with `pytestmark`): the tests' tiny models
    and short sequences run 1.5x faster on one thread than on two on the 2-core CI machine (rung-2 test 82 s vs 126 s,
    experiment test 76 s vs 121 s), where two threads mostly contend. Not for tests that compare in-process arithmetic
    with workers that use two threads (tests/test_scale.py)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def wait_for_row(run_dir: Path, sql: str, params: list, proc: subprocess.Popen, what: str,
                 timeout: float = 300) -> None:
    """Poll a running run's run.db until `sql` (a COUNT query) is non-zero; fail with the run's stderr if the process
    dies first, or naming `what` at the timeout. For tests that kill a run at a chosen point."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        if (run_dir / "run.db").exists():
            try:
                con = sqlite3.connect(run_dir / "run.db", timeout=5)
                n = con.execute(sql, params).fetchone()[0]
                con.close()
                if n:
                    return
            except sqlite3.OperationalError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"{what} never happened")
