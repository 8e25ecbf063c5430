"""The morning review as one self-contained HTML file: `evotrainer report RUN` -> runs/<id>/report.html.

Read top to bottom: what the run achieved (start vs end, overall and per slice, the net change with its interval,
promotions, compute, why it stopped), held-out curves per slice across stages, training curves per stage and arm,
every decision (paired effect overall and per slice as a forest plot, minimum detectable effect, verdict and reason,
rationale, the findings of its stage, the skill, its diff), the whole evolved harness against round 0, and the skills
used. Charts are matplotlib figures inlined as SVG (a well-kept plotting library; no JavaScript, no CDN, nothing
fetched), so the file works offline and in any browser. A run that is still going or was killed renders what exists
and says it is partial. Tested in headless Chromium (tests/test_report.py).
"""

from __future__ import annotations

import contextlib
import html
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.config import load_config
from harness.records import evidence_n
from harness.report import curve, curve_text, exploit_stages, handover, status
from harness.stagebook import shares_line
from harness.store import RunStore
from harness.tasks import TASKS, get_task
from harness.terminal import plain


def E(text: object, quote: bool = True) -> str:  # the page's one escape, short for use inside f-strings
    """Outside text as HTML: escaped, with control characters and the bidirectional overrides that reorder what the
    reader sees (U+202E before "exe.live" renders it as "evil.exe") shown as visible escapes
    (`harness.terminal.plain`)."""
    return html.escape(plain(text), quote=quote)


# --- data -------------------------------------------------------------------------------------------------------------


def gather(run_dir: Path) -> dict[str, Any]:
    """Everything the page shows, read from run.db, the stage files and the harness repo (read-only)."""
    st = status(run_dir)
    run_id = st["run"]
    store = RunStore.open(run_dir / "run.db", read_only=True)
    try:
        evals = [e for e in store.evaluations(run_id) if e["split"] == "test" and e["arm"] == "policy"]
        training: dict[int, dict[str, list[dict]]] = defaultdict(dict)
        stages = sorted({s["stage"] for s in st["stages"]})
        for k in stages:
            names = ["control", *[c["id"] for c in st["candidates"] if c["stage"] == k]]
            for arm, node in [("policy (stage)", "train"), *[(n, f"arm:{n}") for n in names],
                              *[(f"{n}-p2", f"arm:{n}-p2") for n in names]]:  # a second arm pair, when there was one
                r = store.node_result(run_id, k, node) or {}
                curve_ = r.get("curve") if isinstance(r.get("curve"), list) else r.get("steps")
                if isinstance(curve_, list) and curve_:
                    training[k][arm] = curve_
        findings = {k: [f.model_dump() for f in store.findings(run_id, k)] for k in stages}
        lineage = lineage_rows(store, run_id, stages)
        events = store.events(run_id)
        cand_rows = {c["id"]: c for c in store.candidates(run_id)}
    finally:
        store.close()
    extended = max((e["id"] for e in events if e["kind"] == "extended"), default=-1)  # reopened since (resume --stages)
    stop = next((e["message"] for e in reversed(events) if e["kind"] == "finished" and e["id"] > extended), None)
    # what a reviewer must not miss: warnings, a stage that lowered the policy, a checkpoint not carried forward
    warnings = [e for e in events if e["kind"] in ("warning", "regression", "not_carried", "control_below",
                                                   "carried_arm", "fallback")]  # and a lineage step no promotion made
    came = {x["stage"]: x["outcome"] for x in exploit_stages(run_dir)}
    exploits = [{"stage": e["stage"], "message": e["message"] + (f" Outcome: {came[e['stage']]}." if e["stage"] in came
                                                                   else "")}
                for e in events if e["kind"] == "exploit"]  # stages that trained under the last promotion: why, what came
    diffs, evolved = {}, ""
    try:
        from sandbox.workspace import Workspace

        ws = Workspace(run_dir / "harness", read_only=True)
        for c in st["candidates"]:
            if c["commit"]:
                with contextlib.suppress(Exception):  # a candidate without a readable commit shows no diff
                    diffs[c["id"]] = ws.diff(c["id"])
        root = ws.repo.git.rev_list("--max-parents=0", "main").split()[0]
        evolved = ws.repo.git.diff(root, "main")
    except Exception:  # noqa: BLE001 - a harness repo that cannot be read: the page says so
        evolved = None
    return {"status": st, "curve": curve(run_dir), "evals": evals, "slice_order": slice_order(st["task"]),
            "training": dict(training), "findings": findings, "stop": stop, "warnings": warnings,
            "exploits": exploits, "diffs": diffs, "evolved": evolved, "rows": cand_rows, "lineage": lineage,
            "handover": handover(st, events)}


