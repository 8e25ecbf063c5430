"""The run report in a real browser: a tiny real run, its report.html opened in headless Chromium (Debian's
`chromium`; `.ci/run` installs it).

    .venv/bin/pytest tests/test_report.py -q

Checks: every section is there with real data; nothing is fetched (the page is self-contained and works offline); no
console errors; every chart is laid out with data (its SVG paths have a non-empty bounding box in the browser); a
report of an unfinished run says it is partial. The screenshot is saved as report.png next to the report (and to
$EVOTRAINER_REPORT_SCREENSHOT when set) for a person to look at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from harness.benchmarks.run import TINY
from harness.config import parse_config
from harness.lifecycle import start_run
from harness.report import status
from harness.report_page import write_html
from harness.store import RunStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")

# Appended to a COPY of the report (the report itself has no script): measures each chart in the laid-out page,
# records console errors and any resource the page fetched, and writes the result into the DOM for --dump-dom.
PROBE = """<script>
const errors = [];
const orig = console.error;
console.error = (...a) => { errors.push(a.join(' ')); orig(...a); };
window.addEventListener('error', e => errors.push(String(e.message)));
window.addEventListener('load', () => {
  const charts = [...document.querySelectorAll('figure.chart')].map(f => {
    const svg = f.querySelector('svg');
    const paths = svg ? [...svg.querySelectorAll('path')] : [];
    const drawn = paths.filter(p => { const b = p.getBBox(); return b.width > 0 || b.height > 0; });
    const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    return {label: f.dataset.chart, width: r.width, height: r.height, paths: paths.length, drawn: drawn.length,
            texts: svg ? svg.querySelectorAll('text').length : 0};
  });
  const fetched = performance.getEntriesByType('resource').map(e => e.name);
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify({charts, errors, fetched});
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-extensions", "--virtual-time-budget=5000", *args],
                          check=False, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVOTRAINER_HOME", str(tmp / "home"))
        cfg = parse_config(dict(TINY, name="r", budget={"stages": 2},  # 24 tokens: the untrained policy rambles
                                recipe={**TINY["recipe"], "max_completion_length": 24}), "test")
        yield start_run(cfg, tmp / "runs", run_id="rep")


def test_report_sections_hold_real_data(run_dir):
    page = write_html(run_dir).read_text()
    for section in ("summary", "heldout", "training", "decisions", "lineage", "evolved", "skills"):
        assert f"<section id={section}>" in page, section
    store = RunStore.open(run_dir / "run.db")
    cands = store.candidates("rep")
    store.close()
    assert cands and all(f'id="{c["id"]}"' in page for c in cands)  # every decision has its article
    assert 'data-chart="heldout"' in page and 'data-chart="training-s1"' in page
    assert any(f'data-chart="forest-{c["id"]}"' in page for c in cands if c["evidence"])
    assert "diff --git" in page  # candidate diffs (and the evolved harness, when something was promoted)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the report must not fetch anything"
    assert "<script" not in page
    shares = status(run_dir)["shares"]  # where the compute went, on a real run's records
    assert shares["lineage"] is not None and shares["lineage"] + shares["other_training"] == shares["steps"] > 0
    assert (shares["lineage"] == 0) == shares["delivered"].endswith("warmstart")
    assert sum(shares["judging"].values()) > 0 and "where it went: " in page
    # what the run hands over, on the page as in `status` (an outside review, seventy-ninth session: the page said
    # neither which checkpoint it delivered nor that a flat curve was the warm start scored again)
    summary = page.split("<section id=summary>", 1)[1].split("</section>", 1)[0]
    assert "<li>delivered: <b>" in summary and "s on this machine (" in summary


def test_an_llm_engineers_tokens_and_wait_are_shown_apart_from_this_machines_compute(run_dir, tmp_path):
    """The engineer's ledger rows (kind engineer) are named in `status`'s compute line and the page's, and its
    endpoint's wait is not added into this machine's seconds. Would catch the tokens shown nowhere but --json, and
    900 s of another machine's wait counted as this run's compute (an outside review, seventy-ninth session)."""
    from harness.report import print_summary

    copy = tmp_path / "rep"
    shutil.copytree(run_dir, copy)
    store = RunStore.open(copy / "run.db")
    mine = store.seconds_spent("rep")
    store.charge("rep", 1, "engineer", "engineer", seconds=900.0, tokens=135_000, label="endpoint propose")
    store.close()
    st = status(copy)
    assert st["seconds_spent"] == pytest.approx(mine) and st["shares"]["engineer_tokens"] == 135_000
    page = write_html(copy).read_text()
    assert f"{mine:.0f} s on this machine (" in page and "read and wrote 135,000 tokens in 900 s" in page
    import io

    from rich.console import Console

    buf = io.StringIO()
    print_summary(copy, Console(file=buf, width=400))
    assert "read and wrote 135,000 tokens in 900 s" in buf.getvalue()


@needs_browser
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    report = write_html(run_dir)
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium("--dump-dom", probe_page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.DOTALL)
    assert m, dom.stdout[-2000:]
    probe = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                       .replace("&gt;", ">"))
    assert probe["errors"] == [] and probe["fetched"] == []
    charts = probe["charts"]
    assert {"heldout", "training-s1", "training-s2"} <= {c["label"] for c in charts}, charts
    for c in charts:  # laid out, with drawn data and labelled axes
        assert c["width"] > 100 and c["height"] > 50 and c["drawn"] >= 3 and c["texts"] >= 4, c
    shot = report.with_name("report.png")
    res = _chromium(f"--screenshot={shot}", "--window-size=1300,3000", report.as_uri())
    assert res.returncode == 0 and shot.stat().st_size > 20_000, res.stderr[-1000:]
    if os.environ.get("EVOTRAINER_REPORT_SCREENSHOT"):
        shutil.copy(shot, os.environ["EVOTRAINER_REPORT_SCREENSHOT"])


def test_a_report_of_an_unfinished_run_says_it_is_partial(run_dir, tmp_path):
    copy = tmp_path / "rep"
    shutil.copytree(run_dir, copy)
    store = RunStore.open(copy / "run.db")
    store.set_run_status("rep", "interrupted")
    store.close()
    page = write_html(copy).read_text()
    assert "Partial report" in page and "interrupted" in page
    assert "<section id=decisions>" in page  # what exists still renders


def test_the_lineage_section_shows_each_reading_against_the_anchor_and_the_final_pick(tmp_path):
    """The page's "Lineage and anchor" section: one row per stage that read its decided checkpoint against the
    anchor, with what followed (a new anchor, a lineage that trains on, back to the anchor), and the last stage's
    pick; a chart of the readings. Could catch: a kept lineage shown as carried nothing (or as a new anchor), a
    final pick missing from the review, readings on the wrong stage."""
    from harness.report_page import lineage_html, lineage_rows
    from harness.results import CarryChecked, Decided, FinalPicked

    store = RunStore.open(tmp_path / "run.db")
    store.create_run("r", {})

    def check(chosen, change, **kw):
        return CarryChecked(chosen=chosen, start="runs/r/checkpoints/anchor", n=288, chosen_valid=0.3 + change,
                            start_valid=0.3, change=change, se=0.02, against_anchor=True, **kw)

    store.save_result("r", 1, Decided(next_policy="c/s1", anchor="c/s1", carry_check=check("c/s1", 0.05,
                                                                                         confirmed=True)))
    store.save_result("r", 2, Decided(next_policy="c/s2", anchor="c/s1", carry_check=check("c/s2", -0.01,
                                                                                         confirmed=False, kept=True)))
    store.save_result("r", 3, Decided(next_policy="c/s1", anchor="c/s1", carry_check=check("c/s3", -0.06,
                                                                                         confirmed=False)))
    store.save_result("r", 3, FinalPicked(picked="c/s3", check=check("c/s3", 0.0, confirmed=False)))
    rows = lineage_rows(store, "r", [0, 1, 2, 3])
    store.close()
    assert [(r["stage"], r["what"], r["outcome"]) for r in rows] == [
        (1, "carry", "new anchor"), (2, "carry", "lineage trains on, anchor stays"), (3, "carry", "back to the anchor"),
        (3, "final pick", "delivers the lineage")]
    page = lineage_html(rows)
    assert 'data-chart="lineage"' in page and "<td>+5.0 (se 2.0)</td>" in page and "<td>anchor</td>" in page
    assert lineage_html([]).startswith("<p class=note>no checkpoint was read")


def test_the_page_shows_reordering_and_control_characters_as_escapes():
    """U+202E before "exe.live" renders as "evil.exe" in a browser; html.escape leaves it alone. Would catch: the
    page escaping markup only."""
    from harness.report_page import E

    out = E('<b>\u202eexe.live\u202c \x1b[2J "q"')
    assert out == "&lt;b&gt;\\u202eexe.live\\u202c \\x1b[2J &quot;q&quot;"


def test_a_checkpoint_not_carried_is_among_the_pages_warnings(run_dir, tmp_path):
    """A stage whose control arm read below its start and was not carried (or was left to the carry reading) is what
    a reviewer must see first, with the warnings. Would catch: those events shown only in `status`."""
    copy = tmp_path / "rep"
    shutil.copytree(run_dir, copy)
    store = RunStore.open(copy / "run.db")
    store.add_event("rep", "not_carried", "the control arm's estimate on the target is below the stage's start",
                    stage=2, node="backtest")
    store.add_event("rep", "control_below", "the control arm's greedy estimate is below the stage's start",
                    stage=1, node="backtest")
    store.close()
    page = write_html(copy).read_text()
    warn = page.split("<section id=warnings>", 1)[1].split("</section>", 1)[0]
    assert "stage 2: the control arm&#x27;s estimate on the target is below" in warn
    assert "stage 1: the control arm&#x27;s greedy estimate" in warn


def test_the_lineage_chart_names_a_star_only_where_it_draws_one():
    """The caption said "a star: the last stage's pick" on a run whose lineage was its anchor at the end (no final
    pick, no star drawn; a fresh user's walkthrough looked for it). Would catch: the caption unconditional again."""
    from harness.report_page import lineage_chart

    carry = {"stage": 1, "what": "carry", "chosen": "a", "against": "b", "change": 0.01, "se": 0.01, "n": 96,
             "outcome": "carried"}
    pick = {**carry, "what": "final pick", "outcome": "delivers the lineage"}
    assert "a star" not in lineage_chart([carry]) and "a star" in lineage_chart([carry, pick])
