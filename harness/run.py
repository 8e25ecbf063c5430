"""The run context (`Run`): everything a node of the graph needs that is not LangGraph state.

A `Run` holds the run's config, its store (run.db), the harness workspace, and the per-process caches the nodes share:
generated task instances (with a background prefetch worker), the report suite, env statistics, the backtest judge
(fixed at run start in judge.json), the Ray arm runner, and the policy cache (checkpoints the run saved, kept in memory
for the next node that reads them). Nodes use its methods; none touches its private fields.

    run = Run(run_dir=Path("runs/x"), config=cfg, store=RunStore.open(Path("runs/x/run.db")))
    model, tok = run.load("runs/x/ckpt/s1/policy"); run.save(model, tok, run.path("ckpt", "s1", "copy"))

Creating, driving, resuming and answering runs is `harness.lifecycle`; the stage's nodes are `harness.graph`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.config import RunConfig
from harness.results import NodeResult
from harness.store import RunStore
from harness.tasks import EnvStats, get_task

R = TypeVar("R", bound=NodeResult)

JUDGE_FILE = "judge.json"  # the backtest judge, fixed at run start (outside the harness repo)
MEMO_MAX_PARAMS = 100_000_000  # checkpoints of smaller models are also kept in memory (deep-copied on load)

log = logging.getLogger(__name__)

DRAW_STRIDE = 1_000_000  # indices of each split a run seed owns (a run drawing more overlaps the next seed's: harmless)


def seed_stretch(seed: int) -> int:
    """The first index of every split a run with this seed draws from (seed 0: 0, as every run did before). Every
    seed its own stretch: it was `seed % 10_000`, so seeds 0 and 10,000 drew the same instances (an outside review)."""
    return seed * DRAW_STRIDE


class RunError(ValueError):
    """A run that cannot be started or resumed; the message says why and what to do."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) while a run was driven: a KeyboardInterrupt still, carrying the run's folder so the CLI can say
    how to go on (`evotrainer resume RUN_DIR`) instead of printing a traceback. The run is recorded as interrupted."""

    def __init__(self, run_dir) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir


# --- the run context: everything a node needs that is not state --------------------------------------------------------


@dataclass
class Run:
    run_dir: Path
    config: RunConfig
    store: RunStore
    progress: Callable[[str, dict[str, Any]], None] = lambda event, data: None
    _ws: Any = None
    _instances: dict[str, dict[int, Any]] = field(default_factory=dict)  # env config JSON -> seed -> instance
    _env_stats: dict[str, dict] = field(default_factory=dict)  # env config JSON -> task.env_stats (per process)
    _seeds_synced: bool = False
    _pool: Any = None  # the prefetch worker process (harness.tasks.worker.InstanceWorker), started on first use
    _pending: dict[tuple[str, tuple[int, ...]], Any] = field(default_factory=dict)  # (config JSON, seeds) -> Future
    _models: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # checkpoint path -> in-memory copy
    _judge: Any = None
    _ray: Any = None  # harness.scale.RayArms, connected on the first arm (scale.backend: ray)

    @property
    def id(self) -> str:
        return self.run_dir.name

    @property
    def uid(self) -> str:
        """The run's identity among every run a skill library records: its id and creation time. Ids repeat across
        folders (every experiment's evolved run is `run`), so a library keyed by id alone merges different runs'
        tries (`skill_tries` is idempotent per skill, run and candidate) and cannot tell this run from another."""
        return f"{self.id}@{self.store.get_run(self.id)['created']}"

    @property
    def task(self):
        return get_task(self.config.task)

    @property
    def style(self) -> str:
        return self.config.style

    @property
    def judge(self):
        """The backtest judge (instance distribution, samples, temperature), fixed at run start in judge.json."""
        from harness.backtest import Judge

        if self._judge is None:
            self._judge = Judge.model_validate_json((self.run_dir / JUDGE_FILE).read_text())
        return self._judge

    def workspace(self):
        """The harness repo, opened (and repaired) once per process."""
        if self._ws is None:
            from sandbox.workspace import Workspace

            self._ws = Workspace(self.run_dir / "harness")
        return self._ws

    def instances(self, config, seeds: list[int]) -> list:
        """Task instances, memoised per (config, seed) within a stage: both backtest arms, and a recipe candidate's
        longer prompt prefix, reuse what is already generated (each may cost an expert solve). Instances `prefetch`ed in
        the background are collected here; anything missing is drawn in this process, read from the instance cache where an
        earlier stage, arm or run drew it before (`harness.tasks.drawn`). A seed the generator cannot draw is drawn
        from a replacement seed of its split (`drawn.draw_replacing`) and said once per run and config (a keyed
        warning event); a config the generator cannot draw on most seeds raises `drawn.DrawError`."""
        cj = config.model_dump_json()
        memo = self._instances.setdefault(cj, {})
        want = set(seeds) - set(memo)
        replaced: dict[int, str] = {}
        for key in [k for k in self._pending if k[0] == cj and want & set(k[1])]:
            try:
                insts, why = self._pending.pop(key).result()
                for inst in insts:
                    memo.setdefault(inst.seed, inst)
                replaced.update(why)
            except Exception as exc:  # noqa: BLE001  # a broken worker costs only the time: generate here instead
                log.warning("instance prefetch failed (%s); generating in the run process", exc)
        missing = [s for s in dict.fromkeys(seeds) if s not in memo]
        if missing:
            from harness.tasks.drawn import draw_replacing

            insts, why = draw_replacing(self.task, config, missing)
            memo.update(zip(missing, insts, strict=True))
            replaced.update(why)
        if replaced:
            self._say_replaced(cj, replaced, len(seeds))
        return [memo[s] for s in seeds]

    def _say_replaced(self, config_json: str, replaced: dict[int, str], n: int) -> None:
        """One warning event per run and generator config: which seeds the generator could not draw, and why."""
        import hashlib

        key = "replaced-seeds/" + hashlib.blake2b(config_json.encode(), digest_size=6).hexdigest()
        first = min(replaced)
        msg = (f"the generator could not draw {len(replaced)} seed(s) of a draw of {n} from a {self.config.task} "
               f"config ({config_json[:160]}{'...' if len(config_json) > 160 else ''}); each was drawn from a "
               f"replacement seed of its split. Seed {first}: {replaced[first]}")
        log.warning("%s", msg)
        self.event(None, "instances", "warning", msg, key=key, seeds=sorted(replaced)[:20])

    def prefetch(self, config, seeds: list[int]) -> None:
        """Start generating instances in a background worker process (expert solves while this process trains), so the
        next nodes find them ready. Off with `stage.prefetch: false`; the instances are the same either way."""
        if not self.config.stage.prefetch or not seeds:
            return
        cj = config.model_dump_json()
        missing = [s for s in seeds if s not in self._instances.get(cj, {})]
        if not missing or any(k[0] == cj and set(missing) <= set(k[1]) for k in self._pending):
            return
        if self._pool is None:
            from harness.tasks.worker import InstanceWorker

            self._pool = InstanceWorker()
        self._pending[(cj, tuple(missing))] = self._pool.submit(self.config.task, cj, missing)

    def ray(self):
        """The Ray arm runner (scale.backend: ray): joins the cluster, or starts a local one, on first use."""
        if self._ray is None:
            from harness.scale import RayArms

            self._ray = RayArms(self.config.scale)
        return self._ray

    def close(self) -> None:
        """Stop the prefetch worker (pending work is dropped; nothing it makes is ever recorded) and leave Ray (a
        local cluster the run started stops with it)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._pending.clear()
        if self._ray is not None:
            self._ray.close()
            self._ray = None

    def suite(self) -> list:
        """The report's test set (a named suite or `eval.env`'s instances, test split, cut to `eval.limit`), generated
        once per process (`draw_test`'s memo; setup draws it first, so no stage pays for it)."""
        from harness.tasks.suites import draw_test

        return [inst for _, inst in draw_test(self.task, self.config.eval)]

    def env_stats(self, config) -> dict:
        """`task.env_stats` of an env config, once per config per process (the config changes only on promotion)."""
        key = config.model_dump_json()
        if key not in self._env_stats:
            self._env_stats[key] = self.task.env_stats(config, 64) if isinstance(self.task, EnvStats) else {}
        return self._env_stats[key]

    def skills(self):
        """The skill library; the seed skills are synced on the first open of the process, and again when the
        library holds none (deleted or replaced while the run went on)."""
        from skills.library import SEED_DIR, SkillLibrary

        lib = SkillLibrary.open(seed_dir=None)
        if not self._seeds_synced or not lib.has_seeds():  # a library removed or replaced since: seeds back first
            lib.sync_seeds(SEED_DIR)
        self._seeds_synced = True
        return lib

    def store_started(self) -> float:
        """When the run was created (the wall-clock budget counts from here, across resumes)."""
        return self.store.started_at(self.id)

    def path(self, *parts: str) -> Path:
        p = self.run_dir.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def result(self, stage: int, model: type[R], node: str | None = None) -> R | None:
        """A node's typed result of this run (`harness.results`), None until the node finished."""
        return self.store.result(self.id, stage, model, node=node)

    def save_result(self, stage: int, result: NodeResult, node: str | None = None,
                    timing: dict[str, Any] | None = None) -> None:
        self.store.save_result(self.id, stage, result, node=node, timing=timing)

    def charge(self, stage: int, arm: str, kind: str, **cost: Any) -> None:
        """One row of the compute ledger (`RunStore.charge`)."""
        self.store.charge(self.id, stage, arm, kind, **cost)

    def charge_again(self, stage: int, arm: str, kind: str, label: str, **cost: Any) -> None:
        """A ledger row for work that is new each time it is done, never a re-measurement of the same work: a row under
        `label` already there (an earlier attempt at the node that was stopped after it, e.g. an engineer asked before
        a kill and asked again on the resume) keeps its charge, and this one goes under `label, again N`."""
        used = {r["label"] for r in self.store.ledger(self.id) if (r["stage"], r["arm"], r["kind"]) == (stage, arm, kind)}
        n, name = 1, label
        while name in used:
            n += 1
            name = f"{label}, again {n}"
        self.store.charge(self.id, stage, arm, kind, label=name, **cost)

    def record_eval(self, stage: int, arm: str, split: str, **metrics: Any) -> None:
        self.store.record_eval(self.id, stage, arm, split, **metrics)

    def draw_seeds(self, split: str, n: int, key: str) -> list[int]:
        """`n` keyed seeds of `split` (the same ones again for the same key: `RunStore.draw_seeds`). Each run seed
        draws from its own stretch of every split (`DRAW_STRIDE` indices from `seed_stretch`), so two runs that differ
        only in `seed` train, probe and judge on different instances and are independent replicates of the whole run,
        not only of its sampling; the test suite (`suite`) is the same for every seed, so arms and seeds stay paired
        on it. Until the fortieth session every run drew from index 0, whatever its seed."""
        return self.store.draw_seeds(self.id, split, n, key=key, first=seed_stretch(self.config.seed))

    def event(self, stage: int | None, node: str, kind: str, message: str, key: str | None = None, **data: Any):
        new = self.store.add_event(self.id, kind, message, stage=stage, node=node, data=data or None, key=key)
        if new or kind != "warning":  # a keyed warning is shown once per run, not at every re-entry
            self.progress(kind, {"stage": stage, "node": node, "message": message, **data})

    # --- the policy cache: checkpoints the run wrote, kept in memory for the nodes that read them next --------------

    def load(self, path: str):
        """A fresh (model, tokenizer) for `path`: from the in-process copy when the run saved it, else from disk."""
        import copy

        from policies.model import load_policy

        if path in self._models:
            model, tok = self._models[path]
            return copy.deepcopy(model), tok
        return load_policy(path)

    def policy(self, path: str):
        """What the rollout layer gets for a checkpoint: a fresh (model, tokenizer) for transformers, or for vLLM the
        checkpoint path with its tokenizer (vLLM loads weights itself; its engine for the path is cached until the
        checkpoint is superseded, see `release_engines`)."""
        from policies.rollout import resolve_backend

        if resolve_backend(self.config.policy.backend) == "vllm":
            from policies.model import load_tokenizer

            return str(path), load_tokenizer(path)
        return self.load(path)

    def release_engines(self, keep: list[str]) -> None:
        """Free the vLLM engines of checkpoints no later node reads (GPU memory); nothing to do without vLLM."""
        from policies.rollout import release_vllm_engines

        release_vllm_engines(keep=[k for k in keep if k])

    def save(self, model, tok, path: Path) -> None:
        """save_pretrained to disk (the record, and what a resume reads) and, for small models, keep a copy in
        memory: the probe, both arms and the report load this checkpoint next, and a deep copy is much cheaper than
        a reload."""
        import copy

        from harness.policy_glue import write_policy_meta
        from policies.model import save_policy

        save_policy(model, tok, path)
        write_policy_meta(path, self.task.name, self.style)
        if sum(p.numel() for p in model.parameters()) < MEMO_MAX_PARAMS:
            if len(self._models) >= 4:
                self._models.pop(next(iter(self._models)))
            tok = copy.deepcopy(tok)
            tok.padding_side = "left"  # as load_policy leaves it (trainers may have changed it)
            self._models[str(path)] = (copy.deepcopy(model).eval(), tok)

    def new_stage_instances(self) -> None:
        """Forget the memoised instances (a new stage draws new seeds; the env may have changed)."""
        self._instances = {}