def lineage_rows(store: RunStore, run_id: str, stages: list[int]) -> list[dict[str, Any]]:
    """Each stage's reading of its decided checkpoint against the anchor (`stage.keep_training`; against the
    stage's start before it) and what followed, then the last stage's pick between lineage and anchor:
    {stage, what, chosen, against, change, se, n, outcome}."""
    from harness.results import Decided, FinalPicked

    rows = []
    for k in stages:
        d = store.result(run_id, k, Decided) if k else None
        c = d.carry_check if d is not None else None
        if c is not None:
            outcome = ("new anchor" if c.confirmed and c.against_anchor else "carried" if c.confirmed else
                       "lineage trains on, anchor stays" if c.kept else
                       "back to the anchor" if c.against_anchor else "back to the stage's start")
            rows.append({"stage": k, "what": "carry", "chosen": c.chosen, "against": c.start, "change": c.change,
                         "se": c.se, "n": c.n, "outcome": outcome})
        f = store.result(run_id, k, FinalPicked) if k else None
        if f is not None:
            rows.append({"stage": k, "what": "final pick", "chosen": f.check.chosen, "against": f.check.start,
                         "change": f.check.change, "se": f.check.se, "n": f.check.n,
                         "outcome": "delivers the lineage" if f.picked == f.check.chosen else "delivers the anchor"})
    return rows


