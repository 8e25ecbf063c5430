"""The review of a run, as data: a JSON status, a terminal summary, a candidate timeline, the test-suite curve.

    evotrainer status runs/<id> --json      # read-only, safe while the run is going
    evotrainer review runs/<id> [CANDIDATE]

Everything here only reads run.db and the harness repo; nothing is recomputed. The HTML page
(`evotrainer report`, runs/<id>/report.html) is `harness.report_page`, which reads this module; nothing here imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.store import RunStore, driver_dead


def _gate_pending(store: RunStore, run_id: str, cands: list[dict[str, Any]]) -> None:
    """A candidate whose stage waits at the human gate (or was stopped between its backtest and its decision) has its
    gate verdict in the stage's backtest result, not yet on its row: fill effect, interval, n and reason from there
    and say the decision is pending (`verdict` "<decision> (pending: not applied yet)"), so the person at the gate
    reads the evidence they are asked to decide on."""
    from harness.results import Backtested

    undecided = [c for c in cands if c["verdict"] is None and c["status"] not in ("rejected_vet",)]
    for k in sorted({c["stage"] for c in undecided}):
        bt = store.result(run_id, k, Backtested)
        got = {v.candidate: v for v in (bt.verdicts if bt is not None else [])}
        for c in (c for c in undecided if c["stage"] == k and c["id"] in got):
            v = got[c["id"]]
            c["verdict"] = f"{v.decision} (pending: not applied yet)"
            c["reason"] = v.reason
            if (ev := v.evidence) is not None:
                c.update(effect=ev.effect, interval=[ev.ci_low, ev.ci_high] if ev.ci_low is not None else None,
                         n=ev.pooled_n, looks=ev.model_dump().get("looks") or [], mde=ev.model_dump().get("mde"))


def _run_id(store: RunStore, run_dir: Path) -> str:
    """The run a folder holds: its name, or (a folder renamed or copied under another name) the id it was created
    with (its marker), or the one run its database holds; else its name, whose lookup then says what is there."""
    from harness.store import created_as

    ids = store.runs()
    if run_dir.name in ids:
        return run_dir.name
    first = created_as(run_dir)
    if first in ids:
        return first
    return ids[0] if len(ids) == 1 else run_dir.name


def status(run_dir: Path) -> dict[str, Any]:
    """Stages (held-out metrics) and candidates (id, factor, verdict, reason, effect, interval, commit, tag), and the
    run folder's disk use (`harness.retention.disk_usage`)."""
    from harness.retention import disk_usage
    from harness.stagebook import compute_shares

    store = RunStore.open(run_dir / "run.db", read_only=True)
    try:
        run_id = _run_id(store, run_dir)
        run = store.get_run(run_id)
        from harness.results import Decided, SetUp, carried_flags

        stages = []
        setup = store.result(run_id, 0, SetUp)
        prev = setup.policy if setup is not None else None
        rows = store.stages(run_id)
        last = max([s["stage"] for s in rows], default=0)
        flags = carried_flags(prev, [store.result(run_id, j, Decided) for j in range(1, last + 1)])
        for s in rows:
            m = s.get("metrics") or {}
            done = s["status"] == "done" and bool(s.get("checkpoint")) and s["stage"] != 0
            anchored = s.get("checkpoint") != prev if done else None  # the stage's checkpoint: the run's anchor
            # carried: the next stage trains from a checkpoint this stage trained (`carried_flags`; a stage without
            # a recorded decision: whether its recorded checkpoint moved)
            flag = flags[s["stage"] - 1] if s["stage"] else None
            carried = (flag if flag is not None else anchored) if done else None
            prev = s.get("checkpoint") or prev
            stages.append({"stage": s["stage"], "status": s["status"], "checkpoint": s.get("checkpoint"),
                           "carried": carried, "anchored": anchored,
                           "valid": m.get("valid"), "optimal": m.get("optimal"), "wall_s": m.get("wall_s"),
                           "overhead_share": m.get("overhead_share")})
        cands = [{"id": c["id"], "stage": c["stage"], "kind": c["kind"], "factor": c["knob"],
                  "value": (c["patch"] or {}).get("value"), "old_value": c["old_value"], "status": c["status"],
                  "verdict": {"promoted": "promoted", "rejected": "rejected", "rejected_vet": "rejected",
                              "inconclusive": "inconclusive"}.get(c["status"]), "reason": c["reason"],
                  "effect": c["effect"], "looks": (c.get("evidence") or {}).get("looks") or [],
                  "pooled": (c.get("evidence") or {}).get("pooled") or [],
                  "interval": [c["ci_low"], c["ci_high"]] if c["ci_low"] is not None else None, "n": c["n"],
                  "mde": (c.get("evidence") or {}).get("mde"), "samples": (c.get("evidence") or {}).get("samples"),
                  "greedy": [(c.get("evidence") or {}).get("greedy_control"),
                             (c.get("evidence") or {}).get("greedy_candidate")],
                  "engineer": c["engineer"], "skill": c["skill"], "commit": c["commit_sha"], "tag": c["tag"],
                  "rationale": c["rationale"]}
                 for c in store.candidates(run_id)]
        _gate_pending(store, run_id, cands)
        kind = ((run.get("config") or {}).get("engineer") or {}).get("kind", "rule")
        fallbacks = []  # stages an llm or scripted engineer was asked and the rule engineer proposed: and why
        if kind != "rule":
            for s in rows:
                prop = store.node_result(run_id, s["stage"], "propose") if s["stage"] else None
                if prop and prop.get("engineer") == "rule":
                    notes = [e["message"] for e in store.events(run_id, kind="engineer_note")
                             if e["stage"] == s["stage"] and e["message"].startswith(f"{kind} engineer ")]
                    fallbacks.append({"stage": s["stage"], "why": notes[0] if notes else None})
        waiting = None
        if run["status"] == "paused":
            ev = store.events(run_id, kind="gate_waiting")
            waiting = f"human gate, stage {ev[-1]['stage']}" if ev else "human gate"
        status_ = run["status"]
        if status_ == "running" and driver_dead(run_dir) is not None:  # killed -9: nothing could record it
            status_ = "interrupted"  # what `evotrainer resume` continues, as after any other stop
        return {"run": run_id, "status": status_, "waiting": waiting, "created": run.get("created"),
                "updated": run.get("updated"), "task": (run.get("config") or {}).get("task"),
                "stages": stages, "candidates": cands, "compute": store.compute(run_id), "engineer": kind,
                "seconds_spent": store.seconds_spent(run_id),
                "shares": compute_shares(store, run_id),
                "warm_start": setup.policy if setup is not None else None,
                "engineer_fallbacks": fallbacks,
                "harness": str(run_dir / "harness"), "report": str(run_dir / "report.html"),
                "disk": disk_usage(run_dir)}
    finally:
        store.close()


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """One row per run under `runs_dir` (newest first): id, task, status, stages done of budget, best held-out valid
    and at which stage, promotions, and whether the run waits at a human gate. Read-only; safe while runs are going. A
    folder whose run.db cannot be read is listed with the reason instead of failing the listing."""
    rows = []
    for d in sorted((p for p in Path(runs_dir).iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime,
                    reverse=True) if Path(runs_dir).is_dir() else []:
        if not (d / "run.db").is_file():
            if (d / "config.yaml").is_file():
                rows.append({"run": d.name, "status": "creating", "task": None, "stages_done": 0, "stages": None,
                             "best_valid": None, "best_stage": None, "promoted": 0, "waiting": None})
            continue
        try:
            st = status(d)
        except Exception as exc:  # noqa: BLE001 - one unreadable run must not hide the others
            rows.append({"run": d.name, "status": f"unreadable: {type(exc).__name__}", "task": None,
                         "stages_done": 0, "stages": None, "best_valid": None, "best_stage": None, "promoted": 0,
                         "waiting": None})
            continue
        done = [s for s in st["stages"] if s["status"] == "done" and s["valid"] is not None]
        best = max(done, key=lambda s: s["valid"], default=None)
        try:
            budget = ((yaml_load(d / "config.yaml") or {}).get("budget") or {}).get("stages")
        except Exception:  # noqa: BLE001
            budget = None
        rows.append({"run": d.name, "status": st["status"], "task": st["task"], "stages_done": len(done),  # the folder
                     # every command takes (a copied or renamed run keeps its stored id inside)
                     "stages": budget, "best_valid": best["valid"] if best else None,
                     "best_stage": best["stage"] if best else None,
                     "promoted": sum(c["verdict"] == "promoted" for c in st["candidates"]),
                     "waiting": st.get("waiting")})
    return rows


def yaml_load(path: Path) -> Any:
    from sandbox.yamlload import load_yaml

    return load_yaml(path)


def curve(run_dir: Path) -> dict[str, Any] | None:
    """The held-out test-suite curve from the per-instance outcomes each stage wrote (stages/s<k>/test.json; s0 is the
    warm start): per-stage valid rates, and the paired change from the first stage (and from the warm start) to the
    last, with a 95% paired-bootstrap interval, over problems where the record names them (a test set that draws one
    problem several times: the cluster bootstrap, `harness.backtest.two_way_bootstrap`), and only between stages scored
    on the same test set (its name and seeds). None when fewer than two stages were evaluated."""
    import json

    import numpy as np

    from harness.backtest import two_way_bootstrap

    points, recs = {}, {}
    for f in sorted((run_dir / "stages").glob("s*/test.json")):
        try:
            rec = json.loads(f.read_text())
            points[int(f.parent.name[1:])], recs[int(f.parent.name[1:])] = rec["valid"], rec
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            continue
    stages = sorted(k for k in points if k > 0)
    if not stages:
        return None
    out: dict[str, Any] = {"valid": {k: float(np.mean(v)) for k, v in sorted(points.items())},
                           "n": len(points[stages[-1]])}
    last = stages[-1]
    for name, first in (("first_to_last", stages[0]), ("warm_start_to_last", 0)):
        if first not in points or first == last or len(points[first]) != len(points[last]):
            continue
        a, b = recs[first], recs[last]
        if any(a.get(f) != b.get(f) for f in ("suite", "seeds")):  # another test set: no paired change to report
            continue
        problems = b.get("problems") if a.get("problems") == b.get("problems") else None  # older records: none
        eff, lo, hi = two_way_bootstrap([points[first]], [points[last]], 4000, 0.025, np.random.default_rng(0),
                                        clusters=problems if problems and len(problems) == len(points[last]) else None)
        out[name] = {"from": first, "to": last, "effect": eff, "ci95": [lo, hi], "above_noise": lo > 0}
    return out


def curve_text(c: dict[str, Any] | None) -> str:
    if not c:
        return "test-suite curve: fewer than two evaluated points"
    pts = " -> ".join(("warm start" if k == 0 else f"s{k}") + f" {100 * v:.1f}%" for k, v in c["valid"].items())
    lines = [f"test-suite valid (n={c['n']}): {pts}"]
    for name, label in (("first_to_last", "first stage -> last stage"), ("warm_start_to_last", "warm start -> last")):
        if name in c:
            x = c[name]
            verdict = "above noise" if x["above_noise"] else ("below noise" if x["ci95"][1] < 0 else "within noise")
            lines.append(f"{label}: {100 * x['effect']:+.1f} points [{100 * x['ci95'][0]:+.1f}, "
                         f"{100 * x['ci95'][1]:+.1f}] (95% paired bootstrap): {verdict}")
    return "\n".join(lines)


def _f(x: Any, pct: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:+.3f}"


def _cut(text: str, n: int) -> str:
    """`text` up to `n` characters, an ellipsis where it was cut (a reason stopped mid-clause read as whole)."""
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def print_summary(run_dir: Path, console) -> dict[str, Any]:
    """The run's tables and grep-able lines on a rich console; text from outside (ids, values, reasons) is shown, never
    rendered as markup or raw escapes (`harness.terminal`)."""
    from rich.table import Table

    from harness.terminal import shown

    st = status(run_dir)
    t = Table(title=f"run {shown(st['run'])} ({shown(st['status'])}): held-out test suite per stage")
    for col in ("stage", "valid", "optimal", "wall s", "overhead"):
        t.add_column(col, justify="right")
    for s in st["stages"]:
        t.add_row(str(s["stage"]), _f(s["valid"]), _f(s["optimal"]),
                  f"{s['wall_s']:.0f}" if s["wall_s"] else "-", _f(s["overhead_share"]))
    console.print(t)
    c = Table(title="candidates")
    for col in ("id", "factor", "change", "verdict", "effect [CI]", "MDE", "reason"):
        c.add_column(col, overflow="fold", no_wrap=col in ("id", "verdict"))  # "inconclus|ive" at 80 columns
    for x in st["candidates"]:
        ci = f"{_f(x['effect'], False)} [{_f(x['interval'][0], False)}, {_f(x['interval'][1], False)}]" \
            if x["interval"] else "-"
        c.add_row(*map(shown, (x["id"], x["factor"], f"{x['old_value']} -> {x['value']}", x["verdict"] or x["status"],
                               ci, _f(x["mde"], False) if x["mde"] is not None else "-",
                               _cut((x["reason"] or "").split(":")[0], 60))))
    console.print(c)
    for s in st["stages"]:
        # key: value lines for scripts; a stage not measured yet (paused at the gate, still running) says so
        console.print(f"stage_{s['stage']}_valid: {s['valid'] if s['valid'] is not None else 'not measured yet'}",
                      highlight=False)
    cv = curve(run_dir)
    console.print(curve_text(cv), highlight=False)
    if cv and "first_to_last" in cv:
        console.print(f"test_change_first_to_last: {cv['first_to_last']['effect']:+.4f}", highlight=False)
    if st.get("status") == "interrupted":  # what goes on from here, as the Ctrl-C line said
        console.print(f"resume: evotrainer resume {shown(str(run_dir))}", highlight=False)
    if st["waiting"]:
        run = shown(str(run_dir))  # the folder, not the id: an id is found only under --runs-dir
        console.print(f"paused: waits at the {shown(st['waiting'])}: evotrainer approve {run} | evotrainer revise "
                      f"{run} \"feedback\" | evotrainer abort {run}", highlight=False)
    idle = [s["stage"] for s in st["stages"] if s.get("carried") is False]
    store = RunStore.open(run_dir / "run.db", read_only=True)
    try:
        events = store.events(st["run"])
    finally:
        store.close()
    if st.get("status") == "running" and (last := next((e for e in reversed(events) if e.get("node")
                                                        and e.get("stage") is not None), None)):
        # where a running run is: its last node's last word (before, nothing said so during the warm start, which
        # can be the longest node of an overnight run on a real checkpoint)
        console.print(f"now: stage {last['stage']} {shown(last['node'])}, since {shown(str(last['ts']))}: "
                      f"{shown(last['message'][:160])}", highlight=False)
    came = {x["stage"]: x["outcome"] for x in exploit_stages(run_dir)}  # what each exploit stage came to
    for e in events:  # a stage that trained under the last promotion instead of judging arms: why, and the outcome
        if e["kind"] == "exploit":
            console.print(f"exploit, stage {e['stage']}: {shown(e['message'])}"
                          + (f"\n  outcome: {shown(came[e['stage']])}" if e["stage"] in came else ""), highlight=False)
    kept = [s["stage"] for s in st["stages"] if s.get("carried") and s.get("anchored") is False]
    if kept:  # the lineage trained on from these stages' checkpoints; the anchor (what the report scores) stayed
        console.print(f"lineage_kept: stages {', '.join(map(str, kept))} (trained on, not above the anchor by its "
                      "noise: the anchor stays)" + "".join(f"\n  stage {e['stage']}: {shown(e['message'])}"
                                                         for e in events if e["kind"] == "lineage_kept"
                                                         and e["stage"] in kept), highlight=False)
    if idle:  # a stage that carried no trained checkpoint, and what the loop did about it
        esc = [f"stage {e['stage']}: {e['message']}" for e in events if e["kind"] == "escalation"]
        why = [f"{'not carried' if e['kind'] == 'not_carried' else 'regression'}, stage {e['stage']}: {e['message']}"
               for e in events  # why each idle stage kept its start: a carry reading, or training that lowered it
               if e["kind"] in ("not_carried", "regression") and e["stage"] in idle]
        console.print(f"carried_nothing: stages {', '.join(map(str, idle))}"
                      + "".join(f"\n  {shown(x)}" for x in why) + (
            "".join(f"\n  escalation, {shown(x)}" for x in esc) if esc else "\n  no escalation"), highlight=False)
    if st["engineer_fallbacks"]:  # did the engineer the run was configured with propose at all?
        fb = st["engineer_fallbacks"]
        console.print(f"engineer_fallbacks: the {shown(st['engineer'])} engineer did not propose in stages "
                      f"{', '.join(str(x['stage']) for x in fb)}; the rule engineer did"
                      + "".join(f"\n  stage {x['stage']}: {shown(x['why'])}" for x in fb if x["why"]), highlight=False)
    for key, text in handover(st, events):
        console.print(f"{key}: {shown(text)}", highlight=False)
    if st["shares"]:  # the price of judging: what trained the delivered policy, what was thrown away, what judged
        from harness.stagebook import shares_line

        console.print(f"compute_shares: {shown(shares_line(st['shares']))}", highlight=False)
    promoted = sum(1 for x in st["candidates"] if x["verdict"] == "promoted")
    console.print(f"candidates: {len(st['candidates'])}\npromoted: {promoted}\nharness: {shown(st['harness'])}\n"
                  f"report: {shown(st['report'])}" + ("" if Path(st["report"]).is_file() else
                                                         f" (not written yet: `evotrainer report {shown(str(run_dir))}`)"),
                  highlight=False)
    disk = st["disk"]
    console.print(f"disk_mb: {disk['bytes'] / 1e6:.1f}\ncheckpoints: {disk['checkpoints']} "
                  f"({disk['checkpoint_bytes'] / 1e6:.1f} MB)", highlight=False)
    return st


def handover(st: dict[str, Any], events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What the run hands over, as (key, text) lines for the terminal summary and the report page alike: the
    checkpoint it delivers (its last final pick, else the last stage's anchor: `anchor_now` while it runs), and
    `anchor_never_moved` when every stage's test reading is the warm start's own."""
    out = []
    done = [s for s in st["stages"] if s["stage"] and s["status"] == "done" and s.get("checkpoint")]
    # the last stage's final pick only: a run reopened for more stages (`resume --stages`) picked at an earlier end
    delivered = [e for e in events if e["kind"] == "final_pick" and st["status"] == "finished" and done
                 and e["stage"] == done[-1]["stage"]]
    if delivered:  # what the run hands over, said by its last read of lineage against anchor
        out.append(("delivered", delivered[-1]["message"].split(": the run delivers ")[-1]))
    elif done:  # the anchor: what the run delivers when it ends now (a finished run without a final pick: it)
        out.append(("delivered" if st["status"] == "finished" else "anchor_now", Path(done[-1]["checkpoint"]).name))
    if done and st["warm_start"] and all(s["checkpoint"] == st["warm_start"] for s in done):
        out.append(("anchor_never_moved", ("every stage's test reading is the warm start's own (no trained checkpoint "
                    "became the anchor), so the curve is one checkpoint scored again, not a flat learner")))
    return out


def exploit_stages(run_dir: Path) -> list[dict[str, Any]]:
    """The run's exploit stages (`stage.exploit_after_promotion`), each with what it trained and whether its
    checkpoint continued: {stage, exploits, steps, outcome}. They propose nothing, so the candidate timeline has no
    row for them."""
    from harness.results import Decided, Probed, Trained

    store = RunStore.open(run_dir / "run.db", read_only=True)
    try:
        run_id = status(run_dir)["run"]
        out = []
        for s in store.stages(run_id):
            k = s["stage"]
            t = store.result(run_id, k, Trained)
            if t is None or not t.exploits:
                continue
            d, p = store.result(run_id, k, Decided), store.result(run_id, k, Probed)
            if d is None:
                outcome = "not decided yet"
            elif p is not None and p.regressed:
                outcome = (f"its training lowered the probe beyond noise ({p.change:+.3f}): not carried, the next "
                           "stage explores")
            elif (c := d.carry_check) is not None:
                said = ("continues" + (" and becomes the anchor" if c.against_anchor else "") if c.confirmed
                        else "trains on, the anchor stays" if c.kept else "not carried, the next stage explores")
                outcome = (f"{said}: {c.change:+.3f} (se {c.se:.3f}) against "
                           f"{'the anchor' if c.against_anchor else 'the stage' + chr(39) + 's start'}, greedy on {c.n} "
                           "fresh backtest instances")
            else:
                outcome = f"continues: {Path(d.next_policy).name}"
            out.append({"stage": k, "exploits": t.exploits, "steps": len(t.steps), "outcome": outcome,
                        "backoff": t.backoff})
        return out
    finally:
        store.close()


def timeline(run_dir: Path) -> list[dict[str, Any]]:
    from sandbox.workspace import Workspace

    st = {c["id"]: c for c in status(run_dir)["candidates"]}
    out = []
    for rec in Workspace(run_dir / "harness", read_only=True).history():
        row = st.get(rec.id, {})
        # run.db's verdict first: it holds a gate's verdict before it is applied (`_gate_pending`); git's otherwise
        out.append({"id": rec.id, "stage": rec.stage, "factor": rec.factor, "summary": rec.summary,
                    "rationale": rec.rationale, "verdict": row.get("verdict") or rec.verdict,
                    "reason": rec.reason or row.get("reason") or "",
                    "evidence": rec.evidence, "sha": rec.sha, "tag": rec.tag, "skill": rec.skill,
                    "engineer": rec.engineer, "effect": row.get("effect"), "interval": row.get("interval")})
    # candidates rejected before a commit existed (a patch that did not apply) are in run.db only
    seen = {r["id"] for r in out}
    out += [{"id": c["id"], "stage": c["stage"], "factor": c["factor"], "summary": f"{c['factor']} -> {c['value']}",
             "rationale": c["rationale"], "verdict": c["verdict"] or c["status"], "reason": c["reason"],
             "evidence": None, "sha": None, "tag": None, "skill": c["skill"], "engineer": c["engineer"],
             "effect": None, "interval": None} for c in st.values() if c["id"] not in seen]
    return sorted(out, key=lambda r: (r["stage"], r["id"]))

