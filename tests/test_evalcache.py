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
    # another sandbox (bubblewrap or a plain process) scores programs otherwise: another key
    monkeypatch.setenv("EVOTRAINER_CODE_ISOLATION", "process")
    assert evalcache.key_of(a, **READING) not in keys
    monkeypatch.delenv("EVOTRAINER_CODE_ISOLATION")
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


def test_the_keys_name_the_code_as_this_process_imported_it_not_as_edited_since(tmp_path, monkeypatch):
    """A process runs the code it imported: a source file edited while it runs must not move its keys to the edited
    code's (an outside review: a bench worker started before an edit filed old-code warm starts and readings under
    the new code's key). Would catch the digest read from disk at each call again; the scoring code (the sandbox, the
    evaluation) is in the reading's key."""
    from harness.sources import READING_CODE, source_digest

    (tmp_path / "edited_later.py").write_text("a = 1\n")
    first = source_digest(("edited_later.py",), tmp_path)
    (tmp_path / "edited_later.py").write_text("a = 2\n")
    assert source_digest(("edited_later.py",), tmp_path) == first
    assert set(READING_CODE) >= {"sandbox", "harness/evaluation.py"}