def lineage_chart(rows: list[dict[str, Any]]) -> str | None:
    """Each reading's change against what it was compared with (points of greedy valid, +-1 se), coloured by what
    followed: the picture of a lineage that trains on while the anchor holds the best confirmed checkpoint."""
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 2.8))
    colour = {"new anchor": "#2a7", "carried": "#2a7", "lineage trains on, anchor stays": "#37c",
              "delivers the lineage": "#37c", "delivers the anchor": "#c73"}
    seen = set()
    for r in rows:
        x = r["stage"] + (0.3 if r["what"] == "final pick" else 0.0)
        col = colour.get(r["outcome"], "#c33")
        ax.errorbar([x], [100 * r["change"]], yerr=[100 * r["se"]], fmt="*" if r["what"] == "final pick" else "o",
                    color=col, capsize=3, label=None if r["outcome"] in seen else r["outcome"])
        seen.add(r["outcome"])
    ax.axhline(0, color="#999", lw=0.8)
    picked = any(r["what"] == "final pick" for r in rows)  # a run whose lineage was its anchor at the end has none
    ax.set_xlabel("stage (a star: the last stage's pick)" if picked else "stage")
    ax.set_ylabel("points vs anchor (+-1 se)")
    ks = sorted({r["stage"] for r in rows})
    ax.set_xticks(ks)
    ax.set_xlim(ks[0] - 0.6, ks[-1] + 0.9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _svg(fig, "lineage")


def lineage_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p class=note>no checkpoint was read against the anchor (nothing trained was chosen to continue)</p>"
    short = lambda p: E(Path(str(p)).name)
    body = "".join(f"<tr><td>{r['stage']}</td><td>{E(r['what'])}</td><td>{short(r['chosen'])}</td>"
                   f"<td>{short(r['against'])}</td><td>{100 * r['change']:+.1f} (se {100 * r['se']:.1f})</td>"
                   f"<td>{r['n']}</td><td>{E(r['outcome'])}</td></tr>" for r in rows)
    return ((lineage_chart(rows) or "") + "<table><tr><th>stage</th><th>reading</th><th>checkpoint</th>"
            "<th>against</th><th>change, points</th><th>n</th><th>what followed</th></tr>" + body + "</table>"
            "<p class=note>greedy valid on fresh backtest instances, paired. The lineage is what the next stage trains "
            "from; the anchor is the run's best confirmed checkpoint, what the held-out suite above scores "
            "(<code>stage.keep_training</code>)</p>")


# --- charts (matplotlib -> inline SVG) -------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "svg.hashsalt": "evotrainer"})
    return plt


def _svg(fig, label: str) -> str:
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return f'<figure class=chart data-chart="{E(label)}">{svg}</figure>'


def md_tables_html(md: str) -> str:
    """Markdown pipe tables (a header row, then rows) as HTML tables, other non-blank lines as paragraphs."""
    out, in_table, first = [], False, True
    for line in md.splitlines():
        if line.startswith("|---"):
            continue
        if line.startswith("|"):
            if not in_table:
                out.append("<table>")
                in_table, first = True, True
            tag = "th" if first else "td"
            out.append("<tr>" + "".join(f"<{tag}>{_inline(c.strip())}</{tag}>" for c in line.strip("|").split("|"))
                       + "</tr>")
            first = False
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    return "".join(out) + ("</table>" if in_table else "")


def _inline(text: str) -> str:
    """Escaped text with markdown's **bold** and `code` spans as HTML (a bench page's notes read as raw markdown)."""
    import re

    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", E(text))
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def plot_page(fig, png: Path, title: str, intro: str, md: str) -> str:
    """A benchmark's page: `fig` saved as `png` and inlined as SVG, under `title` and `intro`, above `md`'s tables."""
    fig.savefig(png, dpi=120, bbox_inches="tight")
    # the run report's CSS and viewport: the chart scales to the page (a fixed-width SVG hid its legend and last
    # bars past the page's edge; an outside review), margins at any width
    return ("<!doctype html><meta charset=utf-8><meta name=viewport content=\"width=device-width, initial-scale=1\">"
            "<title>evotrainer: " + E(title) + f"</title><style>{CSS}th{{background:#f3f3f3}}</style>"
            f"<h1>{E(title)}</h1>" + (f"<p>{_inline(intro)}</p>" if intro else "") + _svg(fig, png.stem)
            + md_tables_html(md))


def slice_order(task: str | None) -> tuple[str, ...]:
    """Overall ('') first, then the task's slice keys in the order its spec names them (overall only for a task this
    install does not know)."""
    return ("", *(get_task(task).spec.slice_keys if task in TASKS else ()))


def _slice_row_order(kv: tuple[str, str], order: tuple[str, ...]) -> tuple:
    """Summary rows: overall, the task's slice keys in their order, then other keys by name; values numerically where
    they are numbers (3 before 10), each key's rows together."""
    k, v = kv
    num = v.rstrip("+")
    return (order.index(k) if k in order else len(order), k, (0, int(num), v) if num.isdigit() else (1, 0, v))


HELDOUT_PANELS_A_ROW = 3


def heldout_chart(evals: list[dict], order: tuple[str, ...] = ("",)) -> str | None:
    """Valid rate on the test suite per stage: one panel per slice key (overall first, then `order`, then the other
    keys by name), one line per slice value."""
    by_key: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for e in evals:
        by_key[e["slice_key"]][e["slice_value"]][e["stage"]] = e["valid"]
    keys = [k for k in order if k in by_key] + sorted(k for k in by_key if k not in order)
    if not keys:
        return None
    plt = _plt()
    cols = min(HELDOUT_PANELS_A_ROW, len(keys))  # rows of three: six panels in one row shrank to unreadable text
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        placed: dict[int, list[float]] = defaultdict(list)  # labels already at each stage: a close one is skipped
        for val, pts in sorted(by_key[key].items()):
            xs = sorted(pts)
            ys = [100 * pts[x] for x in xs]
            ax.plot(xs, ys, marker="o", label=val or "all")
            for x, y in zip(xs, ys):
                if all(abs(y - other) >= 4 for other in placed[x]):
                    placed[x].append(y)
                    ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 4), ha="center",
                                fontsize=7)
        ax.set_title("overall" if key == "" else f"by {key}")
        ax.set_xlabel("stage (0 = warm start)")
        ax.set_ylabel("held-out valid (%)")
        ax.set_ylim(0, 105)
        ax.set_xticks(sorted({s for v in by_key[key].values() for s in v}))
        if key:
            ax.legend(fontsize=7, title=key, title_fontsize=7)
    fig.tight_layout()
    return _svg(fig, "heldout")


