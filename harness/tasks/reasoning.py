"""Reasoning-gym: any of reasoning-gym's procedural datasets as a task family (task name `reasoning`).

reasoning-gym (`pip install 'evotrainer[math]'`, installed by `make venv`) generates its ~100 datasets offline
(`leg_counting`, `basic_arithmetic`, `countdown`, `sudoku`, `gsm_symbolic`, ...). This family mixes any of them: the
generator config is a list of datasets, each with its share of training (`data_ratio`, the knob, path
`env.datasets.<name>.data_ratio`) and the dataset's own parameters (`params`, passed to `reasoning_gym.create_dataset`
unchanged; they are the dataset's difficulty settings, not knobs the engineer moves). It is meant for real models
(a Hugging Face checkpoint or an endpoint); the tiny char presets can run it but score near zero.

Scoring. The final answer is the text after the last `Answer:` (any case), else the whole completion, stripped. It is
right when it equals the dataset's answer exactly (whitespace collapsed), or when the dataset's own verifier gives it
full marks (1.0: datasets whose puzzles have several right answers, such as `countdown`, verify instead of comparing).
Partial marks from reasoning-gym's scorer (its default pays for an answer that merely CONTAINS the right one) are never
used: the reward is binary. Failures: `no_answer`, `wrong`. Slices: `dataset`, `answer_len` (short <= 8 characters,
long otherwise).

Verifiers run in the sandbox runner, never here. The answer is policy-written text, and many datasets' own verifiers
execute it (`eval`, `sympy.parse_expr`: string_insertion, countdown, polynomial_multiplication, ...), so it is
untrusted code wherever a verifier may run it (architecture invariant 6). The rule, which needs no list of bad
datasets: the host only compares strings (the exact match above); a dataset whose class keeps reasoning-gym's base
`score_answer` (read: `==` and `in` on strings, full marks only for an exact match, so it adds nothing to ours) is
never verified further; every dataset with its own `score_answer` is verified in `sandbox.runner` by `score_many`:
the non-matching answers of a batch in chunks, one job per chunk (one reasoning-gym import), each answer in a fresh
forked child of the job, which made itself non-dumpable (its own time limit; stdio to /dev/null, every other
descriptor closed), so an answer cannot write on the host, patch the verifier for the answers after it, or forge
another answer's verdict. A chunk whose job fails (an answer killed its parent) is re-run one answer per job; a job
that cannot set itself up (reasoning-gym not importable there, bad params) is one clear error, never "all wrong".
Isolation follows the code family's switch (EVOTRAINER_CODE_ISOLATION; bubblewrap by default, required).
This is NOT a proof of right answers: an answer that a dataset's verifier executes as code can still make ITS OWN
verdict say right (it runs in the process that reports it); it cannot reach the host or another answer's verdict. It
can also cost time: its chunk re-run one answer per job, or its own time limit (PER_ANSWER_S) spent.

    from harness.tasks import get_task
    task = get_task("reasoning")
    inst = task.generate(task.default_config(), seed=3)
    print(task.prompt(inst, "chat"), task.score(inst, "Answer: " + inst.answer).valid)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import string
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.seeds import draw_seed, held_apart
from harness.tasks import knobs
from harness.tasks.base import Instance, Outcome, SuiteEntry, TaskSpec
from harness.tasks.drawn import draw

FAILURE_TYPES = ("no_answer", "wrong")
STYLES = ("plain", "chat")  # plain: the question, then `Answer: `; chat: the question and a format instruction
ENTRY_KEY = "name"


def _rg():
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("the reasoning task needs reasoning-gym: pip install 'evotrainer[math]' (`make venv` "
                         "installs it)") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class DatasetEntry(BaseModel):
    """One reasoning-gym dataset of the training mix (knob paths `env.datasets.<name>.<field>`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., description="a reasoning-gym dataset name (the entry's key), e.g. leg_counting")
    data_ratio: float = Field(1.0, ge=0.0, le=1.0, description="share of training instances from this dataset "
                              "(normalised over datasets)")
    params: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config (its difficulty), "
                                   "passed to reasoning_gym.create_dataset as keyword arguments")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        _rg()
        names = dataset_names()
        if v not in names:
            close = [n for n in names if v.split("_")[0] in n][:6] or names[:6]
            raise ValueError(f"unknown reasoning-gym dataset {v!r}; e.g. {', '.join(close)} "
                             f"({len(names)} in all: python -c 'import reasoning_gym.factory as f; "
                             "print(sorted(f.DATASETS))')")
        return v


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    datasets: list[DatasetEntry] = Field(..., description="the datasets of the mixture; names unique")

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[DatasetEntry]) -> list[DatasetEntry]:
        return knobs.check_mixture(v, "datasets", "name", "names", "{name: leg_counting}")


