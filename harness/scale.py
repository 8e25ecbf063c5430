"""Where backtest arms run: in the run process (`scale.backend: local`, the default) or as Ray tasks (`ray`).

An arm is one `ArmJob`: everything it needs travels with it (the harness files, the training and backtest instances,
the judge, the seeds), so it trains on the same data anywhere; what differs is the process's cores: an arm run here on
a core its torch threads leave idle overlaps its rollouts with its steps (`recipe.pipeline: auto`, one update stale),
a Ray arm on its one core does not, so the two backends' weights differ (both arms of one decision run on one backend,
so no comparison mixes them). `execute_arm` is the one function that trains and judges an arm;
the local backend calls it in the run process, the Ray backend calls it inside a Ray task. Only the run process writes
run.db, the harness repo and the run directory: a Ray task gets the start checkpoint as bytes and sends back the
trained checkpoint, its TensorBoard files and its scored rollouts, which the run process then records. So a worker
that dies mid-arm leaves nothing behind; Ray starts the arm again (`scale.max_retries`), and nothing is recorded twice.

    scale: {backend: ray}                                  # a local cluster, started by the run, its cores
    scale: {backend: ray, address: auto}                   # join the cluster `ray start --head` runs on this machine
    scale: {backend: ray, arm_resources: {num_cpus: 1, num_gpus: 1}}
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import CORES_ENV

log = logging.getLogger(__name__)


class ScaleError(RuntimeError):
    """The configured scale-out backend cannot run (Ray missing, cluster unreachable). One line, with the fix."""


class ArmCannotRun(RuntimeError):
    """One arm could not be run or finished without a result (no worker can host it, its worker kept dying)."""


# --- the job ---------------------------------------------------------------------------------------------------------


@dataclass
class ArmJob:
    """One backtest arm: train `steps` GRPO steps from `start` under the harness `files`, then judge the result on
    `eval_instances`. Picklable, and free of the run: it names the task and carries its instances."""

    name: str
    task: str
    style: str
    files: dict[str, str]
    start: str  # the start checkpoint, as the run process knows it
    steps: int
    train_seeds: list[int]
    train_instances: list
    seed: int  # training randomness (equal for every arm of a decision: paired design)
    judge: Any  # harness.backtest.Judge
    eval_instances: list
    sampling_seed: int
    backend: str = "transformers"  # rollout engine of the judge


@dataclass
class ArmOutput:
    metrics: Any  # policies.train.GRPOMetrics
    train_s: float  # the whole TRL call (trainer setup + steps)
    eval: Any  # harness.backtest.ArmEval


def execute_arm(job: ArmJob, model, tok, save: Callable[[Any, Any], None], reload: Callable[[], tuple[Any, Any]],
                progress=None, tensorboard_dir: Path | None = None) -> ArmOutput:
    """Train `model` (the start checkpoint, loaded) under the job's harness, `save` it, `reload` it (a fresh copy, as
    every later reader of the checkpoint sees it; for vLLM the checkpoint path) and judge it. The one arm function of
    both backends."""
    from harness.backtest import judge_arm, train_arm
    from harness.tasks import get_task

    task = get_task(job.task)
    t0 = time.perf_counter()
    metrics = train_arm(model, tok, task, job.files, job.steps, job.train_seeds, job.seed, style=job.style,
                        instances=job.train_instances, progress=progress, tensorboard_dir=tensorboard_dir)
    train_s = time.perf_counter() - t0
    save(model, tok)
    del model
    model, tok = reload()
    ev = judge_arm(model, tok, task, job.eval_instances, job.judge, sampling_seed=job.sampling_seed, style=job.style,
                   backend=job.backend)
    return ArmOutput(metrics=metrics, train_s=train_s, eval=ev)


# --- directories as bytes (checkpoints and TensorBoard files cross the cluster this way) -------------------------------


def read_tree(root: Path) -> dict[str, bytes]:
    root = Path(root)
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_tree(files: dict[str, bytes], root: Path) -> Path:
    root = Path(root)
    for rel, data in files.items():
        p = (root / rel).resolve()
        if root.resolve() not in p.parents:  # a relative path that climbs out is never written
            raise ValueError(f"refusing to write {rel!r} outside {root}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def policy_loader(path: Path, backend: str) -> Callable[[], tuple[Any, Any]]:
    """What `execute_arm` reloads: the model (transformers) or, for vLLM, the checkpoint path with its tokenizer."""
    from policies.model import load_policy, load_tokenizer
    from policies.rollout import resolve_backend

    if resolve_backend(backend) == "vllm":
        return lambda: (str(path), load_tokenizer(path))
    return lambda: load_policy(path)


def _ray_arm(job: ArmJob, start: dict[str, bytes], threads: int) -> tuple[ArmOutput, dict[str, bytes], dict[str, bytes]]:
    """The body of a Ray arm task: materialise the start checkpoint, `execute_arm`, send back the trained checkpoint
    and the TensorBoard files as bytes (the run process writes them)."""
    import torch

    from harness.policy_glue import write_policy_meta
    from policies.model import load_policy, save_policy
    from policies.rollout import release_vllm_engines

    torch.set_num_threads(max(1, threads))
    os.environ[CORES_ENV] = str(max(1, threads))  # arms run side by side: this one's share of the machine
    from policies.train import SCRATCH_PREFIX

    # named as the trainer's scratch (this worker's pid first), so a worker killed with its run leaves a folder the
    # next training call sweeps (`policies.train._sweep_orphans`) instead of a checkpoint copy in /tmp for good
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-arm-{job.name}-") as d:
        model, tok = load_policy(write_tree(start, Path(d) / "start"))
        out, tb = Path(d) / "out", Path(d) / "tb"

        def save(m, t) -> None:
            save_policy(m, t, out)
            write_policy_meta(out, job.task, job.style)

        try:
            result = execute_arm(job, model, tok, save, policy_loader(out, job.backend), tensorboard_dir=tb)
        finally:
            release_vllm_engines()  # this worker runs other arms next: its GPU memory goes back
        return result, read_tree(out), read_tree(tb)


# --- backends --------------------------------------------------------------------------------------------------------


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def check(cfg, probe: bool = True) -> None:
    """Refuse a scale config that cannot run, in one line with the fix, before anything trains (`probe`: join the
    cluster of a configured address once, `_probe_join`)."""
    if cfg.backend != "ray":
        return
    if not ray_installed():
        raise ScaleError("scale.backend is 'ray' but Ray is not installed: pip install 'evotrainer[ray]' "
                         "(`make venv` installs it), or set scale.backend: local")
    addr = cfg.address
    if addr and addr != "auto":
        hostport = addr.removeprefix("ray://").removeprefix("http://").split("/")[0]
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ScaleError(f"scale.address {addr!r} is not 'auto', 'host:port' or 'ray://host:port'")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise ScaleError(f"scale.address {addr!r} cannot be reached ({exc.strerror or exc}): start the cluster "
                             f"there (`ray start --head --port={port}`), fix the address, or leave scale.address out "
                             "to start a local cluster") from None
    if addr and probe:
        _probe_join(addr)


JOIN_TIMEOUT_S = 60.0  # joining a live cluster takes a few seconds; a port that is not Ray's never answers


def _probe_join(addr: str) -> None:
    """Join the cluster at `addr` once, in a child process with a time limit, and leave: an open port that is not a
    Ray head (it hung the run's first backtest for ever) or `auto` with no cluster running (a traceback after the first
    stage's training) is one line here instead. A child, so a hang is killed and this process never holds a
    connection the run would have to undo."""
    import subprocess
    import sys

    code = ("import logging, os, sys, ray\nos.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')\n"
            "ray.init(address=sys.argv[1], include_dashboard=False, logging_level=logging.ERROR, "
            "log_to_driver=False)\nray.shutdown()\n")
    fix = ("start the cluster (`ray start --head`), fix scale.address, or leave it out to start a local cluster")
    try:
        res = subprocess.run([sys.executable, "-c", code, addr], capture_output=True, text=True,
                             timeout=JOIN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ScaleError(f"scale.address {addr!r}: no Ray cluster answered within {JOIN_TIMEOUT_S:.0f} s (is it a "
                         f"Ray head's port?): {fix}") from None
    if res.returncode != 0:
        lines = [ln.strip() for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
        raise ScaleError(f"scale.address {addr!r}: could not join the Ray cluster ({why[:300]}): {fix}")


class RayArms:
    """Arms as Ray tasks. Connects on first use (or starts a local cluster, which lives as long as the run process)."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self._started = False
        self._fn = None
        self._starts: dict[str, Any] = {}  # start checkpoint path -> ObjectRef of its bytes (put once per stage)

    def _connect(self):
        import ray

        if self._fn is not None:
            return ray
        check(self.cfg, probe=False)  # the start checked the cluster; here the connection itself says
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report: nothing leaves the machine
        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR,
                                  "log_to_driver": True, "namespace": "evotrainer"}
            if self.cfg.address:
                kw["address"] = self.cfg.address
            else:
                # Ray starts its workers at niceness 15 (RayConfig worker_niceness): the arms are the run's main
                # compute, and at 15 they yield to any other process on the machine, the run's own instance worker
                # (niceness 10) included. Beside two ordinary jobs the demo's stage-1 arms took 25 minutes instead
                # of about 1.5 (BENCHMARKS.md). A cluster started with `ray start` keeps its own setting.
                from policies import cores  # this process's share (EVOTRAINER_CORES, affinity), not the machine's:
                # two experiment workers side by side each start a cluster (an outside review: 4 threads on 2 cores)

                kw.update(num_cpus=self.cfg.num_cpus or cores(), object_store_memory=512 * 2**20,
                          _system_config={"worker_niceness": 0})
            try:
                ray.init(**kw)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ScaleError(f"could not join the Ray cluster {self.cfg.address or '(local)'}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; check "
                                 "scale.address (or leave it out to start a local cluster)") from None
            self._started = not self.cfg.address
        res = self.cfg.arm_resources
        self._fn = ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_retries=self.cfg.max_retries,
                              retry_exceptions=False)(_ray_arm)
        return ray

    def fits(self) -> str | None:
        """Why an arm cannot be scheduled on this cluster at all (asks more CPUs / GPUs than it has), else None."""
        import ray

        have = ray.cluster_resources()
        res = self.cfg.arm_resources
        for key, want in (("CPU", res.num_cpus), ("GPU", res.num_gpus)):
            if want > have.get(key, 0):
                return (f"scale.arm_resources asks {want:g} {key} per arm but the Ray cluster has "
                        f"{have.get(key, 0):g}: lower scale.arm_resources.num_{key.lower()}s or add nodes with {key}s")
        return None

    def run(self, jobs: list[ArmJob]) -> Iterator[tuple[str, ArmOutput | Exception, dict[str, bytes],
                                                        dict[str, bytes]]]:
        """Submit every job at once; yield (name, output or the exception, checkpoint files, TensorBoard files) as
        each finishes. Never raises for one arm: a failed arm is yielded with its exception."""
        ray = self._connect()
        if (why := self.fits()) is not None:
            for job in jobs:
                yield job.name, ArmCannotRun(why), {}, {}
            return
        threads = max(1, int(self.cfg.arm_resources.num_cpus))
        refs = {}
        for job in jobs:
            if job.start not in self._starts:
                self._starts[job.start] = ray.put(read_tree(Path(job.start)))
            refs[self._fn.options(name=f"arm:{job.name}").remote(job, self._starts[job.start], threads)] = job.name
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    out, ckpt, tb = ray.get(ref)
                    yield refs[ref], out, ckpt, tb
                except Exception as exc:  # noqa: BLE001 - one arm's failure is that decision's, not the run's
                    yield refs[ref], arm_failure(exc, self.cfg.max_retries), {}, {}

    def run_into(self, jobs: list[ArmJob], checkpoint_dir: Callable[[str], Path],
                 tensorboard_dir: Callable[[str], Path]) -> Iterator[tuple[str, ArmOutput | Exception]]:
        """`run`, writing each arm that came back into the run's directories (`checkpoint_dir(name)`,
        `tensorboard_dir(name)`) before yielding (name, output or exception); the stage's start checkpoints are
        forgotten once every job is back."""
        for name, res, ckpt, tb in self.run(jobs):
            if not isinstance(res, Exception):
                write_tree(ckpt, checkpoint_dir(name))
                write_tree(tb, tensorboard_dir(name))
            yield name, res
        self.forget_starts()

    def forget_starts(self) -> None:
        self._starts.clear()

    def close(self) -> None:
        self._starts.clear()
        if self._started:
            import ray

            ray.shutdown()
            self._started = False
        self._fn = None


def arm_failure(exc: BaseException, retries: int) -> ArmCannotRun:
    """A failed Ray arm as the decision's failure (`ray_reason`), raised from the arm's own exception (Ray's `cause`):
    a full disk or failing file system on the worker then stops the run as a machine fault, resumable
    (`harness.faults.machine_fault` reads the chain), as it does for an arm run here; from the text alone the candidate
    was rejected, and never proposed again (an outside review)."""
    err = ArmCannotRun(ray_reason(exc, retries))
    err.__cause__ = getattr(exc, "cause", None) or exc
    return err


def ray_reason(exc: BaseException, retries: int) -> str:
    """A short, readable reason for a failed Ray arm (the arm's own exception, or why its worker is gone)."""
    cause = getattr(exc, "cause", None)
    if cause is not None and not isinstance(cause, type(exc)):
        return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}".rstrip(": ")
    name = type(exc).__name__
    first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
    if name in ("WorkerCrashedError", "OutOfMemoryError", "NodeDiedError"):
        return f"{name} (its Ray worker died {retries + 1} time(s); out of memory or killed): {first}"[:500]
    return f"{name}: {first}"[:500]