TRAIN_METRICS = (("reward_mean", "reward"), ("dead_group_share", "dead-group share"), ("kl", "KL"),
                 ("completion_length", "completion length (tokens)"))


def training_chart(stage: int, arms: dict[str, list[dict]]) -> str | None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(TRAIN_METRICS), figsize=(12, 2.6))
    drawn = False
    for ax, (key, label) in zip(axes, TRAIN_METRICS):
        here = False
        for arm, steps in arms.items():
            pts = [(s["step"], s[key]) for s in steps if s.get(key) is not None and s[key] == s[key]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None, label=arm)
                drawn = here = True
        if not here:  # e.g. KL with beta 0: say so instead of an empty frame
            ax.text(0.5, 0.5, "not recorded" + (" (beta = 0: no KL term)" if key == "kl" else ""),
                    ha="center", va="center", transform=ax.transAxes, color="#777")
            ax.set_xticks([])
            ax.set_yticks([])
        if here and key == "dead_group_share":  # a share: 0..1 (a constant 1.0 drew an axis of 0.95..1.05)
            ax.set_ylim(-0.03, 1.03)
        ax.set_title(label)
        ax.set_xlabel("GRPO step")
    if not drawn:
        plt.close(fig)
        return None
    axes[0].legend(fontsize=7)
    fig.suptitle(f"stage {stage}: training curves per arm", fontsize=9)
    fig.tight_layout()
    return _svg(fig, f"training-s{stage}")


def forest_chart(cid: str, ev: dict[str, Any], min_effect: float | None) -> str | None:
    rows = [("overall", ev["effect"], ev["ci_low"], ev["ci_high"], evidence_n(ev))]
    for sl, v in sorted((ev.get("by_slice") or {}).items()):
        if {"effect", "ci_low", "ci_high"} <= set(v):
            rows.append((sl, v["effect"], v["ci_low"], v["ci_high"], v.get("n")))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(rows) + 0.9))
    ys = list(range(len(rows)))[::-1]
    for y, (name, eff, lo, hi, n) in zip(ys, rows):
        color = "#2a7" if lo > 0 else ("#c33" if hi < 0 else "#555")
        ax.errorbar([100 * eff], [y], xerr=[[100 * (eff - lo)], [100 * (hi - eff)]], fmt="o", color=color,
                    capsize=3)
        ax.annotate(f"{100 * eff:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" + (f" n={int(n)}" if n else ""),
                    (100 * hi, y), textcoords="offset points", xytext=(6, -3), fontsize=7)
    ax.axvline(0, color="#999", lw=1)
    if min_effect:
        ax.axvline(100 * min_effect, color="#2a7", lw=1, ls="--", label=f"min effect +{100 * min_effect:.0f} points")
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.02), frameon=False)  # above: never on a bar
    ax.set_yticks(ys)
    ax.set_yticklabels([r[0] for r in rows])
    ax.set_xlabel("paired effect on backtest valid (points, candidate - control, 95% interval)")
    ax.set_title(f"{cid}: effect overall and per slice")
    fig.tight_layout()
    return _svg(fig, f"forest-{cid}")


