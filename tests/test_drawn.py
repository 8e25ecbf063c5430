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


def _failing_on(monkeypatch, task, bad) -> list[int]:
    """The family's generator, made to fail on the seeds `bad(seed)` picks as an unsatisfiable config does (a
    ValueError naming the knob); the seeds it was called with, in order."""
    called: list[int] = []
    real = type(task).generate

    def generate(self, c, s):
        called.append(s)
        if bad(s):
            raise ValueError(f"could not draw seed {s}; change env.knob")
        return real(self, c, s)

    monkeypatch.setattr(type(task), "generate", generate)
    return called


def test_a_seed_the_generator_cannot_draw_is_drawn_from_a_replacement_of_its_split(home, monkeypatch):
    """A config that draws most seeds but not all (a small level with many obstacles fails some seeds after every
    layout it tries): each failing seed is drawn from a replacement seed of its own split, stamped with the seed asked
    for and held in that split by content, and the same replacements come back on a second draw (a resumed stage).
    Before, the first failing seed raised: a stage whose draw held one stopped the run, and again at every resume.
    Would catch a replacement from another split (held-out hygiene), a seed dropped or reordered, or a replacement
    that differs between draws."""
    from harness.seeds import content_split, replacement, split_of

    task = get_task("math")
    cfg = task.default_config()
    want = seeds("backtest", 30)
    bad = set(want[3:30:7])  # 4 of 30
    called = _failing_on(monkeypatch, task, lambda s: s in bad)
    insts, why = drawn.draw_replacing(task, cfg, want)
    assert [i.seed for i in insts] == want and set(why) == bad and "change env.knob" in why[min(bad)]
    for s in bad:
        assert split_of(replacement(s, 1)) == split_of(s) == "backtest"
        body = task.generate(cfg, replacement(s, 1))
        assert insts[want.index(s)] == body.model_copy(update={"seed": s})
        assert content_split(task.prompt(body, "plain")) == "backtest"
    called.clear()
    again, why2 = drawn.draw_replacing(task, cfg, want)
    assert again == insts and why2 == why
    assert sorted(called) == sorted(bad | {replacement(s, 1) for s in bad})  # the good ones read from the cache
    assert drawn.draw(task, cfg, want) == insts  # every caller of `draw` gets the same


def test_a_config_the_generator_cannot_draw_on_most_seeds_stops_after_a_bounded_number_of_tries(home, monkeypatch):
    """A config that fails on every seed raises DrawError naming the generator's own message after GIVE_UP_AFTER
    tries, not REPLACE_TRIES per seed (a failing draw can cost seconds of layouts each); one that fails a seed and
    all of its replacements raises too. Would catch a replacement loop without a bound, or a give-up that hides the
    generator's message."""
    task = get_task("math")
    cfg = task.default_config()
    bad = [lambda s: True]
    called = _failing_on(monkeypatch, task, lambda s: bad[0](s))
    with pytest.raises(drawn.DrawError, match=r"most seeds .*16 of 16 draws.*change env\.knob"):
        drawn.draw(task, cfg, seeds("train", 40))
    assert len(called) == drawn.GIVE_UP_AFTER
    called.clear()
    with pytest.raises(drawn.DrawError, match="most seeds"):
        drawn.draw(task, cfg, seeds("train", 1))  # one seed: its replacements count toward the bound
    assert len(called) == drawn.GIVE_UP_AFTER
    bad[0] = lambda s: s % 4 == 0  # train seed 0 and every replacement of it (the probe seeds draw)
    with pytest.raises(drawn.DrawError, match=r"no replacement of seed 0 in 32 draws"):
        drawn.draw(task, cfg, seeds("train", 1) + seeds("probe", 200))


def test_a_run_draws_past_a_seed_its_generator_cannot_draw_and_says_so_once(home, tmp_path, monkeypatch):
    """The stage's draws (`Run.instances`: training, probe, arms, backtest) go on past a seed the generator cannot
    draw, and the run records one keyed warning naming the generator's message and the seeds; a config it cannot draw
    at all stops with that message. Before, an env change that drew on the vet's seeds but failed one of a later
    stage's stopped the run at that stage and at every resume. Would catch a loop path that still draws with the
    raising generator, or a replacement the run does not record."""
    from harness.config import parse_config
    from harness.lifecycle import open_run

    task = get_task("math")
    bad = [lambda s: s in failing]
    _failing_on(monkeypatch, task, lambda s: bad[0](s))
    run = open_run(tmp_path / "r", parse_config({"task": "math", "name": "r", "policy": {"preset": "tiny"},
                                                 "warm_start": {"sft_examples": 0}, "stage": {"prefetch": False}}, "t"))
    try:
        want = run.draw_seeds("train", 40, key="s1/train")
        failing = set(want[5:7])
        cfg = task.default_config()
        insts = run.instances(cfg, want)
        assert [i.seed for i in insts] == want
        run.instances(cfg, want[:10])  # memoised: said once
        warns = [e for e in run.store.events(run.id) if e["kind"] == "warning" and e["node"] == "instances"]
        assert len(warns) == 1 and "could not draw 2 seed(s)" in warns[0]["message"], warns
        assert "change env.knob" in warns[0]["message"]
        bad[0] = lambda s: True
        with pytest.raises(drawn.DrawError, match="most seeds"):
            run.instances(task.default_config().model_copy(update={}), run.draw_seeds("train", 8, key="s2/train"))
    finally:
        run.close()
        run.store.close()


def test_the_prefetch_worker_draws_the_replacements_and_the_run_records_them(home, tmp_path, monkeypatch):
    """A real borderline config (a 3x3 lake, 3 agents, half of it holes, half the draws needing a wait: the
    generator fails about 45% of seeds, train seed 0 among them) drawn by the run's background worker: the run takes
    the worker's instances, replacement included, without drawing any itself, and records the replaced seed. Would
    catch a worker answer the run cannot read (it would fall back, silently, to drawing everything again in the run
    process), or a replacement the worker makes and the run does not record."""
    from harness.config import parse_config
    from harness.lifecycle import open_run

    monkeypatch.setenv(drawn.SWITCH, "0")  # the child draws afresh (not from this process's cache)
    task = get_task("mapf")
    cfg = task.spec.config_model.model_validate({"sizes": [{"size": 3, "agents": 3, "hole_ratio": 0.5,
                                                            "wait_ratio": 0.5}]})
    run = open_run(tmp_path / "r", parse_config({"task": "mapf", "name": "r", "policy": {"preset": "tiny"},
                                                 "warm_start": {"sft_examples": 0}}, "t"))
    try:
        want = [0, 4]  # train seed 0 fails here; 4 draws
        run.prefetch(cfg, want)

        def not_here(self, c, s):
            raise AssertionError(f"seed {s} drawn in the run process")

        monkeypatch.setattr(type(task), "generate", not_here)
        insts = run.instances(cfg, want)
        assert [i.seed for i in insts] == want
        warns = [e for e in run.store.events(run.id) if e["node"] == "instances"]
        assert len(warns) == 1 and "could not draw 1 seed(s) of a draw of 2" in warns[0]["message"], warns
        assert "Seed 0: could not draw a size-3 instance" in warns[0]["message"]
    finally:
        run.close()
        run.store.close()
