"""Stage wall time with the backtest arms run one after another (`scale.backend: local`) and as Ray tasks on a local
cluster (`scale.backend: ray`, 2 workers of 1 CPU each), measured in one process, one after the other
(`evotrainer bench scale`).

Both runs are the demo config (`examples/mapf_quick.yaml`) cut to one stage with up to `--candidates` candidates
(the control arm plus one arm per vetted candidate), a short warm start (trained by the first run, loaded from the
cache by the second; stage wall time starts after it either way), the same seeds. Reported: the backtest node's wall time (where the arms run) and the whole
stage's, their ratio local / ray, the number of arms, and whether the two runs reached the same decisions (Ray arms
use 1 torch thread each, the local arms 2, so their floating-point sums differ and decisions may too).

    evotrainer bench scale                     # ~15 min on 2 cores
    evotrainer bench scale --arm-steps 10      # quicker, arm fixed costs (worker start, imports) weigh more
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "mapf_quick.yaml"


def _one(work: Path, cfg: dict[str, Any], backend: str, workers: int, run_id: str | None = None) -> dict[str, Any]:
    from harness.config import parse_config
    from harness.lifecycle import start_run
    from harness.store import RunStore

    scale = {"backend": backend}
    if backend == "ray":
        scale.update(num_cpus=workers, arm_resources={"num_cpus": 1})
    t0 = time.time()
    rid = run_id or backend
    run_dir = start_run(parse_config({**cfg, "scale": scale}, "bench"), work / "runs", run_id=rid)
    store = RunStore.open(run_dir / "run.db")
    try:
        stage = store.stages(rid)[0]
        bt = store.node_result(rid, 1, "backtest") or {}
        arms = store.arm_nodes(rid)
        return {"backend": backend, "run_s": time.time() - t0, "stage_wall_s": stage["metrics"]["wall_s"],
                "backtest_s": bt.get("_wall_s", 0.0), "arms": len(arms),
                "decisions": [(v["candidate"], v["decision"]) for v in bt.get("verdicts", [])],
                "effects": [round((v.get("evidence") or {}).get("effect", 0.0), 4) for v in bt.get("verdicts", [])]}
    finally:
        store.close()


def run(config: Path = DEMO_CONFIG, candidates: int = 3, arm_steps: int | None = None, workers: int = 2,
        sft_examples: int = 500, sft_steps: int = 100) -> dict[str, Any]:
    cfg = yaml.safe_load(Path(config).read_text())
    cfg["warm_start"] = {"sft_examples": sft_examples, "sft_steps": sft_steps}
    cfg["budget"] = {"stages": 1}
    cfg["stage"] = {**cfg.get("stage", {}), "candidates": candidates}
    if arm_steps:
        cfg["backtest"] = {**cfg.get("backtest", {}), "arm_steps": arm_steps}
    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-scale-") as d:
        work = Path(d)
        os.environ["EVOTRAINER_HOME"] = str(work / "home")  # the second run loads the first one's warm start
        # the first run trains the warm start and the second loads it from the cache: stage 1's wall time (what is
        # compared) starts after the warm start either way
        out = {b: _one(work, cfg, b, workers) for b in ("local", "ray")}
    loc, ray = out["local"], out["ray"]
    print(f"config: {config} (1 stage, up to {candidates} candidates, arm_steps "
          f"{cfg.get('backtest', {}).get('arm_steps')}), ray: {workers} workers x 1 CPU", flush=True)
    for r in (loc, ray):
        print(f"{r['backend']:>5}: stage wall {r['stage_wall_s']:.1f} s, backtest (arms) {r['backtest_s']:.1f} s, "
              f"{r['arms']} arms, decisions {r['decisions']} effects {r['effects']}", flush=True)
    out["backtest_ratio"] = loc["backtest_s"] / max(ray["backtest_s"], 1e-9)
    out["stage_ratio"] = loc["stage_wall_s"] / max(ray["stage_wall_s"], 1e-9)
    out["same_decisions"] = loc["decisions"] == ray["decisions"]
    print(f"backtest_speedup_local_over_ray: {out['backtest_ratio']:.2f}", flush=True)
    print(f"stage_speedup_local_over_ray: {out['stage_ratio']:.2f}", flush=True)
    print(f"same_decisions: {out['same_decisions']}", flush=True)
    return out