# --- the page ---------------------------------------------------------------------------------------------------------


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _pts(x: Any) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def _summary(d: dict[str, Any], gate_min: float | None) -> str:
    st, cv = d["status"], d["curve"]
    first = {(e["slice_key"], e["slice_value"]): e for e in d["evals"] if e["stage"] == min(
        (x["stage"] for x in d["evals"]), default=0)}
    last_stage = max((x["stage"] for x in d["evals"]), default=None)
    last = {(e["slice_key"], e["slice_value"]): e for e in d["evals"] if e["stage"] == last_stage}
    rows = "".join(
        f"<tr><td>{E(k or 'overall')}</td><td>{E(v)}</td><td>{_pct(first[(k, v)]['valid'])}</td>"
        f"<td>{_pct(last.get((k, v), {}).get('valid'))}</td><td>{_pct(first[(k, v)]['optimal'])}</td>"
        f"<td>{_pct(last.get((k, v), {}).get('optimal'))}</td><td>{first[(k, v)]['n']}</td></tr>"
        for k, v in sorted(first, key=lambda kv: _slice_row_order(kv, d["slice_order"])))
    cands = st["candidates"]
    promoted = [c for c in cands if c["verdict"] == "promoted"]
    rejected = [c for c in cands if c["verdict"] == "rejected"]
    undecided = [c for c in cands if c["verdict"] == "inconclusive"]
    pending = [c for c in cands if (c["verdict"] or "").endswith("(pending: not applied yet)")]
    compute = st["compute"]
    # this machine's seconds (`RunStore.seconds_spent`: not the time spent on an engineer's endpoint, listed apart)
    secs = st.get("seconds_spent", sum((v.get("seconds") or 0) for v in compute.values()))
    comp = ", ".join(f"{k} {v.get('seconds') or 0:.0f} s" for k, v in compute.items())
    net = ""
    if cv:
        for name, label in (("warm_start_to_last", "warm start to last stage"),
                            ("first_to_last", "first stage to last stage")):
            if name in cv:
                x = cv[name]
                word = "above noise" if x["above_noise"] else ("below noise" if x["ci95"][1] < 0 else "within noise")
                net += (f"<li>held-out valid, {label}: <b>{_pts(x['effect'])} points</b> [{_pts(x['ci95'][0])}, "
                        f"{_pts(x['ci95'][1])}] (95% paired bootstrap on {cv['n']} suite instances): {word}</li>")
    stop = f" &middot; stop reason: {E(d['stop'])}" if d["stop"] else ""
    net = net or "<li>held-out change: fewer than two evaluated points</li>"
    names = E(", ".join(f"{c['id']} {c['factor']}" for c in promoted) or "none")
    fb = st.get("engineer_fallbacks") or []
    if fb:  # the engineer the run was configured with did not propose in these stages
        net += (f"<li><b>the {E(st['engineer'])} engineer did not propose in stages "
                f"{E(', '.join(str(x['stage']) for x in fb))}</b>; the rule engineer did"
                + "".join(f" &middot; stage {x['stage']}: {E(x['why'])}" for x in fb if x["why"]) + "</li>")
    return f"""<section id=summary><h2>Summary</h2><ul>
<li>status: <b>{E(st['status'])}</b>{stop}</li>
{net}
<li>candidates: {len(cands)} &middot; <b>{len(promoted)} promoted</b> ({names})
&middot; {len(rejected)} rejected &middot; {len(undecided)} inconclusive (evidence kept for a re-test)
{f"&middot; {len(pending)} judged, awaiting the decision" if pending else ""}
{f"&middot; {len(cands) - len(promoted) - len(rejected) - len(undecided) - len(pending)} not judged"
 if len(cands) - len(promoted) - len(rejected) - len(undecided) - len(pending) else ""}</li>
<li>compute: {secs:.0f} s on this machine ({E(comp) or 'none recorded'})</li>
{"".join(f"<li>{E(key)}: <b>{E(text)}</b></li>" for key, text in d.get("handover", []))}
{f"<li>where it went: {E(shares_line(st['shares']))}</li>" if st.get("shares") else ""}
<li>disk: {st['disk']['bytes'] / 1e6:.1f} MB ({st['disk']['checkpoints']} checkpoints,
{st['disk']['checkpoint_bytes'] / 1e6:.1f} MB; see the run config's retention)</li></ul>
<table><caption>held-out test suite: start (first evaluated stage) and end ({f"last stage {last_stage}" if last_stage is not None
 else "no stage evaluated yet"})</caption>
<tr><th>slice</th><th>value</th><th>valid start</th><th>valid end</th><th>optimal start</th><th>optimal end</th>
<th>n</th></tr>{rows}</table></section>"""


def _looks(c: dict[str, Any]) -> str:
    """Every look of a sequential decision: how much evidence it used, where it stopped and why."""
    looks = c.get("looks") or []
    if not looks:
        return ""
    pooled = f" (pooled with {', '.join(map(str, c.get('pooled') or []))})" if c.get("pooled") else ""
    rows = "".join(f"<tr><td>{i + 1}</td><td>{lk.get('n')}</td><td>{lk.get('pairs')}</td>"
                   f"<td>{_pts(lk.get('effect'))}</td><td>{_pts(lk.get('lo'))}</td><td>{_pts(lk.get('hi'))}</td>"
                   f"<td>{100 * (lk.get('info') or 0):.0f}%</td><td>{E(str(lk.get('decision')))}</td>"
                   f"<td>{E(str(lk.get('next_step')))}</td></tr>" for i, lk in enumerate(looks))
    return (f"<table class=looks><caption>looks{E(pooled)}</caption><tr><th>look</th><th>n</th><th>pairs</th>"
            f"<th>effect</th><th>lower</th><th>upper</th><th>information</th><th>decision</th><th>next</th></tr>"
            f"{rows}</table>")


