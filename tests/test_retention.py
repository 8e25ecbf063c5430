"""Checkpoint retention (`harness.retention`): the pure "which may go" function on a three-stage run's checkpoints, and
the config refusing a setting that would delete what a resume needs. The loop applying it runs in
tests/test_chat_checkpoint.py (a one-stage run ends with the warm start, the incumbent and the promoted checkpoint).

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_retention.py
"""

from __future__ import annotations

import os

import pytest

from harness.config import ConfigError, parse_config
from harness.retention import deletable, disk_usage

# stage 1 promoted c1; stage 2 rejected c2 and carried its control arm; stage 3 is still running (no decision yet)
NAMES = ["warmstart", "warmstart-progress", "s1-train", "s1-control", "s1-c1", "s2-train", "s2-control", "s2-c2",
         "s3-train", "s3-control", "s3-c3", "notes"]
RUN = {"decided": {1, 2}, "incumbent": "s2-control", "promoted": ["s1-c1"], "setup_done": True}


def test_losing_and_superseded_checkpoints_go_what_a_resume_or_review_needs_stays():
    """Default policy: the losing arm, the control arm and the training checkpoint of decided stages go; the warm
    start, the incumbent (a resume starts the next stage from it), the promoted one, every checkpoint of the stage in
    progress and unknown folders stay. Catches deleting the incumbent or an undecided stage's arms."""
    assert deletable(NAMES, keep_promoted="all", delete_superseded=True, **RUN) == \
        ["s1-control", "s1-train", "s2-c2", "s2-train", "warmstart-progress"]


def test_an_incumbent_replaced_later_goes_unless_it_was_promoted():
    """Stage 3 decided too (c3 promoted): stage 2's carried control arm is no longer the incumbent and was never
    promoted, so it goes; stage 1's promoted c1 stays with keep_promoted all, goes with keep_promoted 1."""
    run = {**RUN, "decided": {1, 2, 3}, "incumbent": "s3-c3", "promoted": ["s1-c1", "s3-c3"]}
    keep_all = deletable(NAMES, keep_promoted="all", delete_superseded=True, **run)
    assert "s2-control" in keep_all and "s1-c1" not in keep_all and "s3-c3" not in keep_all
    assert {"s3-train", "s3-control"} <= set(keep_all)
    last1 = deletable(NAMES, keep_promoted=1, delete_superseded=True, **run)
    assert set(last1) - set(keep_all) == {"s1-c1"}
    # keep_promoted never reaches past the incumbent or the warm start
    assert "s3-c3" not in last1 and "warmstart" not in last1


def test_keeping_superseded_checkpoints_and_an_unfinished_setup():
    """delete_superseded false keeps every stage checkpoint (older promoted ones still obey keep_promoted); the SFT's
    resumable checkpoints stay until setup is recorded (a kill during the warm start resumes from them)."""
    run = {**RUN, "decided": {1, 2, 3}, "incumbent": "s3-c3", "promoted": ["s1-c1", "s3-c3"]}
    assert deletable(NAMES, keep_promoted="all", delete_superseded=False, **run) == ["warmstart-progress"]
    assert deletable(NAMES, keep_promoted=1, delete_superseded=False, **run) == ["s1-c1", "warmstart-progress"]
    assert deletable(NAMES, keep_promoted="all", delete_superseded=False, **{**run, "setup_done": False}) == []


def test_a_retention_that_would_delete_the_incumbent_is_refused_at_config_load():
    """keep_promoted: 0 would delete the newest promoted checkpoint, the one the next stage (and a resume) starts
    from: refused in one line naming the field and the fix, before anything runs."""
    with pytest.raises(ConfigError) as err:
        parse_config({"retention": {"keep_promoted": 0}}, "x.yaml")
    problem = str(err.value).splitlines()[1].strip()
    assert problem.startswith("retention.keep_promoted: 0 would delete the newest promoted checkpoint")
    assert "resume" in problem and "set 1 or more, or 'all'" in problem
    with pytest.raises(ValueError, match="at least 1"):
        deletable(NAMES, keep_promoted=0, delete_superseded=True, **RUN)
    assert parse_config({"retention": {"keep_promoted": 2}}, "x.yaml").retention.keep_promoted == 2
    assert parse_config({}, "x.yaml").retention.keep_promoted == "all"


