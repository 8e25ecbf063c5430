"""A soak run: the loop for an hour or more, with the resources an overnight run could leak sampled over time
(`evotrainer bench soak`).

    evotrainer bench soak --minutes 60 --out /tmp/soak          # the default: many short demo-sized stages
    evotrainer bench soak --config examples/mapf_overnight.yaml --minutes 480 --out /tmp/soak-night

It starts `evotrainer run` on the config in a subprocess (its `budget.wall_clock` set to `--minutes`, its stage budget
raised so that the clock ends it) and every `--every` seconds samples: resident memory of the run's whole process tree
(`rss_mb`, and the run process alone, `main_rss_mb`), the number of live descendant processes (`procs`: Ray workers,
sandbox jobs, the instance prefetcher), the run process's open file descriptors (`fds`), the run folder's size
(`run_dir_mb`), run.db's and LangGraph's graph.db's, each with its write-ahead log (`run_db_mb`, `graph_db_mb`:
both write through one, and between SQLite's checkpoints the main file alone says little), the checkpoints on disk
(`checkpoints`) and the stages finished. Rows go to
`<out>/soak.csv`; the summary to `<out>/soak.json` and stdout: each resource's growth per stage (least-squares slope
over the samples after the first `--settle` stages, when caches and pools have filled), its first and last value, and
the processes still alive after the run exited (`leaked`: any process whose environment carries this soak's tag,
which every descendant inherits, so an orphaned Ray worker or sandbox job is found even after it was re-parented).

What "no growth beyond what retention allows" means here: checkpoints, descendants and descriptors flat (slope ~0);
resident memory flat after the settle stages; run.db and the run folder growing linearly by their per-stage records
(rollouts, events), which is what retention keeps on purpose (the review reads them).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

# The demo's config (`examples/mapf_quick.yaml`: its tiny preset, target and warm start, cached by `make demo`), with
# short stages: 6 GRPO steps, two candidates with 6-step arms side by side on Ray, a small judge and a small test each
# stage, the healthy learning rate. An hour holds dozens of stages, each exercising every node (probe, diagnostics in
# the sandbox, vet, arms, looks, gate, retention).
SOAK_OVERRIDES: dict[str, dict[str, Any]] = {
    "recipe": {"steps": 6, "learning_rate": 1.0e-4},
    "stage": {"train_instances": 256, "probe_n": 16, "candidates": 2},
    "backtest": {"arm_steps": 6, "n": 48, "samples": 2},
    "eval": {"suite": "duo", "limit": 60},
}


def default_config() -> dict[str, Any]:
    from harness.benchmarks.run import DEMO_CONFIG

    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg["name"] = "soak"
    for section, values in SOAK_OVERRIDES.items():
        cfg[section] = {**(cfg.get(section) or {}), **values}
    return cfg


TAG_VAR = "EVOTRAINER_SOAK_TAG"


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _rss_mb(procs: list[Any]) -> float:
    import psutil

    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _du_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total / 2**20


def _stages_done(db: Path, run_id: str) -> int:
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = con.execute("SELECT COUNT(*) FROM stages WHERE run = ? AND status = 'done' AND stage > 0",
                              [run_id]).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return -1
    return int(row[0]) if row else 0


def tagged(tag: str, exclude: set[int] | None = None, var: str = TAG_VAR) -> list[dict[str, Any]]:
    """Live processes whose environment carries `var=tag` (this soak's descendants, orphaned or not)."""
    needle = f"{var}={tag}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in (exclude or set()):
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
            if needle in env.split(b"\0"):
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append({"pid": int(d), "cmd": cmd[:200]})
        except OSError:
            continue
    return out


def sample(pid: int, run_dir: Path, run_id: str, t0: float) -> dict[str, Any]:
    """One row: the run process tree's resources and the run folder's size, now."""
    procs = _tree(pid)
    ckpt = run_dir / "checkpoints"
    return {
        "t_s": round(time.time() - t0, 1),
        "stages": _stages_done(run_dir / "run.db", run_id),
        "rss_mb": round(_rss_mb(procs), 1),
        "main_rss_mb": round(_rss_mb(procs[:1]), 1),
        "procs": max(0, len(procs) - 1),
        "fds": _fds(pid),
        "run_dir_mb": round(_du_mb(run_dir), 2) if run_dir.exists() else 0.0,
        "run_db_mb": round(_db_mb(run_dir / "run.db"), 3),
        "graph_db_mb": round(_db_mb(run_dir / "graph.db"), 3),
        "checkpoints": sum(1 for p in ckpt.iterdir() if p.is_dir()) if ckpt.is_dir() else 0,
    }


METRICS = ("rss_mb", "main_rss_mb", "procs", "fds", "run_dir_mb", "run_db_mb", "graph_db_mb", "checkpoints")


def _db_mb(db: Path) -> float:
    """A SQLite file's size with its write-ahead log (LangGraph's saver writes through one)."""
    return sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists()) / 2**20


