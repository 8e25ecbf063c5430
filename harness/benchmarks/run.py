"""Crash safety and framework overhead of the autonomous run (`evotrainer bench run`).

    evotrainer bench run --trials 10

Each trial starts `evotrainer run` on a tiny config in a subprocess, SIGKILLs it at a random moment, resumes it (again
and again if a resume is killed too, when `--kill-resumes`), and checks the finished run: it completed, no duplicate
candidates, commits, rows or skill updates, `git fsck` clean, run.db consistent with the harness repo's tags.
One uninterrupted tiny run times the trials (kill points) and reports its overhead share (`overhead_share:`; its
stages are 2 GRPO steps, so the fixed per-stage cost dominates). The framework overhead that the target (<= 3%) is
about is measured on demo-sized stages: `examples/mapf_quick.yaml` with a short warm start (`--overhead-stages N`),
one `overhead_share_stage_K:` line per stage plus `overhead_share_demo_max:`. Overhead = stage wall time (from the
end of the previous stage to the end of this one, LangGraph steps included) not spent in training or evaluation
compute, as a share of stage wall time. Prints grep-able `crash_trials_passed:` too.

    evotrainer bench run --trials 0 --overhead-stages 3      # only the demo-stage overhead (~3 min)
    evotrainer bench run --trials 20 --sft-steps 100 --overhead-stages 0   # kills that land in the warm start too
    evotrainer bench run --trials 5 --sft-steps 100 --at-checkpoints       # a kill after every SFT checkpoint

`--sft-steps N` lengthens the trials' SFT warm start (it checkpoints itself every `harness.warmstart.save_every(N)`
steps), so that kills land in it as well: after each kill the trial reads the last complete SFT checkpoint on disk
(when setup was not yet recorded), and the finished run must show that the next process continued from exactly that
step (its `sft_resumed` event), never from zero. Per trial: `kills_in_sft`, `sft_resumes_checked`.
`--at-checkpoints` aims the kills instead (`checkpoint_kill_trial`): a kill a random delay after each new SFT
checkpoint appears, so every checkpoint the warm start writes is resumed from, some kills landing mid-write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

TINY: dict[str, Any] = {
    "task": "mapf",
    "name": "bench",
    "seed": 0,
    "policy": {"preset": "tiny"},
    "warm_start": {"sft_examples": 64, "sft_steps": 8},
    "recipe": {"steps": 2, "batch_size": 8, "num_generations": 4, "max_completion_length": 48},
    "budget": {"stages": 2},
    "stage": {"train_instances": 16, "probe_n": 8, "probe_samples": 2, "candidates": 2},
    "backtest": {"arm_steps": 1, "n": 16},
    "engineer": {"kind": "rule"},
    "eval": {"suite": "small", "limit": 12},
}


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)


def check_run(run_dir: Path, skills_db: Path | None = None) -> list[str]:
    """Problems with a run on disk (empty list = consistent). Used by the tests and by this benchmark."""
    from harness.store import RunStore

    problems: list[str] = []
    repo = run_dir / "harness"
    fsck = _git(repo, "fsck", "--strict")
    if fsck.returncode != 0:
        problems.append(f"git fsck: {fsck.stderr.strip()[:300]}")
    tags = set(_git(repo, "tag", "--list").stdout.split())
    store = RunStore.open(run_dir / "run.db")
    try:
        run = run_dir.name
        cands = store.candidates(run)
        decided = {"promoted", "rejected", "rejected_vet", "inconclusive"}
        for c in cands:
            if c["status"] not in decided:
                problems.append(f"candidate {c['id']} left undecided ({c['status']})")
        want_promoted = {c["tag"] for c in cands if c["status"] == "promoted"}
        if want_promoted != {t for t in tags if t.startswith("promoted/")}:
            problems.append(f"promoted tags {sorted(t for t in tags if t.startswith('promoted/'))} != run.db "
                            f"{sorted(want_promoted)}")
        for verdict, statuses in (("rejected", ("rejected", "rejected_vet")), ("inconclusive", ("inconclusive",))):
            want = {f"{verdict}/{c['id']}" for c in cands if c["status"] in statuses and c["commit_sha"]}
            have = {t for t in tags if t.startswith(f"{verdict}/")}
            if want != have:
                problems.append(f"{verdict} tags {sorted(have)} != run.db {sorted(want)}")
        per_cand: dict[str, int] = {}
        log = _git(repo, "log", "--all", "--no-merges", "--format=%(trailers:key=Candidate,valueonly,separator=)").stdout
        for line in log.splitlines():
            if line.strip():
                per_cand[line.strip()] = per_cand.get(line.strip(), 0) + 1
        dups = {k: v for k, v in per_cand.items() if v > 1}
        if dups:
            problems.append(f"duplicate candidate commits: {dups}")
        if set(per_cand) != {c["id"] for c in cands if c["commit_sha"]}:
            problems.append(f"commits {sorted(per_cand)} != committed candidates in run.db")
        stages = [s["stage"] for s in store.stages(run)]
        if stages != sorted(set(stages)):
            problems.append(f"duplicate stages {stages}")
        if store.get_run(run)["status"] != "finished":
            problems.append(f"run status {store.get_run(run)['status']!r}, not finished")
        finished = [e["stage"] for e in store.events(run) if e["kind"] == "finished"]
        reopened = sum(bool(e["data"].get("reopened")) for e in store.events(run, kind="extended"))  # resume --stages
        if len(finished) != 1 + reopened or len(set(finished)) != len(finished):
            problems.append(f"{len(finished)} 'finished' events (stages {finished}) for {reopened} reopening(s)")
    finally:
        store.close()
    if skills_db is not None and skills_db.exists():
        con = sqlite3.connect(skills_db)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if {"skills", "skill_tries"} <= tables:  # a try is one row (its key: skill, run, candidate); a skill's
                # evidence counts its rows, plus the promotion it was born of when a run made it: a resumed node that
                # added evidence twice shows as more tries than rows
                for name, tries, definition, rows in con.execute(
                        "SELECT s.name, s.tries, s.definition, (SELECT COUNT(*) FROM skill_tries t WHERE t.skill = "
                        "s.name) FROM skills s").fetchall():
                    born = json.loads(definition).get("provenance", {}).get("source") == "run"
                    if tries != rows + int(born):
                        problems.append(f"skill {name}: evidence counts {tries} tries, its records {rows}"
                                        + (" plus the run it was born of" if born else ""))
        finally:
            con.close()
    return problems


def _cli(args: list[str], home: Path) -> subprocess.Popen:
    env = {**os.environ, "EVOTRAINER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _read_one(db: Path, sql: str, args: list[Any]) -> tuple | None:
    """One row from a run.db another process may be writing (read-only; None when absent or unreadable)."""
    if not db.exists():
        return None
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchone()
    except sqlite3.Error:
        return None
    finally:
        con.close()


def _run_status(db: Path, run_id: str) -> str | None:
    row = _read_one(db, "SELECT status FROM runs WHERE id = ?", [run_id])
    return row[0] if row else None


def crash_trial(workdir: Path, trial: int, kill_after: float, kill_resumes: bool, rng: random.Random,
                config: dict[str, Any] | None = None) -> dict[str, Any]:
    home = workdir / f"home{trial}"
    cfg = workdir / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(config or TINY))
    runs = workdir / "runs"
    run_id = f"trial{trial}"
    p = _cli(["run", str(cfg), "--runs-dir", str(runs), "--run-id", run_id], home)
    kills = 0
    in_sft: list[int] = []  # for each kill during the warm start: the SFT step its last complete checkpoint holds
    deadline = kill_after
    while True:
        try:
            p.wait(timeout=deadline)
            break
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
            at = _sft_checkpoint_at_kill(runs / run_id, run_id)
            if at is not None:
                in_sft.append(at)
        if not (runs / run_id / "run.db").exists():  # killed before the run existed: start again
            import shutil

            shutil.rmtree(runs / run_id, ignore_errors=True)
            p = _cli(["run", str(cfg), "--runs-dir", str(runs), "--run-id", run_id], home)
        elif _run_status(runs / run_id / "run.db", run_id) == "finished":
            break  # killed on its way out, after the run was recorded as finished: nothing to resume
        else:
            p = _cli(["resume", str(runs / run_id)], home)
        deadline = rng.uniform(3, kill_after) if kill_resumes and kills < 3 else None
    # -SIGKILL: the last kill landed after "finished"
    problems = _closing_checks(p, (0, -signal.SIGKILL), runs / run_id, run_id, home, in_sft)
    return {"trial": trial, "kill_after_s": round(kill_after, 1), "kills": kills, "problems": problems,
            "kills_in_sft": len(in_sft), "sft_resumes_checked": sum(1 for s in in_sft if s > 0)}


def checkpoint_kill_trial(workdir: Path, trial: int, rng: random.Random, config: dict[str, Any],
                          poll_s: float = 0.1) -> dict[str, Any]:
    """A trial whose kills are aimed at the warm start's checkpoints: each time a new SFT checkpoint appears on disk,
    the process is SIGKILLed a random delay later (uniform over 0 to 1.2 x the time the last checkpoint took, so some
    kills land in the next checkpoint's write) and resumed; once setup is recorded the run finishes unkilled. So every
    checkpoint the warm start writes is one a resume must continue from (the random first-kill design of
    `crash_trial` lands most kills elsewhere). Checks as `crash_trial` does, plus: a resume from every checkpoint
    killed after, and no SFT step trained twice beyond what the kills could cost (the `sft_resumed` events)."""
    from harness.warmstart import RESUME_DIR
    from policies.train import latest_resume_checkpoint, resume_step

    home = workdir / f"home{trial}"
    cfg = workdir / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(config))
    runs = workdir / "runs"
    run_id = f"ckpt{trial}"
    run_dir = runs / run_id
    p = _cli(["run", str(cfg), "--runs-dir", str(runs), "--run-id", run_id], home)
    seen, in_sft, kills = 0, [], 0
    gap, kill_at, resumed, since = 3.0, None, 0, None  # since: when this process's SFT continued (its event)
    count = "SELECT COUNT(*) FROM events WHERE run = ? AND kind = 'sft_resumed'"
    while p.poll() is None:
        time.sleep(poll_s)
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
            at = _sft_checkpoint_at_kill(run_dir, run_id)
            if at is not None:
                in_sft.append(at)
            p = _cli(["resume", str(run_dir)], home)
            kill_at, since = None, None
            continue
        if kill_at is not None or _sft_checkpoint_at_kill(run_dir, run_id) is None:
            continue  # a kill already scheduled, or the warm start is not running (before the run, or done)
        n = (_read_one(run_dir / "run.db", count, [run_id]) or (0,))[0]
        if n > resumed:
            resumed, since = n, now
        last = latest_resume_checkpoint(run_dir / "checkpoints" / RESUME_DIR)
        step = resume_step(last) if last is not None else 0
        if step > seen:
            if since is not None:  # the SFT's own time from its resume to this checkpoint: the checkpoint interval
                gap = max(0.5, now - since)
            seen = step
            kill_at = now + rng.uniform(0, 1.2 * gap)
    problems = _closing_checks(p, (0,), run_dir, run_id, home, in_sft)
    if not in_sft:
        problems.append("no kill landed in the warm start (its SFT wrote no checkpoint the trial saw)")
    return {"trial": trial, "kills": kills, "problems": problems, "kills_in_sft": len(in_sft),
            "sft_resumes_checked": sum(1 for s in in_sft if s > 0), "checkpoints_killed_after": in_sft}


def _closing_checks(p: subprocess.Popen, ok_codes: tuple[int, ...], run_dir: Path, run_id: str, home: Path,
                    in_sft: list[int]) -> list[str]:
    """What every kill trial checks once its last process ended: an accepted exit code, the run recorded as finished,
    its records whole (`check_run`), and the SFT progress kept across the kills that landed in the warm start."""
    problems = [] if p.returncode in ok_codes else [f"exit {p.returncode}: {p.stderr.read().decode()[-1500:]}"]
    if _run_status(run_dir / "run.db", run_id) != "finished":
        problems.append("the run is not recorded as finished")
    return problems + check_run(run_dir, home / "skills.db") + _sft_progress_kept(run_dir, run_id, in_sft)


def _sft_checkpoint_at_kill(run_dir: Path, run_id: str) -> int | None:
    """None when the kill did not land in the warm start (no run yet, or setup already recorded); else the step of
    the SFT's last complete resumable checkpoint on disk (0: none yet)."""
    from harness.warmstart import RESUME_DIR
    from policies.train import latest_resume_checkpoint, resume_step

    db = run_dir / "run.db"
    if not db.exists() or _read_one(db, "SELECT 1 FROM nodes WHERE run = ? AND stage = 0 AND node = 'setup'",
                                    [run_id]):
        return None
    last = latest_resume_checkpoint(run_dir / "checkpoints" / RESUME_DIR)
    return resume_step(last) if last is not None else 0


def _sft_progress_kept(run_dir: Path, run_id: str, in_sft: list[int]) -> list[str]:
    """Every kill during the warm start after its first checkpoint must be followed by a process that continued from
    that checkpoint's step (the run's `sft_resumed` events, `harness.arms.warm_start`)."""
    from harness.store import RunStore

    want = sorted({s for s in in_sft if s > 0})
    if not want:
        return []
    store = RunStore.open(run_dir / "run.db")
    try:
        got = {int((e.get("data") or {}).get("step", -1)) for e in store.events(run_id) if e["kind"] == "sft_resumed"}
    finally:
        store.close()
    lost = [s for s in want if s not in got]
    if not lost:
        return []
    return [(f"the warm start was killed with a checkpoint at step(s) {lost} on disk, and no process continued from "
             f"it (sft_resumed events at {sorted(got)})")]


def overhead(workdir: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    from harness.config import parse_config
    from harness.lifecycle import start_run
    from harness.store import RunStore

    os.environ["EVOTRAINER_HOME"] = str(workdir / "home-overhead")
    run_dir = start_run(parse_config(config or TINY, "bench"), workdir / "runs", run_id="overhead")
    store = RunStore.open(run_dir / "run.db")
    try:
        ms = [s["metrics"] for s in store.stages("overhead")]
    finally:
        store.close()
    wall = sum(m["wall_s"] for m in ms)
    compute = sum(m["compute_s"] for m in ms)
    return {"stages": len(ms), "wall_s": wall, "compute_s": compute,
            "overhead_share": max(0.0, wall - compute) / wall if wall else 0.0}


DEMO_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "mapf_quick.yaml"


def overhead_demo_stages(workdir: Path, stages: int = 3, config_path: Path = DEMO_CONFIG,
                         sft_examples: int = 500, sft_steps: int = 100) -> list[dict[str, Any]]:
    """Per-stage framework overhead of the demo config's stages (a short warm start, so it takes minutes)."""
    from harness.config import parse_config
    from harness.lifecycle import start_run
    from harness.store import RunStore

    cfg = yaml.safe_load(Path(config_path).read_text())
    cfg["warm_start"] = {"sft_examples": sft_examples, "sft_steps": sft_steps}
    cfg.setdefault("budget", {})["stages"] = stages
    cfg["budget"].pop("wall_clock", None)
    os.environ["EVOTRAINER_HOME"] = str(workdir / "home-demo-overhead")
    run_dir = start_run(parse_config(cfg, str(config_path)), workdir / "runs", run_id="demo-overhead")
    store = RunStore.open(run_dir / "run.db")
    try:
        return [{"stage": s["stage"], **{k: s["metrics"][k] for k in ("wall_s", "compute_s", "overhead_share")}}
                for s in store.stages("demo-overhead")]
    finally:
        store.close()


def main(trials: int = 10, max_kill_s: float = 90.0, kill_resumes: bool = True, seed: int = 0,
         overhead_stages: int = 3, sft_steps: int | None = None, at_checkpoints: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    config = dict(TINY)
    if sft_steps is not None:  # a warm start long enough for kills to land in it
        config["warm_start"] = {"sft_examples": max(64, 4 * sft_steps), "sft_steps": sft_steps}
    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-run-") as d:
        work = Path(d)
        if at_checkpoints:
            return _checkpoint_trials(work, trials, rng, config)
        demo: list[dict[str, Any]] = []
        if overhead_stages and DEMO_CONFIG.is_file():
            demo = overhead_demo_stages(work, overhead_stages)
            for s in demo:
                print(f"overhead_share_stage_{s['stage']}: {s['overhead_share']:.4f}   (wall {s['wall_s']:.1f} s, "
                      f"compute {s['compute_s']:.1f} s, overhead {s['wall_s'] - s['compute_s']:.2f} s)", flush=True)
            print(f"overhead_share_demo_max: {max(s['overhead_share'] for s in demo):.4f}", flush=True)
        if not trials:
            return {"demo_overhead": demo, "trials": [], "passed": 0}
        t0 = time.time()
        ov = overhead(work, config)
        full = time.time() - t0
        print(f"uninterrupted run: {full:.0f} s, {ov['stages']} stages", flush=True)
        print(f"overhead_share: {ov['overhead_share']:.4f}   (stage wall {ov['wall_s']:.1f} s, compute "
              f"{ov['compute_s']:.1f} s)", flush=True)
        results = []
        for i in range(trials):
            kill_after = rng.uniform(5, min(max_kill_s, full))
            r = crash_trial(work, i, kill_after, kill_resumes, rng, config)
            results.append(r)
            print(f"trial {i}: killed {r['kills']}x (first at {r['kill_after_s']} s; {r['kills_in_sft']} in the warm "
                  f"start, {r['sft_resumes_checked']} resumed from its checkpoint) -> "
                  f"{'ok' if not r['problems'] else 'FAIL: ' + '; '.join(r['problems'])}", flush=True)
        passed = sum(1 for r in results if not r["problems"])
        print(f"crash_trials: {trials}\ncrash_trials_passed: {passed}\n"
              f"kills_total: {sum(r['kills'] for r in results)}\n"
              f"kills_in_sft: {sum(r['kills_in_sft'] for r in results)}\n"
              f"sft_resumes_checked: {sum(r['sft_resumes_checked'] for r in results)}", flush=True)
        return {"overhead": ov, "demo_overhead": demo, "trials": results, "passed": passed}


def _checkpoint_trials(work: Path, trials: int, rng: random.Random, config: dict[str, Any]) -> dict[str, Any]:
    results = []
    for i in range(trials):
        r = checkpoint_kill_trial(work, i, rng, config)
        results.append(r)
        print(f"trial {i}: killed {r['kills']}x, {r['kills_in_sft']} in the warm start after its checkpoints at steps "
              f"{r['checkpoints_killed_after']} -> {'ok' if not r['problems'] else 'FAIL: ' + '; '.join(r['problems'])}",
              flush=True)
    passed = sum(1 for r in results if not r["problems"])
    print(f"crash_trials: {trials}\ncrash_trials_passed: {passed}\n"
          f"kills_total: {sum(r['kills'] for r in results)}\n"
          f"kills_in_sft: {sum(r['kills_in_sft'] for r in results)}\n"
          f"sft_resumes_checked: {sum(r['sft_resumes_checked'] for r in results)}", flush=True)
    return {"trials": results, "passed": passed}
