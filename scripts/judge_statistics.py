"""Would another statistic make a decision cheaper? Read offline from recorded decisions, nothing trains.

A decision's cost is mostly its arms' training; what a cheaper judge could buy is a smaller variance per arm pair at
the same judging cost, so that fewer pairs reach the same power (issue 32's cost target). Two candidates, both read
from what runs already record:

1. **Greedy outcomes instead of sampled ones.** Every arm is judged on `backtest.samples` sampled completions per
   instance (the decision's per-instance success rate) and one greedy decode (recorded, reported). A judge deciding on
   the greedy decode alone could spend the sampled completions' decodes on more instances: `samples + 1` times as many
   for the same decoding. Per family: the per-instance variance of the paired difference both ways (the loop's
   recorded arm pairs), how the greedy effect scales with the sampled one (least squares slope over decisions), the
   arm-training noise both ways (A/A calibration files: variance of a pair's effect over pairs minus its instance
   part, halved), and the information per pair at equal decoding, `b^2 (2 s_s^2 + v_s / n) / (2 s_g^2 + v_g / (k n))`.
2. **A control variate (CUPED, Deng, Xu, Kohavi and Walker 2013):** the stage's start is judged on the same first
   instances (`judge:start`); regressing the paired difference on the start's per-instance outcome removes a share
   corr^2 of its variance. Reported: the mean corr^2 over decisions (about 1 / n when there is no correlation).

    python scripts/judge_statistics.py --runs 'RUN_DB_GLOB' ... --aa 'CALIBRATION_JSON' ... [--pairs-cache F]

Families are read from the scenario name in a run's path (`mapf-`, `math-`, `code-`) and, for the A/A files, from
the config they name (`--aa FILE=FAMILY` overrides).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sqlite3
import sys
from typing import Any

import numpy as np

FAMILY = re.compile(r"(mapf|math|code)[-_]")


def family(text: str) -> str:
    m = FAMILY.search(text)
    return m.group(1) if m else "other"


def sampled_rates(path: str) -> list[float] | None:
    """Per-instance success rate over a rollouts file's samples, instances in their order of first appearance."""
    by: dict[int, list[float]] = {}
    try:
        with gzip.open(path, "rt") as f:
            for line in f:
                r = json.loads(line)
                by.setdefault(r["seed"], []).append(1.0 if r.get("valid") else 0.0)
    except (OSError, EOFError, json.JSONDecodeError):
        return None
    return [sum(v) / len(v) for v in by.values()]