def _decision(c: dict[str, Any], d: dict[str, Any], gate_min: float | None) -> str:
    row = d["rows"].get(c["id"], {})
    ev = row.get("evidence") or {}
    if not ev and c.get("effect") is not None and c.get("interval"):  # a gate verdict not applied yet (`_gate_pending`)
        ev = {"effect": c["effect"], "ci_low": c["interval"][0], "ci_high": c["interval"][1]}
    chart = forest_chart(c["id"], ev, gate_min) if {"effect", "ci_low", "ci_high"} <= set(ev) else None
    none = ("rejected before the backtest" if c["status"] == "rejected_vet" or c["verdict"] == "rejected" else
            "not judged: the run stopped, or is still running, before this candidate's decision"
            if c["verdict"] is None else "no arm-pair evidence (judged as a diagnostic, or before its arms trained)")
    fnd = d["findings"].get(c["stage"], [])
    flist = "".join(f"<li><code>{E(f['code'])}</code> {E(json.dumps(f.get('slice') or {}))} "
                    f"{E(f.get('severity') or '')} rate {f.get('rate') or 0:.2f}</li>" for f in fnd[:8])
    diff = d["diffs"].get(c["id"])
    return f"""<article class="decision {E(str(c['verdict'] or c['status']))}" id="{E(c['id'])}">
<h3>{E(c['id'])} &middot; stage {c['stage']} &middot; <code>{E(c['factor'])}</code>: {E(str(c['old_value']))} &rarr;
{E(str(c['value']))} &middot; <b>{E(str(c['verdict'] or c['status']))}</b></h3>
<p>effect {_pts(c['effect'])} points [{_pts((c['interval'] or [None, None])[0])},
{_pts((c['interval'] or [None, None])[1])}] &middot; minimum detectable effect {_pts(c['mde'])} &middot;
n {c['n'] or '-'} &middot; engineer {E(str(c['engineer']))} &middot; skill {E(str(c['skill'] or 'none'))}</p>
<p><b>reason:</b> {E(c['reason'] or '')}</p><p><b>rationale:</b> {E(c['rationale'] or '')}</p>
{_looks(c)}{chart or f'<p class=note>no backtest evidence ({none})</p>'}
<details><summary>findings of stage {c['stage']} ({len(fnd)}{', the first 8 shown' if len(fnd) > 8 else ''})</summary>
<ul>{flist}</ul></details>
<details><summary>diff</summary><pre class=diff>{E(diff) if diff else 'no commit (the change never applied)'}</pre>
</details></article>"""


CSS = """body{font:14px system-ui,sans-serif;margin:2em auto;max-width:1250px;padding:0 1em;color:#222;overflow-wrap:anywhere}
h1{margin-bottom:.2em}table{border-collapse:collapse;margin:.6em 0}caption{text-align:left;color:#555}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
.partial{background:#fff3cd;border:1px solid #e0c060;padding:.6em 1em}figure.chart{margin:.5em 0;overflow-x:auto}
figure.chart svg{max-width:100%;height:auto}article.decision{border-left:4px solid #999;padding:.2em 1em;margin:1em 0}
article.promoted{border-color:#2a7}article.rejected{border-color:#c33}pre.diff{background:#f6f6f6;padding:.6em;
overflow-x:auto;font-size:12px}.note{color:#777}nav a{margin-right:1em}"""


