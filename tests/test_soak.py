"""The soak benchmark's instruments (`harness/benchmarks/soak.py`), on real processes: an orphan that outlived its
parent is still found by the soak's tag (what `leaked_processes` reports after the run exits), a sample reads a
real process tree, and growth per stage is the least-squares slope after the settle stages.

What these could catch: a leak check that only looks at the run's live children (an orphaned Ray worker or sandbox
job is re-parented to init and would be missed), a sampler that counts the run process as one of its descendants,
a slope taken over the warm-up stages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

from harness.benchmarks.soak import TAG_VAR, growth, sample, tagged


def test_an_orphan_that_outlived_its_parent_is_found_by_the_tag(tmp_path):
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_VAR: tag}
    # the parent starts a background sleep and exits at once: the sleep is re-parented (an orphan)
    subprocess.run(["bash", "-c", "sleep 60 >/dev/null 2>&1 & echo $! > pid"], cwd=tmp_path, env=env, check=True)
    pid = int((tmp_path / "pid").read_text())
    try:
        # the orphan may still be inside exec (its /proc environ reads empty there: a clean-clone CI run caught it)
        deadline = time.monotonic() + 5
        while not _cmdline(pid).startswith(b"sleep") and time.monotonic() < deadline:
            time.sleep(0.01)
        found = tagged(tag)
        assert [x["pid"] for x in found] == [pid] and "sleep 60" in found[0]["cmd"]
        assert tagged(uuid.uuid4().hex) == []  # another soak's tag finds nothing
    finally:
        os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_a_sample_reads_the_process_tree_and_the_run_folder(tmp_path):
    p = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        time.sleep(0.3)
        (tmp_path / "checkpoints" / "s1-train").mkdir(parents=True)
        (tmp_path / "checkpoints" / "s1-train" / "model.safetensors").write_bytes(b"x" * 2**20)
        row = sample(p.pid, tmp_path, "r", time.time())
        assert row["procs"] == 2 and row["checkpoints"] == 1 and row["fds"] > 0 and row["rss_mb"] > 0
        assert 0.99 < row["run_dir_mb"] < 1.01 and row["stages"] == 0 and row["graph_db_mb"] == 0.0
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(p.pid)], check=False)
        p.kill()


def test_growth_is_the_slope_after_the_settle_stages():
    rows = [{"t_s": i, "stages": s, "rss_mb": 500 + (100 if s < 2 else 2 * s), "main_rss_mb": 300, "procs": 3,
             "fds": 40, "run_dir_mb": 10 + s, "run_db_mb": 1 + 0.1 * s, "graph_db_mb": 0.2, "checkpoints": 4}
            for i, s in enumerate([0, 1, 1, 2, 3, 4, 5, 6])]
    g = growth(rows, settle=2)
    assert g["rss_mb"]["per_stage"] == 2.0 and g["checkpoints"]["per_stage"] == 0.0 == g["graph_db_mb"]["per_stage"]
    assert g["run_dir_mb"]["per_stage"] == 1.0 and g["rss_mb"]["max"] == 600  # the warm-up peak
    assert growth(rows[:3], settle=2)["rss_mb"]["per_stage"] is None  # too few stages after settling
    down = [{**rows[-1], "t_s": 9, "rss_mb": 100, "procs": 0, "fds": 10}]  # the run's wind-down: Ray gone
    g = growth(rows + down, settle=2)
    assert g["rss_mb"]["per_stage"] == 2.0 and g["fds"]["per_stage"] == 0.0 and g["rss_mb"]["last"] == 100
