"""The harness workspace on a real git repo in a temp dir, with HOME empty and no global or system git config.

    .venv/bin/pytest tests/test_workspace.py -q
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import git
import pytest
import yaml

from sandbox.runner import run_function
from sandbox.workspace import (
    AlreadyDecided,
    CandidateConflict,
    MergeConflict,
    NotAHarnessRepo,
    UnknownCandidate,
    Workspace,
    WorkspaceDamaged,
    WorkspaceError,
)

EV = {"effect": 0.12, "ci_low": 0.04, "ci_high": 0.2, "n": 64}


@pytest.fixture(autouse=True)
def no_git_identity(tmp_path, monkeypatch):
    home = tmp_path / "emptyhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)


def sh(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def fsck_clean(repo: Path) -> bool:
    p = subprocess.run(["git", "fsck", "--strict", "--no-dangling"], check=False, cwd=repo, capture_output=True,
                       text=True)
    return p.returncode == 0 and "error" not in p.stderr + p.stdout and "missing" not in p.stdout


def temp_change(ws: Workspace, value: str) -> dict[str, str]:
    return {"recipe.yaml": ws.read("recipe.yaml").replace("temperature: 1.0", f"temperature: {value}")}


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """MAPF's round-0 harness: the template and the family's env.yaml, as a new run writes it."""
    from harness.tasks import get_task

    return Workspace.create(tmp_path / "harness", files_override={"env.yaml": get_task("mapf").spec.round0_env})


# --- creation and reading ----------------------------------------------------------------------------------------


def test_create_from_template(ws):
    files = ws.files()
    assert set(files) == {"README.md", "env.yaml", "recipe.yaml", "diagnostics/failure_mix.py"}
    env = yaml.safe_load(files["env.yaml"])
    assert [s["size"] for s in env["sizes"]] == [3, 4, 5] and all(s["agents"] == 2 for s in env["sizes"])
    assert env["min_distance"] == 1
    recipe = yaml.safe_load(files["recipe.yaml"])
    assert recipe["reward"] == {} and {"learning_rate", "beta", "num_generations", "temperature"} <= set(recipe)
    head = ws.repo.head.commit
    assert (head.author.name, head.author.email) == ("evotrainer", "evotrainer@localhost")
    assert ws.read("env.yaml") == (ws.path / "env.yaml").read_text()
    assert ws.repairs == [] and not ws.repo.is_dirty(untracked_files=True)


def test_template_diagnostic_runs(ws):
    rollouts = [{"valid": False, "failure": "hole", "reward": 0.0, "slices": {}}] * 3 + [
        {"valid": True, "failure": None, "reward": 1.0, "slices": {}}]
    r = run_function(ws.read("diagnostics/failure_mix.py"), "diagnose", args=[rollouts], require_bwrap=True)
    assert r.status == "ok", r.error
    out = r.value
    assert out["metrics"]["failure_rate"] == 0.75
    assert out["findings"][0]["code"] == "dominant_failure" and out["findings"][0]["count"] == 3


def test_create_with_override_and_bad_targets(tmp_path):
    ws = Workspace.create(tmp_path / "h", files_override={"env.yaml": "levels: [1, 2]\n",
                                                          "diagnostics/failure_mix.py": None})
    assert ws.read("env.yaml") == "levels: [1, 2]\n" and "diagnostics/failure_mix.py" not in ws.files()
    with pytest.raises(WorkspaceError, match="not empty"):
        Workspace.create(tmp_path / "h")
    with pytest.raises(ValueError, match="relative POSIX path"):
        Workspace.create(tmp_path / "h2", files_override={"../evil": "x"})


def test_not_a_harness_repo(tmp_path):
    with pytest.raises(NotAHarnessRepo, match="no .git"):
        Workspace(tmp_path / "missing")
    git.Repo.init(tmp_path / "plain")
    with pytest.raises(NotAHarnessRepo, match="not a harness repo"):
        Workspace(tmp_path / "plain")


def test_checkout_tree_and_unknown_ref(ws, tmp_path):
    dest = ws.checkout_tree("main", tmp_path / "arm")
    assert (dest / "diagnostics" / "failure_mix.py").read_text() == ws.read("diagnostics/failure_mix.py")
    with pytest.raises(WorkspaceError, match="not empty"):
        ws.checkout_tree("main", dest)
    with pytest.raises(WorkspaceError, match="unknown ref"):
        ws.files("no-such-ref")
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        ws.read("nope.yaml")


# --- candidates --------------------------------------------------------------------------------------------------


def test_propose_commit_has_trailers_and_leaves_main_alone(ws):
    main_before = ws.head()
    sha = ws.propose("s1-c1", temp_change(ws, "0.7"), "Lower temperature to 0.7",
                     "Rollouts are too random.", "recipe.temperature", stage=1, skill="cool-down", engineer="llm")
    c = ws.repo.commit(sha)
    assert c.summary == "Lower temperature to 0.7" and c.parents[0].hexsha == main_before
    for line in ("Factor: recipe.temperature", "Candidate: s1-c1", "Stage: 1", f"Parent: {main_before}",
                 "Skill: cool-down", "Engineer: llm"):
        assert line in c.message
    assert "Rollouts are too random." in c.message
    assert ws.head() == main_before and "temperature: 1.0" in (ws.path / "recipe.yaml").read_text()
    assert "temperature: 0.7" in ws.files(sha)["recipe.yaml"] and ws.pending() == ["s1-c1"]
    assert "+temperature: 0.7" in ws.diff("s1-c1")
    assert ws.repo.active_branch.name == "main"


def test_propose_is_idempotent_and_detects_conflicts(ws):
    a = ws.propose("c1", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    assert ws.propose("c1", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1) == a
    with pytest.raises(CandidateConflict, match="different content"):
        ws.propose("c1", temp_change(ws, "0.5"), "s", "r", "recipe.temperature", 1)
    ws.reject("c1", "no effect")
    assert ws.propose("c1", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1) == a  # decided, same content


def test_propose_deletes_and_adds_files(ws):
    sha = ws.propose("d1", {"diagnostics/failure_mix.py": None, "diagnostics/new.py": "def diagnose(r):\n  return {}\n"},
                     "Replace the example diagnostic", "r", "diagnostics/new.py", 2)
    assert set(ws.files(sha)) == {"README.md", "env.yaml", "recipe.yaml", "diagnostics/new.py"}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cand_id": "bad id"}, "candidate id"),
    ({"cand_id": "../x"}, "candidate id"),
    ({"files": {}}, "files is empty"),
    ({"files": {"/etc/x": "y"}}, "relative POSIX path"),
    ({"files": {".git/config": "y"}}, "relative POSIX path"),
    ({"summary": "two\nlines"}, "one non-empty line"),
    ({"rationale": "  "}, "rationale"),
    ({"stage": -1}, "stage"),
    ({"files": None}, "changes nothing"),
])
def test_propose_bad_inputs(ws, kwargs, match):
    args = {"cand_id": "c1", "files": temp_change(ws, "0.7"), "summary": "s", "rationale": "r",
            "factor": "recipe.temperature", "stage": 1}
    if kwargs.get("files", 0) is None:
        kwargs = {"files": {"env.yaml": ws.read("env.yaml")}}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ws.propose(**args)


# --- verdicts ----------------------------------------------------------------------------------------------------


def test_promote_and_reject_record_evidence(ws):
    ws.propose("s1-c1", temp_change(ws, "0.7"), "Lower temperature", "r1", "recipe.temperature", 1)
    ws.propose("s1-c2", {"env.yaml": ws.read("env.yaml").replace("min_distance: 1", "min_distance: 2")},
               "Raise min distance", "r2", "env.min_distance", 1)
    d = ws.promote("s1-c1", EV, "LCB above the minimum effect")
    assert d.tag == "promoted/1-s1-c1" and ws.head() == d.sha
    merge = ws.repo.commit(d.sha)
    assert len(merge.parents) == 2 and merge.parents[1].hexsha == d.candidate_sha
    assert "Verdict: promoted" in merge.message and "Effect: +0.1200 (CI +0.0400..+0.2000), n=64" in merge.message
    assert "temperature: 0.7" in ws.read("recipe.yaml") and "temperature: 0.7" in (ws.path / "recipe.yaml").read_text()
    assert ws.promote("s1-c1", {"effect": 9}, "again") == d  # no-op, same result
    r = ws.reject("s1-c2", "slice size=5 regressed", {"effect": -0.1, "ci": [-0.2, 0.0], "n": 64})
    assert r.tag == "rejected/s1-c2" and ws.pending() == [] and ws.reject("s1-c2", "again") == r
    assert "min_distance: 1" in ws.read("env.yaml")
    tags = sh(ws.path, "tag", "-n20")
    assert "Reason: slice size=5 regressed" in tags and "Reason: LCB above the minimum effect" in tags
    log = sh(ws.path, "log", "--all", "--oneline")
    assert "Raise min distance" in log and "Promote s1-c1" in log
    with pytest.raises(AlreadyDecided, match="rejected"):
        ws.promote("s1-c2", EV, "x")
    with pytest.raises(AlreadyDecided, match="promoted"):
        ws.reject("s1-c1", "x")
    with pytest.raises(UnknownCandidate, match="cand/nope"):
        ws.promote("nope", EV, "x")
    with pytest.raises(UnknownCandidate, match="no candidate 'nope'"):
        ws.diff("nope")
    assert fsck_clean(ws.path)


def test_verdict_inputs(ws):
    ws.propose("a", temp_change(ws, "0.7"), "a", "r", "recipe.temperature", 1)
    with pytest.raises(ValueError, match="non-empty reason"):
        ws.reject("a", "  \n ")
    with pytest.raises(TypeError, match="mapping or a pydantic model"):
        ws.reject("a", "x", evidence=[1, 2])
    d = ws.reject("a", "slice size=5\nregressed", {"effect": None, "ci_low": None, "n": None})
    assert d.reason == "slice size=5 regressed" and ws.history()[0].reason == "slice size=5 regressed"


def test_promote_accepts_the_loops_evidence_model(ws):
    from harness.records import Evidence

    ws.propose("e", temp_change(ws, "0.7"), "e", "r", "recipe.temperature", 1)
    ev = Evidence(n=64, control=0.5, candidate=0.62, effect=0.12, ci_low=0.04, ci_high=0.2, seeds=(10, 73))
    d = ws.promote("e", ev, "LCB above minimum")
    assert d.evidence["seeds"] == [10, 73] and "Effect: +0.1200 (CI +0.0400..+0.2000), n=64" in \
        ws.repo.commit(d.sha).message


def test_history_in_order_with_verdicts(ws):
    ws.propose("s1-a", temp_change(ws, "0.7"), "Lower temperature", "because", "recipe.temperature", 1)
    won = ws.promote("s1-a", EV, "won")
    ws.propose("s1-b", {"recipe.yaml": ws.read("recipe.yaml").replace("steps: 50", "steps: 80")}, "More steps",
               "undertrained", "recipe.steps", 1, skill="more-steps")
    ws.reject("s1-b", "no effect", {"effect": 0.0, "ci_low": -0.05, "ci_high": 0.05, "n": 32})
    ws.propose("s2-a", {"recipe.yaml": ws.read("recipe.yaml").replace("beta: 0.0", "beta: 0.04")}, "Add KL",
               "drift", "recipe.beta", 2)
    h = ws.history()
    assert [(r.id, r.stage, r.verdict) for r in h] == [("s1-a", 1, "promoted"), ("s1-b", 1, "rejected"),
                                                       ("s2-a", 2, "pending")]
    assert h[0].evidence == EV and h[0].merge == won.sha and h[0].sha == won.candidate_sha
    assert h[1].reason == "no effect" and h[1].skill == "more-steps" and h[1].factor == "recipe.steps"
    assert h[1].rationale == "undertrained" and h[1].tag == "rejected/s1-b"
    assert h[2].tag is None and h[2].parent == ws.head()
    assert "+steps: 80" in ws.diff("s1-b")


def test_merge_conflict_is_typed_and_leaves_main_clean(ws):
    ws.propose("a", temp_change(ws, "0.7"), "a", "r", "recipe.temperature", 1)
    ws.propose("b", temp_change(ws, "0.5"), "b", "r", "recipe.temperature", 1)
    ws.promote("a", EV, "won")
    head = ws.head()
    with pytest.raises(MergeConflict, match="reject it"):
        ws.promote("b", EV, "won too")
    assert ws.head() == head and not ws.repo.is_dirty(untracked_files=True) and ws.pending() == ["b"]


# --- crash repair ------------------------------------------------------------------------------------------------


def test_repairs_stale_lock_dirty_tree_and_half_made_branch(ws):
    (ws.path / ".git" / "index.lock").write_text("")
    (ws.path / "env.yaml").write_text("half written")
    (ws.path / "stray.txt").write_text("untracked")
    sh(ws.path, "branch", "cand/half", "main")
    ws2 = Workspace(ws.path)
    text = "\n".join(ws2.repairs)
    assert "index.lock" in text and "recovered/" in text and "cand/half" in text
    assert not (ws.path / ".git" / "index.lock").exists() and not ws2.repo.is_dirty(untracked_files=True)
    saved = next(h for h in ws2.repo.heads if h.name.startswith("recovered/"))
    assert ws2.read("env.yaml", saved.name) == "half written" and ws2.read("stray.txt", saved.name) == "untracked"
    assert ws2.pending() == [] and "min_distance" in (ws.path / "env.yaml").read_text()
    ws2.propose("c1", temp_change(ws2, "0.7"), "s", "r", "recipe.temperature", 1)  # usable again
    assert Workspace(ws.path).repairs == [] and fsck_clean(ws.path)


def test_repairs_interrupted_decisions(ws):
    ws.propose("p", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    cand = ws.propose("q", {"recipe.yaml": ws.read("recipe.yaml").replace("steps: 50", "steps: 9")}, "s", "r",
                      "recipe.steps", 1)
    d = ws.promote("p", EV, "won")
    # crash after the merge, before the tag and the branch deletion
    sh(ws.path, "tag", "-d", d.tag)
    sh(ws.path, "branch", "cand/p", d.candidate_sha)
    # crash after the reject tag, before the branch deletion
    sh(ws.path, "tag", "-a", "rejected/q", cand, "-m", "Rejected q\n\nVerdict: rejected\nReason: lost\nEvidence: {}")
    ws2 = Workspace(ws.path)
    assert any("untagged promotion of p" in r for r in ws2.repairs)
    assert any("cand/q" in r and "rejected" in r for r in ws2.repairs)
    assert ws2.pending() == [] and ws2.promote("p", EV, "x").tag == "promoted/1-p"
    assert [(r.id, r.verdict, r.reason) for r in ws2.history()] == [("p", "promoted", "won"), ("q", "rejected", "lost")]
    assert fsck_clean(ws.path)


def test_repairs_interrupted_merge(ws):
    ws.propose("m", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    sh(ws.path, "merge", "--no-ff", "--no-commit", "cand/m")
    ws2 = Workspace(ws.path)
    assert "aborted an interrupted merge" in ws2.repairs
    assert ws2.pending() == ["m"] and "temperature: 1.0" in ws2.read("recipe.yaml")
    assert ws2.promote("m", EV, "won").verdict == "promoted"


def test_damage_that_cannot_be_repaired_is_named(ws):
    sha = ws.propose("x", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    sh(ws.path, "tag", "-a", "rejected/x", sha, "-m", "Rejected x\n\nVerdict: rejected\nReason: r")
    other = ws.propose("y", temp_change(ws, "0.3"), "s", "r", "recipe.temperature", 1)
    sh(ws.path, "update-ref", "refs/heads/cand/x", other)
    with pytest.raises(WorkspaceDamaged, match="cand/x"):
        Workspace(ws.path)


def _snapshot(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()}


def test_a_reader_between_a_promotions_merge_and_its_tag_changes_nothing(ws):
    """Catches: report/review opening the repo with the crash repair while the run promotes: the reader would tag the
    merge itself, and the run's own promote then fails on the existing tag. A read-only open never repairs; writing
    through it is refused; the writer's repair still tags the merge."""
    ws.propose("p", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    d = ws.promote("p", EV, "won")
    sh(ws.path, "tag", "-d", d.tag)  # the live state between the merge and the tag
    sh(ws.path, "branch", "cand/p", d.candidate_sha)
    before = _snapshot(ws.path)  # HEAD, refs, index, objects, worktree
    reader = Workspace(ws.path, read_only=True)
    assert reader.repairs == [] and reader.pending() == ["p"]
    assert [(r.id, r.verdict) for r in reader.history()] == [("p", "pending")] and "0.7" in reader.diff("p")
    for write in (lambda: reader.promote("p", EV, "x"), lambda: reader.reject("p", "x"), reader.repair,
                  lambda: reader.propose("q", temp_change(ws, "0.3"), "s", "r", "recipe.temperature", 1)):
        with pytest.raises(WorkspaceError, match="read-only"):
            write()
    assert _snapshot(ws.path) == before
    writer = Workspace(ws.path)
    assert any("untagged promotion of p" in r for r in writer.repairs) and writer.pending() == []


def test_a_rationale_line_that_looks_like_a_trailer_names_no_tag(ws):
    """An engineer's free text ("Stage: early collapse", "Stage: 7", "Factor: ...") is not a trailer: before, the first
    match in the whole message won, so the promotion merged and then failed to create the tag
    `promoted/early collapse-<id>` (the stage crashed, and every reopen failed again repairing it), or tagged a stage-1
    candidate `promoted/7-<id>`."""
    for cid, line in (("s1-c1", "Stage: early collapse"), ("s1-c2", "Stage: 7\nFactor: recipe.beta")):
        ws.propose(cid, temp_change(ws, "0.7") if cid == "s1-c1" else
                   {"recipe.yaml": ws.read("recipe.yaml").replace("temperature: 0.7", "temperature: 0.6")},
                   "Lower temperature", f"Finding: grpo.dead_groups\n{line}\nHotter sampling.", "recipe.temperature", 1)
        assert ws.promote(cid, EV, "won").tag == f"promoted/1-{cid}"
    assert [(r.id, r.stage, r.factor, r.tag) for r in ws.history()] == [
        ("s1-c1", 1, "recipe.temperature", "promoted/1-s1-c1"), ("s1-c2", 1, "recipe.temperature", "promoted/1-s1-c2")]
    assert Workspace(ws.path).repairs == [] and fsck_clean(ws.path)


def test_a_damaged_stage_trailer_is_refused_before_the_merge(ws):
    cand = ws.propose("s1-c1", temp_change(ws, "0.7"), "Lower temperature", "r", "recipe.temperature", 1)
    msg = ws.repo.commit(cand).message.replace("Stage: 1", "Stage: one")
    forged = sh(ws.path, "commit-tree", ws.repo.commit(cand).tree.hexsha, "-p", ws.head(), "-m", msg).strip()
    sh(ws.path, "update-ref", "refs/heads/cand/s1-c1", forged)
    head = ws.head()
    with pytest.raises(WorkspaceDamaged, match="Stage trailer 'one'"):
        ws.promote("s1-c1", EV, "won")
    assert ws.head() == head and ws.pending() == ["s1-c1"]  # nothing merged: never half-promoted


def test_a_repo_an_older_version_wrote_with_a_non_numeric_stage_still_reopens(ws):
    """Before this version, a rationale line `Stage: v2` was copied into the merge and tagged `promoted/v2-<id>`; a
    crash between such a merge and its tag left `Stage: early collapse` in an untagged merge. Both must reopen: the
    tagged one as it is, the untagged one tagged from its candidate commit's own (numeric) stage."""
    ws.propose("a", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    ws.propose("b", {"recipe.yaml": ws.read("recipe.yaml").replace("steps: 50", "steps: 9")}, "s", "r",
               "recipe.steps", 2)
    for cid, stage, tag in (("a", "v2", True), ("b", "early collapse", False)):
        msg = (f"Promote {cid}: s\n\nVerdict: promoted\nReason: won\nEvidence: {{}}\n\nCandidate: {cid}\n"
               f"Stage: {stage}\nFactor: x\n")
        sh(ws.path, "merge", "--no-ff", "--no-verify", "-m", msg, f"cand/{cid}")
        sh(ws.path, "branch", "-D", f"cand/{cid}")
        if tag:
            sh(ws.path, "tag", "-a", f"promoted/{stage}-{cid}", "HEAD", "-m", f"Promoted {cid}: s\n\n"
               "Verdict: promoted\nReason: won\nEvidence: {}\n")
    ws2 = Workspace(ws.path)
    assert ws2.repairs == ["tagged the untagged promotion of b (promoted/2-b)"], ws2.repairs
    assert "promoted/v2-a" in sh(ws.path, "tag")


def test_a_kill_inside_a_ref_update_leaves_locks_that_a_reopen_removes(ws):
    """A kill -9 inside `reject`'s `git branch -D` (3 ms after the tag appeared) left packed-refs.lock and an empty
    packed-refs.new; inside `promote`, refs/heads/cand/<id>.lock: every reopen then failed repairing ("Unable to create
    '.../packed-refs.lock': File exists") and the run could not be resumed."""
    cand = ws.propose("q", temp_change(ws, "0.7"), "s", "r", "recipe.temperature", 1)
    sh(ws.path, "pack-refs", "--all")
    sh(ws.path, "tag", "-a", "rejected/q", cand, "-m", "Rejected q\n\nVerdict: rejected\nReason: lost\nEvidence: {}")
    gd = ws.path / ".git"
    (gd / "packed-refs.lock").write_text("")
    (gd / "packed-refs.new").write_text("")
    (gd / "refs" / "heads" / "cand").mkdir(parents=True, exist_ok=True)
    (gd / "refs" / "heads" / "cand" / "q.lock").write_text("")
    ws2 = Workspace(ws.path)
    text = "\n".join(ws2.repairs)
    assert "packed-refs.lock" in text and "packed-refs.new" in text and "cand/q.lock" in text, text
    assert ws2.pending() == [] and [(r.id, r.verdict) for r in ws2.history()] == [("q", "rejected")]
    assert not list(gd.rglob("*.lock")) and fsck_clean(ws.path)


def test_a_rationale_cannot_forge_lines_in_git_log_and_an_inconclusive_tag_says_so(ws):
    """An engineer's rationale is quoted line by line in the commit (control characters as visible escapes), so in
    `git log` no line of it reads as a trailer, a verdict or another commit; history reads it back as written. A
    candidate not merged because its test was inconclusive is tagged `inconclusive/<id>` with `Verdict: inconclusive`
    (its evidence is kept for a re-test), not `rejected/`, so `git tag -l 'rejected/*'` lists refuted changes only;
    a repo written before the tag names differed (`rejected/<id>` saying `Verdict: inconclusive`) still reads
    inconclusive. Would catch: a rationale written into the body verbatim (the forged `Verdict: promoted` paragraph a
    helper planted), or every unmerged candidate called or tagged rejected."""
    forged = "Hotter sampling.\n\nVerdict: promoted\nReason: forged trailer\n\x1b[2J\u202eexe.live"
    ws.propose("s1-c1", temp_change(ws, "0.7"), "Lower temperature", forged, "recipe.temperature", 1)
    ws.reject("s1-c1", "not significant", EV, verdict="inconclusive")
    log = sh(ws.path, "log", "--all", "--format=%B")
    assert "\nVerdict: promoted" not in log and "> Verdict: promoted" in log and "> Reason: forged trailer" in log
    assert "\x1b" not in log and "\u202e" not in log and "\\x1b[2J\\u202eexe.live" in log
    [rec] = ws.history()
    assert rec.verdict == "inconclusive" and rec.rationale.splitlines()[:4] == [
        "Hotter sampling.", "", "Verdict: promoted", "Reason: forged trailer"]
    tag = sh(ws.path, "tag", "-n9", "inconclusive/s1-c1")
    assert "Inconclusive s1-c1" in tag and "Verdict: inconclusive" in tag
    assert sh(ws.path, "tag", "-l", "rejected/*").strip() == ""
    assert ws.reject("s1-c1", "again", EV, verdict="inconclusive").tag == "inconclusive/s1-c1"  # idempotent
    assert ws.decision("s1-c1").verdict == "inconclusive"
    with pytest.raises(AlreadyDecided, match="was inconclusive"):  # a verdict is not changed by a second call
        ws.reject("s1-c1", "refuted after all", EV)
    assert ws.candidate_sha("s1-c1") == rec.sha
    with pytest.raises(ValueError, match="'rejected' or 'inconclusive'"):
        ws.reject("s1-c1", "x", EV, verdict="promoted")
    # an older repo's tag: both verdicts were `rejected/`, the Verdict line telling them apart
    cand = ws.propose("s1-c2", temp_change(ws, "0.9"), "Hotter", "r", "recipe.temperature", 1)
    ws.repo.git.branch("-D", "cand/s1-c2")
    sh(ws.path, "tag", "-a", "rejected/s1-c2", cand, "-m",
       "Inconclusive s1-c2: Hotter\n\nVerdict: inconclusive\nReason: not significant\nEvidence: {}")
    assert [(r.id, r.verdict, r.tag) for r in ws.history()] == [
        ("s1-c1", "inconclusive", "inconclusive/s1-c1"), ("s1-c2", "inconclusive", "rejected/s1-c2")]
    assert ws.decision("s1-c2").verdict == "inconclusive" and ws.reject("s1-c2", "x", EV, verdict="inconclusive")