def arm_pairs(db: str) -> list[dict[str, Any]]:
    """Every (control, candidate) arm pair a run recorded, with both arms' sampled and greedy per-instance outcomes on
    the instances both were judged on (every look, in order), and the stage start's outcomes."""
    run = os.path.dirname(db)
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        rows = con.execute("select stage, node, result from nodes where node like 'arm:%' or node = 'judge:start'"
                           ).fetchall()
    except sqlite3.Error:
        return []
    arms: dict[tuple[int, str], dict[int, dict[str, Any]]] = {}
    starts: dict[int, list[float]] = {}
    for stage, node, res in rows:
        try:
            r = json.loads(res)
        except (TypeError, json.JSONDecodeError):
            continue
        if node == "judge:start":
            starts[stage] = r.get("outcomes") or []
            continue
        m = re.match(r"arm:([^:]+)(?::look(\d+))?$", node)
        if m:
            arms.setdefault((stage, m.group(1)), {})[int(m.group(2) or 0)] = r

    def outcomes(looks: dict[int, dict[str, Any]]) -> tuple[list[float], list[float]] | None:
        s_all: list[float] = []
        g_all: list[float] = []
        for j in sorted(looks):
            path = looks[j].get("rollouts") or ""
            if not os.path.exists(path):
                path = os.path.join(run, "rollouts", os.path.basename(path))
            s, g = sampled_rates(path), looks[j].get("greedy") or []
            if s is None or len(g) != len(s):
                return None
            s_all += s
            g_all += g
        return s_all, g_all

    out = []
    for (stage, name), looks in sorted(arms.items()):
        if name.startswith("control"):
            continue
        suffix = name[len(name.split("-")[0]):]  # a second pair's "-p2"
        ctl = arms.get((stage, "control" + suffix))
        c, x = (outcomes(ctl) if ctl else None), outcomes(looks)
        if not c or not x:
            continue
        n = min(len(c[0]), len(x[0]))
        if n >= 8:
            out.append({"db": db, "stage": stage, "arm": name, "n": n, "cs": c[0][:n], "xs": x[0][:n],
                        "cg": c[1][:n], "xg": x[1][:n], "start": (starts.get(stage) or [])[:n] if not suffix else []})
    return out


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def aa_pairs(path: str) -> list[dict[str, float]]:
    d = read_json(path)
    rows = []
    for dec in d.get("decisions", []):
        for p in dec.get("pairs", []):
            if p.get("greedy_control") is None:
                continue
            rows.append({k: float(p[k]) for k in ("effect", "greedy_control", "greedy_candidate", "diff_var", "n")})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=[], help="globs of run.db files (recursive ** allowed)")
    ap.add_argument("--aa", nargs="*", default=[], help="A/A calibration result files (FILE or FILE=FAMILY)")
    ap.add_argument("--pairs-cache", default=None, help="JSON lines of arm pairs: read if it exists, else written")
    a = ap.parse_args(argv)

    if a.pairs_cache and os.path.exists(a.pairs_cache):
        with open(a.pairs_cache) as f:
            pairs = [json.loads(line) for line in f]
    else:
        dbs = sorted({p for g in a.runs for p in glob.glob(g, recursive=True)})
        pairs = [p for db in dbs for p in arm_pairs(db)]
        if a.pairs_cache:
            with open(a.pairs_cache, "w") as f:
                f.writelines(json.dumps(p) + "\n" for p in pairs)
    by: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for p in pairs:
        by[family(p["db"])].append(p)

    loop: dict[str, dict[str, float]] = {}
    print("Recorded arm pairs (sampled = the judge's per-instance rate over its samples; greedy = its one greedy decode)")
    print("| family | pairs | mean n | per-instance var of the paired difference, sampled / greedy | greedy effect on "
          "sampled: slope, corr | start as control variate: mean corr^2 (1/n) |")
    print("|---|---|---|---|---|---|")
    for fam, rs in sorted(by.items()):
        ds, dg, vs, vg, c2, inv = [], [], [], [], [], []
        for r in rs:
            d_s = np.subtract(r["xs"], r["cs"])
            d_g = np.subtract(r["xg"], r["cg"])
            ds.append(d_s.mean()), dg.append(d_g.mean()), vs.append(d_s.var(ddof=1)), vg.append(d_g.var(ddof=1))
            st = np.asarray(r.get("start") or [])
            if len(st) >= 20 and d_s[:len(st)].std() > 0 and st.std() > 0:
                c2.append(np.corrcoef(d_s[:len(st)], st)[0, 1] ** 2)
                inv.append(1 / len(st))
        slope = float(np.polyfit(ds, dg, 1)[0])
        loop[fam] = {"vs": float(np.mean(vs)), "vg": float(np.mean(vg)), "slope": slope}
        print(f"| {fam} | {len(rs)} | {np.mean([r['n'] for r in rs]):.0f} | {np.mean(vs):.4f} / {np.mean(vg):.4f} "
              f"(x{np.mean(vg) / np.mean(vs):.2f}) | {slope:.2f}, {np.corrcoef(ds, dg)[0, 1]:.2f} | "
              f"{np.mean(c2):.3f} ({np.mean(inv):.3f}) over {len(c2)} |")

    if a.aa:
        print("\nA/A pairs (arm-training noise; greedy per-instance variance from the loop's ratio above) and the "
              "information per pair at equal decoding, greedy judge / today's")
        print("| A/A file | family | pairs | n | arm sd, sampled / greedy | decodes per instance today (k) | "
              "information per pair, greedy / sampled |")
        print("|---|---|---|---|---|---|---|")
    for spec in a.aa:
        path, _, fam = spec.partition("=")
        rows = aa_pairs(path)
        if not fam:
            cfg = read_json(path).get("summary", {}).get("config", "")
            fam = family(str(cfg)) if family(str(cfg)) != "other" else ("mapf" if "mapf" in str(cfg) else "other")
        if not rows or fam not in loop:
            print(f"| {path} | {fam} | {len(rows)} | | (no greedy pairs or no loop data for the family) | | |")
            continue
        n = float(np.mean([r["n"] for r in rows]))
        es = np.array([r["effect"] for r in rows])
        eg = np.array([r["greedy_candidate"] - r["greedy_control"] for r in rows])
        inst_s = float(np.mean([r["diff_var"] / r["n"] for r in rows]))
        inst_g = inst_s * loop[fam]["vg"] / loop[fam]["vs"]
        arm_s = max(float(es.var(ddof=1)) - inst_s, 0.0) / 2
        arm_g = max(float(eg.var(ddof=1)) - inst_g, 0.0) / 2
        samples = 4
        k = samples + 1
        ratio = loop[fam]["slope"] ** 2 * (2 * arm_s + inst_s) / (2 * arm_g + inst_g / k)
        print(f"| {path} | {fam} | {len(rows)} | {n:.0f} | {np.sqrt(arm_s):.4f} / {np.sqrt(arm_g):.4f} | {k} | "
              f"{ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