class ReasoningShaping(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    valid_reward: float = Field(1.0, ge=0.0, le=2.0, description="reward of a right answer")
    format_penalty: float = Field(0.0, ge=-1.0, le=0.0, description="reward for no answer at all")


class ReasoningInstance(Instance):
    dataset: str
    params_json: str = "{}"  # the dataset's params (to rebuild its verifier in the sandbox)
    question: str
    answer: str
    entry_json: str  # reasoning-gym's whole entry (its verifier reads the metadata)

    @property
    def has_reference(self) -> bool:
        """Whether the dataset gave a reference answer. Some have none (boxnet, graph_color, propositional_logic,
        rubiks_cube, rush_hour: many answers are right, and only the dataset's own checker says which): their
        answer was kept as the text "None", which the exact match then took as right (an outside review, seventy-
        ninth session: "Answer: None" full marks, and the demonstration taught it). Read from the entry, so an
        instance cached before is judged the same way."""
        try:
            return json.loads(self.entry_json).get("answer") is not None
        except (ValueError, AttributeError):
            return bool(self.answer)


def generate(config: ReasoningConfig, seed: int) -> ReasoningInstance:
    """The instance for (config, seed), kept in its seed's split by content (`harness.seeds.held_apart`)."""
    one = knobs.one_entry(config, "datasets", np.random.default_rng([seed, 0x46]))  # the level, picked once
    return held_apart(lambda s: _generate(one, s), prompt, seed)


def _generate(config: ReasoningConfig, seed: int) -> ReasoningInstance:
    rng = np.random.default_rng([seed, 0x46])
    ds = knobs.pick(config.datasets, rng)
    params = json.dumps(ds.params, sort_keys=True)
    for attempt in range(BLANK_TRIES):  # `ab` reduces about one program in 300 to nothing: a blank reference no
        # answer can score (an empty one is "no answer"), the expert's included; such an entry is drawn again from
        # a seed of its own (deterministic), so every caller of `generate` gets an answerable instance
        entry = _entry(ds.name, seed if attempt == 0 else draw_seed(seed, 1000 + attempt), ds.params)
        if "error" in entry:  # a bad param, or a dataset needing what is not installed: name both
            raise ValueError(f"reasoning-gym dataset {ds.name!r} with params {ds.params} failed: {entry['error']}; "
                             f"fix env.datasets.{ds.name}.params")
        if entry["answer"] is None or str(entry["answer"]).strip():
            break
    else:
        raise ValueError(f"reasoning-gym dataset {ds.name!r} drew {BLANK_TRIES} instances whose reference answer is "
                         "blank: it cannot be answered")
    return ReasoningInstance(task="reasoning", seed=seed, dataset=ds.name, params_json=params,
                             question=str(entry["question"]),
                             answer="" if entry["answer"] is None else str(entry["answer"]),
                             entry_json=json.dumps(entry, default=str))


# --- one instance for (dataset, seed, params) whatever the process --------------------------------------------------
#
# Some reasoning-gym datasets iterate over sets of strings while they build an instance (isomorphic_strings,
# knight_swap, ...), so what they make for a seed depends on the interpreter's hash seed, which differs from process
# to process unless PYTHONHASHSEED is set: an experiment's worker, a Ray arm or a resumed run would draw another
# instance for the same seed. Every instance is therefore made under PYTHONHASHSEED=0: in this process when it runs
# under it, else in one helper interpreter started with it (kept for the process's life; a line of JSON each way).

_WORKER = """
import json, os, sys
# the protocol keeps private copies of fds 0 and 1; what a dataset prints goes to stderr and what it reads is empty
# (reasoning-gym's bf prints a dot per draw, rectangle_count and others a line: on stdout they shifted every later reply)
proto_in, proto_out = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.stdout, sys.stdin = sys.stderr, open(os.devnull)
import reasoning_gym
for line in proto_in:
    rid, name, seed, params = json.loads(line)
    try:
        out = json.loads(json.dumps(reasoning_gym.create_dataset(name, size=1, seed=seed, **params)[0], default=str))
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    proto_out.write(json.dumps([rid, out]) + "\\n")
    proto_out.flush()
"""
_helper: dict[str, Any] = {"next": 0}
_helper_lock = threading.Lock()


def _entry(name: str, seed: int, params: dict[str, Any]) -> dict[str, Any]:
    """reasoning-gym's entry for (name, seed, params) as JSON types, made under PYTHONHASHSEED=0; {"error": ...} when
    the dataset refuses the params. Nothing a dataset prints reaches this process's stdout (a prefetch worker speaks
    on it) or the helper's replies, and a reply is taken only for its own request."""
    if sys.flags.hash_randomization == 0:  # this interpreter hashes as PYTHONHASHSEED=0 does
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return json.loads(json.dumps(_rg().create_dataset(name, size=1, seed=seed, **params)[0], default=str))
        except Exception as exc:  # noqa: BLE001 -- said by the caller, with the fix
            return {"error": f"{type(exc).__name__}: {exc}"}
    _rg()  # the clear error when reasoning-gym is not installed, before a helper is started for nothing
    with _helper_lock:
        for _attempt in (0, 1):  # a helper that died or answered out of turn is started once more
            proc = _helper.get("proc")
            if proc is None or proc.poll() is not None:
                proc = _helper["proc"] = subprocess.Popen(
                    [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    env={**os.environ, "PYTHONHASHSEED": "0"})
            rid = _helper["next"] = _helper["next"] + 1
            try:
                proc.stdin.write(json.dumps([rid, name, seed, params]) + "\n")
                proc.stdin.flush()
                got, out = json.loads(proc.stdout.readline())
                if got == rid:
                    return out
            except (OSError, ValueError, TypeError):  # a dead pipe, a torn or foreign line
                pass
            proc.kill()
            _helper.pop("proc", None)
    raise RuntimeError("the reasoning-gym helper interpreter (PYTHONHASHSEED=0) failed twice to draw an instance")


def prompt(inst: ReasoningInstance, style: str = "plain") -> str:
    if style == "plain":
        return inst.question.rstrip() + "\nAnswer: "
    if style == "chat":
        return inst.question.rstrip() + "\n\nThink if you need to, then end with one line: `Answer: <final answer>`."
    raise ValueError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")


def expert(inst: ReasoningInstance, style: str = "plain") -> str:
    """The reference answer as a demonstration; empty where the dataset has none (`has_reference`): no demonstration
    (`harness.policy_glue.sft_pairs` leaves such instances out)."""
    if not inst.has_reference:
        return ""
    return inst.answer if style == "plain" else f"Answer: {inst.answer}"


_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)


def final_answer(completion: str) -> str:
    """The text after the last `Answer:`, without the code or bold marks a chat model puts around it
    (`**Answer:** 104`, `Answer: **104**`, `` `104` ``)."""
    parts = _ANSWER.split(completion)
    text = parts[-1] if len(parts) > 1 else completion
    return text.strip().strip("`*").strip()


def _norm(s: str) -> str:
    return " ".join(s.split())


def has_own_verifier(dataset: str) -> bool:
    """Whether the dataset's class overrides reasoning-gym's base `score_answer` (whose only full mark is an exact
    match). An override may do anything with the answer, `eval` included: it runs in the sandbox runner only."""
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS

    return DATASETS[dataset][0].score_answer is not ProceduralDataset.score_answer


# Runs inside the sandbox (kind=function). The parent of the job imports reasoning-gym and builds the datasets from
# trusted config; only a forked child ever touches an answer. The child closes every descriptor but its verdict pipe
# (so not the job's result pipe), and the job is non-dumpable (prctl), so a child cannot open /proc/<parent>/fd or
# /proc/<parent>/mem: an answer can forge only its own verdict.
_VERIFY = r'''
import json, os, select, signal, time


def verify_many(items, per_answer_s):
    try:  # the setup, before any answer is touched: its failure is the environment's, said as such
        os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        import ctypes
        import reasoning_gym

        if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed: the answers cannot be kept apart")
        made = {}
        for name, params_json, _, _ in items:
            if (name, params_json) not in made:
                made[name, params_json] = reasoning_gym.create_dataset(name, size=1, seed=0, **json.loads(params_json))
    except Exception as e:
        return {"setup_error": f"{type(e).__name__}: {e}"[:300]}
    return [_one(made[n, p], answer, json.loads(entry), per_answer_s) for n, p, answer, entry in items]


def _one(ds, answer, entry, limit):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: from here on, the answer may run code
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, w)
            os.closerange(w + 1, 1 << 16)
            right = float(ds.score_answer(answer, entry)) >= 1.0
            os.write(w, b"1" if right else b"0")
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + limit
    try:
        while len(data) < 8 and time.monotonic() < deadline:
            if not select.select([r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            chunk = os.read(r, 8)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
    return data == b"1"
'''

CANARIES = ("nan", "x", "0")  # answers no verifier should pass (one that is the reference answer is left out)
BLANK_TRIES = 16  # draws of an entry whose reference answer is blank before the config is said to draw none
PER_ANSWER_S = 3.0  # wall seconds one answer's verification may take in its child
CHUNK = 64  # answers per sandbox job (each job pays one reasoning-gym import, ~2 s)
_CACHE: OrderedDict[str, bool] = OrderedDict()
_CACHE_MAX = 8192
_CACHE_LOCK = threading.Lock()


def _same_answer(canary: str, reference: str) -> bool:
    """Whether a canary is the reference answer, as text or as a number ("0" is "0.0" and "-0")."""
    if _norm(canary) == _norm(reference):
        return True
    try:
        return float(canary) == float(reference)
    except ValueError:
        return False


def _verify_jobs(chunks: list[list[list[str]]]):
    from sandbox.runner import Job, Limits

    site = str(Path(_rg().__file__).resolve().parent.parent)
    return [Job(kind="function", code=_VERIFY, function="verify_many", args=[c, PER_ANSWER_S], python_path=[site],
                limits=Limits(cpu_s=60, wall_s=30.0 + (PER_ANSWER_S + 0.5) * len(c), memory_mb=2048, scratch_mb=8,
                              output_bytes=65536, result_bytes=65536, processes=16))
            for c in chunks]


def _verify(items: list[list[str]]) -> list[bool]:
    """Verdicts of the datasets' own verifiers on [dataset, params_json, answer, entry_json] items, in the sandbox."""
    from harness.tasks.code import isolation, workers
    from sandbox.runner import SandboxUnavailable, run_many

    iso = isolation()

    def run(chunks: list[list[list[str]]]) -> list[list[bool] | None]:
        try:
            results = run_many(_verify_jobs(chunks), workers=workers(), require_bwrap=iso == "bwrap",
                               isolation="auto" if iso == "bwrap" else "process")
        except SandboxUnavailable as exc:
            raise SandboxUnavailable(f"reasoning-gym verifiers run the policy's answers under bubblewrap only, and it "
                                     f"is not usable here ({exc}); or set EVOTRAINER_CODE_ISOLATION=process to run "
                                     "them as plain subprocesses (much weaker isolation)") from None
        for r in results:  # only the job's own setup (no answer has run yet) returns this: not the answers' fault
            if r.status == "ok" and isinstance(r.value, dict) and "setup_error" in r.value:
                raise RuntimeError(f"reasoning-gym's verifiers cannot start in the sandbox: "
                                   f"{str(r.value['setup_error'])[:300]}; check that reasoning-gym and its "
                                   "dependencies are installed in one site-packages folder")
        return [r.value if r.status == "ok" and isinstance(r.value, list) and len(r.value) == len(c)
                and all(isinstance(v, bool) for v in r.value) else None for c, r in zip(chunks, results, strict=True)]

    chunks = [items[k:k + CHUNK] for k in range(0, len(items), CHUNK)]
    verdicts = run(chunks)
    failed = [k for k, v in enumerate(verdicts) if v is None and len(chunks[k]) > 1]
    if failed:  # a job died (an answer killed its parent, or flooded): each of its answers alone, so only it fails
        singles = [[it] for k in failed for it in chunks[k]]
        alone = iter(run(singles))
        for k in failed:
            verdicts[k] = [bool(v and v[0]) for v in (next(alone) for _ in chunks[k])]
    return [bool(v) for c, vs in zip(chunks, verdicts, strict=True) for v in (vs or [False] * len(c))]


def score_many(pairs: list[tuple[ReasoningInstance, str]], shaping: ReasoningShaping | None = None) -> list[Outcome]:
    """Score a batch: exact match on the host; the answers left over of datasets with their own verifier in the
    sandbox runner (see the module docstring), cached by dataset, entry and answer."""
    sh = shaping or ReasoningShaping()
    gots = [final_answer(str(c)) for _, c in pairs]
    right: list[bool] = [bool(g) and i.has_reference and _norm(i.answer) in (_norm(g), _norm(g.rstrip(".")))
                         for (i, _), g in zip(pairs, gots, strict=True)]  # no reference: the checker alone decides
    keys: dict[int, str] = {}
    for k, ((inst, _), got) in enumerate(zip(pairs, gots, strict=True)):
        if got and not right[k] and has_own_verifier(inst.dataset):
            keys[k] = hashlib.sha256(json.dumps([inst.dataset, inst.params_json, inst.entry_json, got]).encode()
                                     ).hexdigest()
    # a verifier that gives junk full marks on an entry is not trusted there (exact match alone decides): reasoning-
    # gym's game_of_life_halting passed any non-empty answer (`bool(answer) == bool(reference)`), complex_arithmetic
    # passed "nan" (`exp(-nan)` capped at 1.0); an outside review, eighty-second session
    canary_keys: dict[int, list[str]] = {}
    for k in keys:
        inst = pairs[k][0]
        canary_keys[k] = [hashlib.sha256(json.dumps([inst.dataset, inst.params_json, inst.entry_json, c]).encode()
                                         ).hexdigest() for c in CANARIES if not _same_answer(c, inst.answer)]
    with _CACHE_LOCK:
        known = {key: _CACHE[key] for key in [*keys.values(), *(c for cs in canary_keys.values() for c in cs)]
                 if key in _CACHE}
    todo: dict[str, list[str]] = {}
    for k, key in keys.items():
        inst = pairs[k][0]
        if key not in known:
            todo.setdefault(key, [inst.dataset, inst.params_json, gots[k], inst.entry_json])
        for c, ckey in zip([c for c in CANARIES if not _same_answer(c, inst.answer)], canary_keys[k], strict=True):
            if ckey not in known:
                todo.setdefault(ckey, [inst.dataset, inst.params_json, c, inst.entry_json])
    if todo:
        verdicts = _verify(list(todo.values()))
        with _CACHE_LOCK:
            for key, v in zip(todo, verdicts, strict=True):
                known[key] = _CACHE[key] = v
                while len(_CACHE) > _CACHE_MAX:
                    _CACHE.popitem(last=False)
    for k, key in keys.items():
        right[k] = known[key] and not any(known[c] for c in canary_keys[k])
    return [_outcome(inst, got, ok, sh) for (inst, _), got, ok in zip(pairs, gots, right, strict=True)]


def _outcome(inst: ReasoningInstance, got: str, right: bool, sh: ReasoningShaping) -> Outcome:
    metrics = {"answer_len": float(len(inst.answer))}
    if not got:
        return Outcome(failure="no_answer", reward=sh.format_penalty, detail="no answer", metrics=metrics)
    if right:
        return Outcome(valid=True, optimal=True, reward=sh.valid_reward, metrics=metrics)
    return Outcome(failure="wrong", reward=0.0, detail=f"{got[:60]!r} is not {inst.answer[:60]!r}",
                   where={"got": got[:200]}, metrics=metrics)


def score(inst: ReasoningInstance, completion: str, shaping: ReasoningShaping | None = None) -> Outcome:
    return score_many([(inst, completion)], shaping)[0]


def slices(inst: ReasoningInstance) -> dict[str, str]:
    return {"dataset": inst.dataset, "answer_len": "short" if len(inst.answer) <= 8 else "long"}


def _cfg(*names: str) -> ReasoningConfig:
    return ReasoningConfig(datasets=[DatasetEntry(name=n) for n in names])


SMALL = ("leg_counting", "basic_arithmetic", "letter_counting")


def suite(name: str) -> list[SuiteEntry]:
    """Held-out suites (test seeds). small: 32 each of leg_counting, basic_arithmetic, letter_counting (96)."""
    if name == "small":
        return [SuiteEntry(name=n, config=_cfg(n), n=32) for n in SMALL]
    raise ValueError(f"unknown suite {name!r}; choose one of small")


def default_config() -> ReasoningConfig:
    return _cfg(*SMALL)


ROUND0_ENV = """\
# Environment generator config (reasoning: any of reasoning-gym's datasets). One entry per dataset: data_ratio =
# its share of training (the knob); params = the dataset's own config, passed to reasoning_gym.create_dataset.
datasets:
  - {name: leg_counting, data_ratio: 0.34, params: {}}
  - {name: basic_arithmetic, data_ratio: 0.33, params: {}}
  - {name: letter_counting, data_ratio: 0.33, params: {}}
"""


def env_stats(config: ReasoningConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
    insts = draw(TASK, config, list(range(seed_start, seed_start + n)))  # read back where drawn before (drawn.py)
    by: dict[str, Any] = {}
    for name in sorted({i.dataset for i in insts}):
        xs = [i for i in insts if i.dataset == name]
        by[name] = {"share": round(len(xs) / len(insts), 3),
                    "mean_question_chars": round(float(np.mean([len(i.question) for i in xs])), 1),
                    "mean_answer_chars": round(float(np.mean([len(i.answer) for i in xs])), 1)}
    return {"n": len(insts), "by_dataset": by}


def near_miss(metrics: dict[str, float]) -> bool:
    """Not defined for reasoning-gym answers: never."""
    return False


SPEC = TaskSpec(
    config_model=ReasoningConfig, shaping_model=ReasoningShaping, instance_model=ReasoningInstance, styles=STYLES,
    alphabet="".join(sorted(set(string.printable) - set("\t\r\x0b\x0c"))), words=(), failure_types=FAILURE_TYPES,
    format_failures=("no_answer",),
    round0_env=ROUND0_ENV, entry_key=ENTRY_KEY, slice_keys=("dataset", "answer_len"),
    difficulty_slice="dataset",  # the datasets are the levels (unordered: the frontier is the datasets in between)
    failure_knobs={
        "no_answer": ["recipe.max_completion_length", "recipe.temperature"],
        "wrong": ["env.datasets.{dataset}.data_ratio"],
    },
    frontier_knob="env.datasets.{dataset}.data_ratio", gap_metric=None,
    near_miss=near_miss, near_miss_text="a near miss (not defined for reasoning-gym answers)",
    suboptimal_text="right, but not optimal (never for reasoning-gym)",
)


class ReasoningTask:
    """The `Task` protocol over reasoning-gym's datasets (harness/tasks/base.py), with the capabilities BatchScorer,
    EnvStats, VetConfigs and Mixture."""

    name = "reasoning"
    spec = SPEC

    def check_environment(self) -> None:  # its verifiers run in the code family's sandbox, under its switches
        from harness.tasks.code import check_environment

        check_environment()

    def default_config(self) -> ReasoningConfig:
        return default_config()

    def generate(self, config: ReasoningConfig, seed: int) -> ReasoningInstance:
        return generate(config, seed)

    def prompt(self, instance: ReasoningInstance, style: str = "plain") -> str:
        return prompt(instance, style)

    def expert(self, instance: ReasoningInstance, style: str = "plain") -> str:
        return expert(instance, style)

    def score(self, instance: ReasoningInstance, completion: str, shaping: ReasoningShaping | None = None) -> Outcome:
        return score(instance, completion, shaping)

    def score_many(self, pairs: list[tuple[ReasoningInstance, str]],
                   shaping: ReasoningShaping | None = None) -> list[Outcome]:
        return score_many(pairs, shaping)

    def slices(self, instance: ReasoningInstance) -> dict[str, str]:
        return slices(instance)

    def suite(self, name: str) -> list[SuiteEntry]:
        return suite(name)

    def env_stats(self, config: ReasoningConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
        return env_stats(config, n, seed_start)

    def mixture(self, config: ReasoningConfig) -> dict[str, float]:
        return knobs.mixture_of(config, "datasets", ENTRY_KEY)

    def with_mixture(self, config: ReasoningConfig, weights: dict[str, float]) -> ReasoningConfig:
        return knobs.with_mixture(config, "datasets", ENTRY_KEY, weights)

    def vet_configs(self, config: ReasoningConfig, knob: str) -> list[tuple[str, ReasoningConfig]]:
        return knobs.entry_configs(config, "datasets", ENTRY_KEY, knob)


TASK = ReasoningTask()