def growth(rows: list[dict[str, Any]], settle: int) -> dict[str, Any]:
    """Per resource: least-squares slope per finished stage over the rows after `settle` stages and before the run's
    wind-down, and the first, last and largest values of all rows. The wind-down: the trailing rows after the run's
    descendants (Ray, the prefetch worker) are gone, while it writes its report and closes (its memory and
    descriptors fall then: a slope over them says nothing about a stage). Slopes need two distinct stage counts."""
    import numpy as np

    end = len(rows)
    if any(r["procs"] > 0 for r in rows):
        while end > 0 and rows[end - 1]["procs"] == 0:
            end -= 1
    late = [r for r in rows[:end] if r["stages"] >= settle]
    xs = np.array([r["stages"] for r in late], dtype=float)
    out: dict[str, Any] = {}
    for m in METRICS:
        ys = np.array([r[m] for r in late], dtype=float)
        slope = float(np.polyfit(xs, ys, 1)[0]) if len(set(xs.tolist())) >= 2 else None
        out[m] = {"per_stage": None if slope is None else round(slope, 4),
                  "first": rows[0][m] if rows else None, "last": rows[-1][m] if rows else None,
                  "max": max(r[m] for r in rows) if rows else None}
    return out


def main(config: Path | None = None, minutes: float = 60.0, every: float = 30.0, out: Path | None = None,
         settle: int = 3) -> dict[str, Any]:
    cfg = yaml.safe_load(Path(config).read_text()) if config else default_config()
    cfg.setdefault("budget", {})
    cfg["budget"].update(wall_clock=f"{int(minutes * 60)}s", stages=max(int(cfg["budget"].get("stages") or 0), 10000))
    cfg["budget"].pop("plateau", None)
    out = Path(out) if out else Path(tempfile.mkdtemp(prefix="evotrainer-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_id = "soak"
    run_dir = out / "runs" / run_id
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_VAR: tag, "PYTHONUNBUFFERED": "1"}
    env.setdefault("EVOTRAINER_HOME", str(out / "home"))
    log = (out / "run.log").open("w")
    t0 = time.time()
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(out / "soak.yaml"), "--runs-dir",
                          str(out / "runs"), "--run-id", run_id], env=env, stdout=log, stderr=subprocess.STDOUT)
    rows: list[dict[str, Any]] = []
    print(f"soak: {out} (run log: {out / 'run.log'}), sampling every {every:.0f} s; the run stops starting stages "
          f"after {minutes:.0f} min, its warm start included", flush=True)
    with (out / "soak.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t_s", "stages", *METRICS])
        w.writeheader()
        try:
            while p.poll() is None:
                row = sample(p.pid, run_dir, run_id, t0)
                rows.append(row)
                w.writerow(row)
                f.flush()
                if len(rows) % 10 == 1:
                    print("  " + "  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
                time.sleep(every)
        except KeyboardInterrupt:
            p.send_signal(signal.SIGINT)
            p.wait()
    log.close()
    time.sleep(5)  # what the run started and did not stop is still alive now
    leaked = tagged(tag, exclude={os.getpid()})
    summary = {"out": str(out), "rc": p.returncode, "wall_s": round(time.time() - t0, 1),
               "stages": rows[-1]["stages"] if rows else 0, "samples": len(rows), "settle_stages": settle,
               "growth": growth(rows, settle) if rows else {}, "leaked": leaked}
    (out / "soak.json").write_text(json.dumps(summary, indent=1))
    print(f"stages: {summary['stages']} in {summary['wall_s'] / 60:.1f} min (run exit {p.returncode}), "
          f"{len(rows)} samples", flush=True)
    for m, g in summary["growth"].items():
        print(f"  {m:12s} per stage {g['per_stage']!s:>9}   first {g['first']}   last {g['last']}   max {g['max']}",
              flush=True)
    print(f"leaked_processes: {len(leaked)}" + "".join(f"\n  {x['pid']}: {x['cmd']}" for x in leaked), flush=True)
    return summary
