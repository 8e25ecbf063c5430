"""The run process's torch threads (harness/threads.py, `scale.threads`): `auto` measures the run's model shape at
1, 2, ... threads on this host once, keeps the fastest and caches it; a number or `default` is applied as given; the
environment variable overrides the config; bad values name the field.

What these could catch: an `auto` that does not measure (no timings in the cache) or measures again on every start
(the second call must not time anything), a cache entry that is not keyed by the model shape (another preset must
measure again), a number that is not applied, a typo accepted silently.
"""

from __future__ import annotations

import json

import pytest
import torch

from harness.benchmarks.run import TINY
from harness.config import ConfigError, parse_config
from harness.tasks import get_task

MAPF = get_task("mapf")


@pytest.fixture
def restore_threads(monkeypatch, tmp_path):
    monkeypatch.delenv("EVOTRAINER_THREADS", raising=False)
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    was = torch.get_num_threads()
    yield
    torch.set_num_threads(was)


def test_auto_measures_once_per_host_and_model_shape_and_keeps_the_fastest(restore_threads, monkeypatch):
    from harness import threads

    cfg = parse_config(TINY, "test")
    n, why = threads.apply_threads(cfg, MAPF)
    cache = json.loads(threads.cache_path().read_text())
    [(key, entry)] = cache.items()
    secs = {int(k): v for k, v in entry["seconds"].items()}
    assert sorted(secs) == threads.options(threads.cores()) and all(v > 0 for v in secs.values())
    assert n == entry["threads"] == min(secs, key=secs.get) == torch.get_num_threads()
    assert "measured now" in why and "tiny" not in key and "h128" in key  # keyed by the shape, not the preset name

    def no_timing(*a, **k):
        raise AssertionError("measured again although the cache holds this host and shape")

    monkeypatch.setattr(threads, "time_threads_for", no_timing)
    torch.set_num_threads(max(1, 3 - n))
    assert threads.apply_threads(cfg, MAPF)[0] == n == torch.get_num_threads()
    small = parse_config({**TINY, "policy": {"preset": "small"}}, "test")
    with pytest.raises(AssertionError, match="measured again"):  # another shape is measured
        threads.apply_threads(small, MAPF)


def test_a_number_default_and_the_environment(restore_threads, monkeypatch):
    from harness.threads import apply_threads

    one = parse_config({**TINY, "scale": {"threads": 1}}, "test")
    assert apply_threads(one, MAPF) == (1, "scale.threads") and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    keep = parse_config({**TINY, "scale": {"threads": "default"}}, "test")
    assert apply_threads(keep, MAPF)[0] == 2 == torch.get_num_threads()
    monkeypatch.setenv("EVOTRAINER_THREADS", "1")
    assert apply_threads(keep, MAPF) == (1, "EVOTRAINER_THREADS") and torch.get_num_threads() == 1
    monkeypatch.setenv("EVOTRAINER_THREADS", "lots")
    with pytest.raises(ValueError, match="EVOTRAINER_THREADS must be auto, default or a number"):
        apply_threads(keep, MAPF)


@pytest.mark.parametrize("bad", [0, "fast"])
def test_a_bad_threads_value_names_the_field(bad):
    with pytest.raises(ConfigError, match="scale.threads"):
        parse_config({**TINY, "scale": {"threads": bad}}, "test")