def test_disk_usage_counts_checkpoints(tmp_path):
    for name, size in (("warmstart", 1000), ("s1-c1", 500)):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "model.safetensors").write_bytes(b"x" * size)
    (tmp_path / "run.db").write_bytes(b"y" * 100)
    assert disk_usage(tmp_path) == {"bytes": 1600, "checkpoints": 2, "checkpoint_bytes": 1500}


def _checkpoint(d, mb: float):
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * int(mb * (1 << 20)))
    return d


def test_the_warm_start_cache_drops_its_least_recently_used_entries_past_its_bound(tmp_path, monkeypatch):
    """Every edit of the code a warm start depends on makes a new key; before, old entries stayed for good. Now,
    when an entry is stored past `EVOTRAINER_WARMSTART_CACHE_MB`, the least recently used go (an entry set aside as
    not loading first), never the one stored nor one used within the hour, and a lookup counts as a use. Would catch:
    no pruning, pruning by when an entry was made rather than last used, the new or a live entry removed, a typo in
    the bound crashing the run instead of a warning."""
    import os
    import time

    from harness import warmstart

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    root = warmstart.cache_root()
    day = 86400
    for name, age in (("old", 5 * day), ("older", 9 * day), ("oldest", 20 * day), ("live", 60)):
        warmstart.store(name, _checkpoint(tmp_path / name, 1.0), {})
        os.utime(root / name / "DONE", (time.time() - age,) * 2)
    bad = _checkpoint(root / f"gone.bad-{os.getpid()}", 0.1)  # set aside long ago: garbage first
    os.utime(bad, (time.time() - day,) * 2)
    assert sorted(p.name for p in root.iterdir()) == [bad.name, "live", "old", "older", "oldest"]
    monkeypatch.setenv(warmstart.MAX_MB_ENV, "3.5")  # room for three 1 MB entries and a little
    assert warmstart.lookup("oldest") is not None  # used now: it stays
    warmstart.store("new", _checkpoint(tmp_path / "new", 1.0), {})
    kept = sorted(p.name for p in root.iterdir())
    assert kept == ["live", "new", "oldest"], kept
    # a bound that is not a number: nothing is cached, and the error names the variable (the run warns and goes on)
    monkeypatch.setenv(warmstart.MAX_MB_ENV, "4G")
    with pytest.raises(warmstart.CacheWriteError, match="EVOTRAINER_WARMSTART_CACHE_MB='4G'"):
        warmstart.store("typo", _checkpoint(tmp_path / "typo", 0.1), {})
    assert not (root / "typo").exists()


def test_two_writers_of_one_warm_start_leave_the_first_entry_where_a_loader_reads_it(tmp_path, monkeypatch):
    """Two runs that missed the cache store the same key: the second finished copying after the first stored, while
    a third run loads the first's entry. Before, the second removed the stored entry and put its copy in its place,
    so the loader's files vanished under it (it set the entry aside and retrained). Now a complete entry is never
    removed: the second copy goes. And a prune that dated an entry before a lookup touched it leaves it. Would catch:
    the stored entry replaced, or a prune going by a stale date (reproduced with processes by an outside review)."""
    import time

    from harness import warmstart

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    root = warmstart.cache_root()
    real = warmstart.shutil.copytree

    def copy_then_the_other_stores(src, dst, *a, **k):
        out = real(src, dst, *a, **k)
        if not (root / "k").exists():
            first = _checkpoint(root / "k", 0.01)
            (first / "DONE").write_text("ok\n")
            (first / "first").write_text("the entry a loader is reading\n")
        return out

    monkeypatch.setattr(warmstart.shutil, "copytree", copy_then_the_other_stores)
    assert warmstart.store("k", _checkpoint(tmp_path / "second", 0.01), {}) == root / "k"
    monkeypatch.undo()
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    assert (root / "k" / "first").is_file() and sorted(p.name for p in root.iterdir()) == ["k"]

    os.utime(root / "k" / "DONE", (time.time() - 86400,) * 2)
    sized = warmstart._size

    def looked_up_meanwhile(d):
        warmstart.lookup("k")  # a run loads it between the prune's dating and its removal
        return sized(d)

    monkeypatch.setattr(warmstart, "_size", looked_up_meanwhile)
    monkeypatch.setenv(warmstart.MAX_MB_ENV, "0")
    assert warmstart.prune() == [] and (root / "k" / "DONE").is_file()