def build(run_dir: Path) -> str:
    d = gather(run_dir)
    st = d["status"]
    try:
        gate_min = load_config(run_dir / "config.yaml").gate.min_effect
    except Exception:  # noqa: BLE001 - a run dir without a readable config still renders
        gate_min = None
    what = {"running": "still going: run <code>evotrainer report</code> again later",
            "paused": "waiting at the human gate: answer with <code>evotrainer approve|revise|abort</code>",
            "interrupted": "stopped before its end: <code>evotrainer resume</code> continues it"}
    partial = "" if st["status"] == "finished" else (
        f"<p class=partial>Partial report: the run is <b>{E(st['status'])}</b> "
        f"({what.get(st['status'], 'not finished: <code>evotrainer resume</code> continues it')}); this page renders "
        "what exists so far.</p>")
    heldout = heldout_chart(d["evals"], d["slice_order"]) or "<p class=note>no held-out evaluation yet</p>"
    training = "".join(training_chart(k, arms) or "" for k, arms in sorted(d["training"].items())) or \
        "<p class=note>no training steps recorded yet</p>"
    decisions = "".join(_decision(c, d, gate_min) for c in sorted(st["candidates"],
                                                                  key=lambda c: (c["stage"], c["id"])))
    decisions = decisions or "<p class=note>none yet</p>"
    if d.get("exploits"):  # an exploit stage proposes nothing: say why it has no decision
        decisions = "<ul class=exploits>" + "".join(f"<li>stage {x['stage']}: {E(x['message'])}</li>"
                                                    for x in d["exploits"]) + "</ul>" + decisions
    skills = defaultdict(list)
    for c in st["candidates"]:
        if c["skill"]:
            skills[c["skill"]].append(f"{c['id']}: {c['verdict'] or c['status']}")
    skill_rows = "".join(f"<tr><td>{E(s)}</td><td>{E(', '.join(v))}</td></tr>" for s, v in sorted(skills.items()))
    warn = "".join(f"<li>stage {w['stage']}: {E(w['message'])}</li>" for w in d["warnings"])
    evolved = d["evolved"]
    warnings = f"<section id=warnings><h2>Warnings</h2><ul>{warn}</ul></section>" if warn else ""
    skills_html = ("<table><tr><th>skill</th><th>candidates and verdicts</th></tr>" + skill_rows + "</table>"
                   "<p class=note>the remember step records each verdict as evidence in the skill library "
                   "(<code>evotrainer skills show NAME</code>)</p>") if skill_rows else \
        "<p class=note>no skill was used</p>"
    evolved_html = (f"<pre class=diff>{E(evolved)}</pre>" if evolved else
                    "<p class=note>main is still the round-0 harness: nothing was promoted</p>" if evolved == "" else
                    "<p class=note>the harness repo could not be read</p>")
    return f"""<!doctype html><html lang=en><meta charset=utf-8>
<meta name=viewport content="width=device-width, initial-scale=1"><title>evotrainer run {E(st['run'])}</title>
<style>{CSS}</style><body>
<h1>Run {E(st['run'])}</h1><p>folder <code>{E(str(Path(run_dir).resolve()))}</code> &middot; task {E(str(st['task']))}
&middot; harness repo <code>{E(str(Path(st['harness']).resolve()))}</code>
(<code>git log --all --decorate</code>) &middot; created {E(str(st['created']))}</p>
<nav><a href=#summary>summary</a><a href=#heldout>held-out</a><a href=#training>training</a>
<a href=#decisions>decisions</a><a href=#lineage>lineage</a><a href=#evolved>evolved harness</a><a href=#skills>skills</a></nav>
{partial}{_summary(d, gate_min)}
{warnings}
<section id=heldout><h2>Held-out valid per stage and slice (test suite)</h2>{heldout}
<pre>{E(curve_text(d['curve']))}</pre></section>
<section id=training><h2>Training curves per stage and arm</h2>{training}</section>
<section id=decisions><h2>Decisions ({len(st['candidates'])})</h2>{decisions}</section>
<section id=lineage><h2>Lineage and anchor</h2>{lineage_html(d.get('lineage') or [])}</section>
<section id=evolved><h2>The evolved harness against round 0</h2>{evolved_html}</section>
<section id=skills><h2>Skills used</h2>{skills_html}</section>
</body></html>
"""


def write_html(run_dir: Path) -> Path:
    """runs/<id>/report.html: the morning review, self-contained and offline (written whole, then moved in place)."""
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(build(run_dir), encoding="utf-8")
    tmp.replace(out)
    return out
