"""The held-out reading cache: keyed by a checkpoint's bytes and everything that shapes a reading, never by its path."""

from __future__ import annotations

import json

from harness import evalcache
from harness.policy_glue import EvalReport


def _ckpt(d, weights=b"\x00\x01" * 64, tok_extra=None):
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(weights)
    (d / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64, **(tok_extra or {})}))
    return d


READING = {"task": "mapf", "style": "trace", "suite": "env:abc", "seeds": [1, 2, 3], "max_new_tokens": 48,
           "backend": "transformers"}


def test_the_key_follows_the_weights_and_the_reading_not_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    a = _ckpt(tmp_path / "a")
    # the same weights saved again elsewhere (transformers adds where it loaded them from): the same key
    b = _ckpt(tmp_path / "run" / "checkpoints" / "warmstart", tok_extra={"is_local": True, "local_files_only": True})
    assert evalcache.key_of(a, **READING) == evalcache.key_of(b, **READING) is not None
    # other weights, another test set, another completion budget, another engine: another key
    c = _ckpt(tmp_path / "c", weights=b"\x00\x02" * 64)
    keys = {evalcache.key_of(a, **READING), evalcache.key_of(c, **READING),
            evalcache.key_of(a, **{**READING, "seeds": [1, 2, 4]}),
            evalcache.key_of(a, **{**READING, "max_new_tokens": 12}),
            evalcache.key_of(a, **{**READING, "backend": "vllm"})}
    assert len(keys) == 5
    # a tokenizer that really changed (a chat template) is another key
    d = _ckpt(tmp_path / "d", tok_extra={"chat_template": "{{ x }}"})
    assert evalcache.key_of(d, **READING) != evalcache.key_of(a, **READING)
    # not a folder, or the cache turned off: no key (the reading is made)
    assert evalcache.key_of(tmp_path / "missing", **READING) is None
    monkeypatch.setenv("EVOTRAINER_EVAL_CACHE", "0")
    assert evalcache.key_of(a, **READING) is None


def test_a_stored_reading_comes_back_and_a_torn_one_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    key = evalcache.key_of(_ckpt(tmp_path / "a"), **READING)
    assert evalcache.lookup(key) is None
    rep = EvalReport(n=3, valid=2 / 3, optimal=1 / 3, by_slice={"size": {"3x3": {"n": 3, "valid": 2 / 3,
                                                                                 "optimal": 1 / 3}}},
                     seconds=1.5, new_tokens=90)
    path = evalcache.store(key, rep, [1.0, 0.0, 1.0], {"run": "r1", "stage": 0})
    got, per = evalcache.lookup(key)
    assert per == [1.0, 0.0, 1.0] and got.valid == rep.valid and got.by_slice["size"]["3x3"].n == 3
    path.write_text('{"report": {"n": 3')  # torn: treated as absent, never as a reading
    assert evalcache.lookup(key) is None
    evalcache.store(key, rep, [1.0, 0.0, 1.0])
    root, n = evalcache.clear()
    assert n == 1 and evalcache.lookup(key) is None and root == tmp_path / "home" / "evalcache"
    # a cache that cannot be written (here: its folder is a file) saves nothing and stops nothing
    root.rmdir() if root.is_dir() else None
    root.write_text("not a folder")
    assert evalcache.store(key, rep, [1.0, 0.0, 1.0]) is None
