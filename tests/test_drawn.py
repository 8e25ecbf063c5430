"""The drawn-instance cache (`harness.tasks.drawn`): what it hands back is exactly what the generator draws, it is kept
across processes, it misses on anything that shapes a draw, and a damaged, full or unusable cache costs only drawing."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.seeds import seeds
from harness.tasks import TASKS, drawn, get_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path))
    monkeypatch.delenv(drawn.SWITCH, raising=False)
    yield tmp_path
    drawn.clear()


def _counting(monkeypatch, task):
    made: list[int] = []
    real = type(task).generate
    monkeypatch.setattr(type(task), "generate", lambda self, c, s: made.append(s) or real(self, c, s))
    return made


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_built_in_family_reads_back_what_it_drew(home, monkeypatch, name):
    """For each built-in family: the cached list equals the generator's own, in order, with repeats; a second draw
    generates nothing. Would catch an instance model that does not survive its JSON (a tuple read back as a list, a
    float rounded), a seed stamped wrongly, or a cache keyed on the seed alone."""
    task = get_task(name)
    cfg = task.default_config()
    want = seeds("train", 20)
    direct = [task.generate(cfg, s) for s in want]
    made = _counting(monkeypatch, task)
    asked = want + want[:3]
    assert drawn.draw(task, cfg, asked) == direct + direct[:3]
    assert sorted(made) == sorted(want)  # each seed drawn once, the repeats read
    made.clear()
    assert drawn.draw(task, cfg, asked) == direct + direct[:3] and made == []


def test_a_draw_is_kept_across_processes_and_missed_on_another_config(home, monkeypatch):
    """A child process draws; this process then reads those instances without generating any (the arms of an
    experiment are processes of their own). Another generator config (one knob moved) is drawn afresh. Would catch a
    per-process memo passed off as a cache, or a key that leaves part of the config out."""
    task = get_task("mapf")
    cfg = task.default_config()
    want = seeds("backtest", 12)
    code = ("from harness.tasks import get_task; from harness.tasks.drawn import draw; t = get_task('mapf'); "
            f"draw(t, t.default_config(), {want})")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    made = _counting(monkeypatch, task)
    got = drawn.draw(task, cfg, want)
    assert made == [] and [i.seed for i in got] == want
    other = cfg.model_copy(update={"min_distance": cfg.min_distance + 1})
    drawn.draw(task, other, want)
    assert sorted(made) == sorted(want)


def test_a_row_that_does_not_parse_is_drawn_again_and_replaced(home, monkeypatch):
    """A damaged row (a torn write, another code's format under the same version) is drawn again and overwritten,
    never handed out. Would catch a cache that trusts its rows."""
    task = get_task("math")
    cfg = task.default_config()
    want = seeds("train", 5)
    good = drawn.draw(task, cfg, want)
    db = drawn.cache_root() / f"{drawn.code_version()}.db"
    with sqlite3.connect(db) as c:
        c.execute("UPDATE drawn SET body = '{not json' WHERE seed = ?", (want[2],))
    made = _counting(monkeypatch, task)
    assert drawn.draw(task, cfg, want) == good and made == [want[2]]
    made.clear()
    assert drawn.draw(task, cfg, want) == good and made == []  # replaced


def test_the_switch_a_family_of_ones_own_and_an_unusable_home_all_draw_every_time(home, monkeypatch, tmp_path):
    """Off (`EVOTRAINER_INSTANCE_CACHE=0`), a family whose code is not under harness/tasks (its version is not ours
    to take), and a home that cannot hold the cache: every draw generates, and the instances are the generator's.
    A switch word that is not one names the variable."""
    task = get_task("math")
    cfg = task.default_config()
    want = seeds("train", 4)
    made = _counting(monkeypatch, task)
    monkeypatch.setenv(drawn.SWITCH, "0")
    drawn.draw(task, cfg, want), drawn.draw(task, cfg, want)
    assert len(made) == 8 and not drawn.cache_root().exists()
    monkeypatch.setenv(drawn.SWITCH, "maybe")
    with pytest.raises(ValueError, match=drawn.SWITCH):
        drawn.draw(task, cfg, want)
    monkeypatch.delenv(drawn.SWITCH)

    class Own:  # a family of one's own: the same generator, defined outside harness/tasks
        name, spec = "math", task.spec

        def generate(self, c, s):
            return task.generate(c, s)  # counted by the patched generator

    made.clear()
    drawn.draw(Own(), cfg, want), drawn.draw(Own(), cfg, want)
    assert len(made) == 8

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the home's folder would be")
    monkeypatch.setenv("EVOTRAINER_HOME", str(blocked))
    made.clear()
    assert drawn.draw(task, cfg, want) == [task.generate(cfg, s) for s in want] and len(made) == 8


def test_the_cache_is_bounded_in_bytes_and_in_code_versions(home, monkeypatch):
    """Past `MAX_BYTES` of live pages the oldest rows go (and are drawn again when asked) while the newest stay;
    opening a code version's file keeps only the `KEEP_VERSIONS` most recently opened files, never one opened within
    `IN_USE_S` (another process may be drawing into it). Would catch a cache that grows without end over an overnight
    run or across checkouts, or one that deletes a file a side-by-side arm is writing."""
    task = get_task("math")
    cfg = task.default_config()
    monkeypatch.setattr(drawn, "MAX_BYTES", 64 << 10)
    first, last = seeds("train", 100), seeds("train", 100, start=5000)
    drawn.draw(task, cfg, first)
    for k in range(1, 8):
        drawn.draw(task, cfg, seeds("train", 100, start=1000 * k))
    drawn.draw(task, cfg, last)
    db = drawn.cache_root() / f"{drawn.code_version()}.db"
    assert db.stat().st_size < 4 * drawn.MAX_BYTES  # the file stays near its bound (freed pages are reused)
    made = _counting(monkeypatch, task)
    drawn.draw(task, cfg, last)
    assert made == []  # the newest kept
    drawn.draw(task, cfg, first)
    assert len(made) == len(first)  # the oldest dropped

    drawn.clear()
    root = drawn.cache_root()
    n_old = drawn.KEEP_VERSIONS + 2
    for i in range(n_old):
        (root / f"old{i}.db").write_bytes(b"")
        os.utime(root / f"old{i}.db", (1000 + i, 1000 + i))  # opened long ago, old0 first
    (root / "busy.db").write_bytes(b"")  # opened a minute ago by another process: kept, whatever its rank
    os.utime(root / "busy.db", (time.time() - 60,) * 2)
    drawn.draw(task, cfg, first[:1])
    left = {p.name for p in root.glob("*.db")}
    assert f"{drawn.code_version()}.db" in left and "busy.db" in left
    kept_old = sorted(n for n in left if n.startswith("old"))
    assert kept_old == [f"old{i}.db" for i in range(n_old - drawn.KEEP_VERSIONS + 2, n_old)]  # the newest others


def test_a_file_that_is_not_a_database_is_replaced_and_a_failed_open_is_tried_again(home, monkeypatch):
    """A code version's file that is not SQLite (a torn copy, a stray file) is replaced and the cache works again; a
    cache that could not be opened once (the home not there yet) is tried again at the next draw rather than turned
    off for the rest of the process. Would catch a cache disabled for good by one bad moment."""
    task = get_task("math")
    cfg = task.default_config()
    root = drawn.cache_root()
    root.mkdir(parents=True)
    (root / f"{drawn.code_version()}.db").write_bytes(b"not sqlite at all " * 100)
    want = seeds("train", 5)
    drawn.draw(task, cfg, want)
    made = _counting(monkeypatch, task)
    assert [i.seed for i in drawn.draw(task, cfg, want)] == want and made == []

    drawn.clear()
    root.rmdir()
    blocker = root.parent / "instances"
    blocker.write_text("a file where the cache's folder goes")
    drawn.draw(task, cfg, want)  # cannot be opened: drawn
    blocker.unlink()
    made.clear()
    drawn.draw(task, cfg, want)  # opened now: stored
    drawn.draw(task, cfg, want)
    assert len(made) == len(want)  # the second draw generated and stored, the third read (off for good: both drew)


def test_cache_show_and_clear_name_the_drawn_instances(home):
    """`evotrainer cache show` says how many instances are kept and how to turn the cache off; `cache clear` removes
    them."""
    task = get_task("math")
    drawn.draw(task, task.default_config(), seeds("train", 3))
    env = {**os.environ, "EVOTRAINER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    show = subprocess.run([sys.executable, "-m", "harness.cli", "cache", "show"], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True).stdout
    show = " ".join(show.split())  # the console wraps at its width
    assert "3 instance(s)" in show and drawn.SWITCH in show
    out = subprocess.run([sys.executable, "-m", "harness.cli", "cache", "clear"], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True).stdout
    out = " ".join(out.split())
    assert "removed 3 drawn instance(s)" in out and drawn.entries() == []