def test_a_prune_racing_a_removal_and_an_infinite_bound_cost_the_run_nothing(tmp_path, monkeypatch):
    """A folder another process removes while a prune walks it (a second prune, `cache clear`, a set-aside) raised
    FileNotFoundError out of `store`, and the run's warm start failed; `EVOTRAINER_WARMSTART_CACHE_MB=inf` raised
    OverflowError past the warning path; an entry a writer left without DONE, and a set-aside one, stayed while the
    cache was under its bound (an outside review of this session's change). Would catch: the walk unguarded, an
    infinite bound taken, garbage kept."""
    import time
    from pathlib import Path

    from harness import warmstart

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    root = warmstart.cache_root()
    warmstart.store("old", _checkpoint(tmp_path / "old", 0.01), {})
    os.utime(root / "old" / "DONE", (time.time() - 86400,) * 2)
    half = _checkpoint(root / "half", 0.01)  # no DONE: a writer of old code that died, nothing loads it
    os.utime(half, (time.time() - 86400,) * 2)
    real = Path.rglob

    def vanishing(self, pattern):
        if self.name == "old":
            yield from real(self, pattern)
            raise FileNotFoundError(2, "No such file or directory", str(self))  # removed mid-walk
        yield from real(self, pattern)

    monkeypatch.setattr(Path, "rglob", vanishing)
    monkeypatch.setenv(warmstart.MAX_MB_ENV, "0")
    assert warmstart.store("new", _checkpoint(tmp_path / "new", 0.01), {}) == root / "new"
    monkeypatch.undo()
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    assert not (root / "half").exists() and (root / "new" / "DONE").is_file()
    monkeypatch.setenv(warmstart.MAX_MB_ENV, "inf")
    with pytest.raises(warmstart.CacheWriteError, match="EVOTRAINER_WARMSTART_CACHE_MB='inf': a finite number"):
        warmstart.store("unbounded", _checkpoint(tmp_path / "u", 0.01), {})


def test_keeping_every_promotion_of_a_big_checkpoint_is_said_at_start_with_the_bound(tmp_path):
    """`keep_promoted: all` (the default) keeps one checkpoint per promotion for good: with a user's checkpoint of a
    GiB or more the run says so once at start, with its size and the setting that bounds it; not for a small one, nor
    once the bound is set (an outside review: an overnight run of a 4B model keeps ~16 GB a promotion)."""
    from harness.graph import retention_warning

    ck = tmp_path / "big"
    ck.mkdir()
    with open(ck / "model.safetensors", "wb") as f:
        f.truncate(3 << 30)  # sparse: its size without the disk
    cfg = parse_config({"task": "math", "policy": {"checkpoint": str(ck)}}, "t")
    warn = retention_warning(cfg)
    assert warn is not None and "about 3.0 GiB" in warn and "retention.keep_promoted: 2" in warn, warn
    assert retention_warning(parse_config({"task": "math", "policy": {"checkpoint": str(ck)},
                                           "retention": {"keep_promoted": 2}}, "t")) is None
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").write_bytes(b"x" * 1000)
    assert retention_warning(cfg) is None
