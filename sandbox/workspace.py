"""The run's harness repo: a git repository whose `main` is the promoted harness and whose history is the lab notebook.

    from sandbox.workspace import Workspace
    ws = Workspace.create("runs/r1/harness", files_override={"env.yaml": env})  # sandbox/template/ + the task's env
    sha = ws.propose("s1-c1", {"recipe.yaml": new_text}, summary="Lower temperature to 0.7",
                     rationale="...", factor="recipe.temperature", stage=1, skill=None, engineer="rule")
    arm_files = ws.files(sha)                               # train an arm from the candidate's tree, no checkout
    ws.promote("s1-c1", evidence={"effect": 0.12, "ci_low": 0.04, "ci_high": 0.2, "n": 64}, reason="LCB > 0.02")
    ws.reject("s1-c2", reason="slice size=5 regressed", evidence={...})
    ws.history(); ws.diff("s1-c1")
    ws = Workspace("runs/r1/harness")                       # reopen: repairs a crash left mid-operation
    ws = Workspace("runs/r1/harness", read_only=True)       # a reader (report, review): never repairs, never writes

Layout of the repo (see template/README.md): a candidate is a branch `cand/<id>` off `main` with ONE commit (summary,
rationale, trailers Factor/Candidate/Stage/Parent/Skill/Engineer). Promote = no-ff merge into main + annotated tag
`promoted/<stage>-<id>`; reject = annotated tag `rejected/<id>` (refuted) or `inconclusive/<id>`, branch deleted.
Verdict, reason and evidence are in the merge commit message and in the tag. Candidate commits are built with plumbing (a temporary index, commit-tree,
update-ref with "must not exist"), so the main worktree is never switched and a crash never leaves a half commit.
The author identity lives in the repo's own config: no global git configuration is needed.
One writer at a time: opening repairs (it removes a stale index.lock, tags an untagged promotion), so a writer must not
open a workspace while another process is writing to it; the loop's nodes run one after another and own the repo.
Readers (report, review, status) open it with `read_only=True`: no repair, and every writing method refuses, so a
reader opened between a promotion's merge and its tag sees a pending candidate and leaves the repo as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import git
from gitdb.base import IStream

# --- errors --------------------------------------------------------------------------------------------------------


class WorkspaceError(Exception):
    """Base of the workspace's typed errors; the message says what was expected."""


class NotAHarnessRepo(WorkspaceError):
    pass


class UnknownCandidate(WorkspaceError):
    pass


class CandidateConflict(WorkspaceError):
    """The same candidate id was proposed again with different content."""


class AlreadyDecided(WorkspaceError):
    """Promoting a rejected candidate, or rejecting a promoted one."""


class MergeConflict(WorkspaceError):
    pass


class WorkspaceDamaged(WorkspaceError):
    """A state found on open that cannot be repaired without losing something: the message says what and where."""


# --- records -------------------------------------------------------------------------------------------------------

AUTHOR_NAME, AUTHOR_EMAIL = "evotrainer", "evotrainer@localhost"
TEMPLATE_DIR = Path(__file__).parent / "template"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_PROMOTED = re.compile(r"^promoted/(\d+)-(.+)$")
_NOT_MERGED = ("rejected/", "inconclusive/")  # the tags of candidates not merged: refuted, or kept for pooling


def _unmerged_verdict(tag: Any) -> str:
    """`rejected` or `inconclusive`, for a candidate not merged: its tag's name says which, or, in a repo written before
    the names differed (both tagged `rejected/`), the tag's `Verdict:` line."""
    said = _trailers(tag.tag.message).get("Verdict") if tag.tag is not None else None
    return "inconclusive" if tag.name.startswith("inconclusive/") or said == "inconclusive" else "rejected"
_TRAILER = re.compile(r"^([A-Z][A-Za-z-]*): ?(.*)$")


@dataclass
class Decision:
    candidate: str
    verdict: str  # promoted | rejected | inconclusive
    tag: str
    sha: str  # the merge commit (promoted) or the candidate commit (rejected): what the tag points at
    candidate_sha: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class CandidateRecord:
    id: str
    stage: int
    factor: str
    summary: str
    rationale: str
    verdict: str  # promoted | rejected | pending
    reason: str
    evidence: dict[str, Any]
    sha: str  # the candidate commit
    tag: str | None
    merge: str | None
    parent: str
    skill: str | None
    engineer: str


def _trailers(message: str) -> dict[str, str]:
    """Key: value lines of a message (every such line: for verdict blocks and tag messages, whose lines the code
    writes itself). A candidate commit's message carries the engineer's free-text rationale, which may hold lines
    like "Stage: early collapse": read its trailers with `_commit_trailers`."""
    out = {}
    for line in message.splitlines():
        m = _TRAILER.match(line.strip())
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def _commit_trailers(message: str) -> dict[str, str]:
    """The trailers of a candidate or merge commit: its LAST paragraph only (what `propose` and `promote` write after
    the rationale), so a rationale line that looks like a trailer never stands in for one."""
    return _trailers(message.rstrip("\n").rsplit("\n\n", 1)[-1])


def _stage_of(info: dict[str, str], where: str) -> str:
    """The Stage trailer as a decimal integer (it names the promotion tag): a damaged one is refused by name."""
    stage = info.get("Stage", "0").strip()
    if not re.fullmatch(r"[0-9]+", stage):
        raise WorkspaceDamaged(f"{where} has Stage trailer {stage!r}, not a whole number: the promotion tag "
                               "promoted/<stage>-<id> cannot be named from it")
    return str(int(stage))


def _evidence_dict(evidence: Any) -> dict[str, Any]:
    if evidence is None:
        return {}
    if hasattr(evidence, "model_dump"):
        evidence = evidence.model_dump(mode="json")
    if not isinstance(evidence, Mapping):
        raise TypeError(f"evidence must be a mapping or a pydantic model, got {type(evidence).__name__}")
    data = dict(evidence)
    json.dumps(data)  # must be JSON: it is written into commit and tag messages
    return data


def _one_line(text: str, what: str) -> str:
    text = (text or "").strip()
    if not text or "\n" in text:
        raise ValueError(f"{what} must be one non-empty line, got {text!r}")
    return text


def _reason(reason: str) -> str:
    """A verdict's reason on one line (it is a trailer): whitespace, newlines included, collapses to single spaces;
    control characters as visible escapes (a reason may quote what evolved code named: `git tag -n` printed it raw)."""
    text = _visible(" ".join((reason or "").split()))
    if not text:
        raise ValueError("a verdict needs a non-empty reason: say why the candidate was promoted or rejected")
    return text


# C0 controls but \t and \n, DEL, C1 controls, bidi embeddings/overrides/isolates (as `harness.terminal.plain`)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _visible(text: str) -> str:
    """Control characters as their visible escapes (`\\x1b`, `\\u202e`), as `harness.terminal.plain` shows them."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text)


def _quote(rationale: str) -> str:
    """The engineer's rationale as a commit body: every line quoted ("> "), control characters as visible escapes, so
    in `git log` no line of it can pass for a trailer, a verdict or another commit, and no escape reaches the
    reader's terminal. `_unquote` reads it back."""
    text = _visible(rationale.strip())
    return "\n".join(f"> {line}".rstrip() for line in text.splitlines())


def _unquote(body: str) -> str:
    lines = body.splitlines()
    if lines and all(line.startswith(">") for line in lines):  # quoted (`_quote`); older commits hold it as it was
        return "\n".join(line[2:] if line.startswith("> ") else line[1:] for line in lines)
    return body


def _verdict_block(verdict: str, reason: str, evidence: dict[str, Any]) -> str:
    lines = [f"Verdict: {verdict}", f"Reason: {reason}"]
    num = (int, float)
    if isinstance(evidence.get("effect"), num):
        ci = evidence.get("ci") or (evidence.get("ci_low"), evidence.get("ci_high"))
        ok = isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, num) for x in ci)
        ci_txt = f" (CI {ci[0]:+.4f}..{ci[1]:+.4f})" if ok else ""
        looks = evidence.get("looks") or [{}]  # the pooled n behind the interval (the last look's), not one pair's
        n = looks[-1].get("n", evidence.get("n")) if isinstance(looks[-1], dict) else evidence.get("n")
        n_txt = f", n={n}" if n is not None else ""
        lines.append(f"Effect: {evidence['effect']:+.4f}{ci_txt}{n_txt}")
    lines.append(f"Evidence: {json.dumps(evidence, sort_keys=True)}")
    return "\n".join(lines)


# --- the workspace -------------------------------------------------------------------------------------------------


class Workspace:
    """One run's harness repo. Opening it repairs what a crash left behind (see `repair`); `repairs` lists what was done.
    `read_only=True` opens it for reading only: nothing is repaired and the writing methods raise WorkspaceError."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        if not (self.path / ".git").is_dir():
            raise NotAHarnessRepo(f"{self.path} is not a harness repo (no .git): a run makes one when it starts "
                                  "(`evotrainer run`); for a run folder, restore its harness/ from a backup")
        self.repo = git.Repo(self.path)
        with self.repo.config_reader("repository") as cfg:
            marked = cfg.get_value("evotrainer", "harness", default=False)
        if not marked or "main" not in [h.name for h in self.repo.heads]:
            raise NotAHarnessRepo(f"{self.path} is a git repo but not a harness repo (expected branch main and config "
                                  "evotrainer.harness=true, written by Workspace.create)")
        self.read_only = read_only
        self.repairs: list[str] = [] if read_only else self.repair()

    def _writer(self, what: str) -> None:
        if self.read_only:
            raise WorkspaceError(f"{what} on {self.path} opened read-only (a reader must not write): open it with "
                                 "Workspace(path) in the process that drives the run")

    # --- creation ---

    @classmethod
    def create(cls, path: str | Path, template_dir: str | Path | None = None,
               files_override: dict[str, str | None] | None = None) -> Workspace:
        """Make a new harness repo at `path` (absent or empty) from the template; `files_override` replaces files
        (e.g. another task's env.yaml; None deletes one). The first commit on main is the round-0 harness."""
        path = Path(path)
        if path.exists() and any(path.iterdir()):
            raise WorkspaceError(f"{path} exists and is not empty: a harness repo needs a fresh directory")
        template = Path(template_dir) if template_dir else TEMPLATE_DIR
        if not template.is_dir():
            raise WorkspaceError(f"template directory {template} does not exist")
        files = {p.relative_to(template).as_posix(): p.read_text(encoding="utf-8")
                 for p in sorted(template.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
        for rel, text in (files_override or {}).items():
            _check_path(rel)
            if text is None:
                files.pop(rel, None)
            else:
                files[rel] = text
        if not files:
            raise WorkspaceError("the template has no files")
        path.mkdir(parents=True, exist_ok=True)
        repo = git.Repo.init(path, initial_branch="main")
        with repo.config_writer("repository") as cfg:
            cfg.set_value("user", "name", AUTHOR_NAME)
            cfg.set_value("user", "email", AUTHOR_EMAIL)
            cfg.set_value("commit", "gpgsign", "false")
            cfg.set_value("tag", "gpgsign", "false")
            cfg.set_value("evotrainer", "harness", "true")
        for rel, text in files.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_text(text, encoding="utf-8")
        repo.git.add("--all")
        repo.git.commit("-m", "Harness: initial template (round 0)\n\nThe starting harness copied from the template.",
                        "--no-verify")
        repo.close()
        return cls(path)

    # --- reading ---

    def head(self) -> str:
        """The sha of main: the promoted harness."""
        return self.repo.heads["main"].commit.hexsha

    def _commit(self, ref: str) -> git.Commit:
        try:
            return self.repo.commit(ref)
        except (git.BadName, ValueError) as exc:
            raise WorkspaceError(f"unknown ref {ref!r}: expected main, a sha, cand/<id>, or a tag") from exc

    def read(self, path: str, ref: str = "main") -> str:
        """One file's text at `ref` (read from the object store, not the worktree)."""
        try:
            blob = self._commit(ref).tree / path
        except KeyError as exc:
            raise FileNotFoundError(f"{path!r} does not exist at {ref!r} in {self.path}") from exc
        return blob.data_stream.read().decode("utf-8")

    def files(self, ref: str = "main") -> dict[str, str]:
        """Every file at `ref` as {path: text}: how the loop gets a candidate's harness without a checkout."""
        return {b.path: b.data_stream.read().decode("utf-8", errors="replace")
                for b in self._commit(ref).tree.traverse() if b.type == "blob"}

    def checkout_tree(self, ref: str, dest: str | Path) -> Path:
        """Write the files of `ref` into `dest` (absent or empty): a detached copy for an arm to train from."""
        dest = Path(dest)
        if dest.exists() and any(dest.iterdir()):
            raise WorkspaceError(f"{dest} is not empty: checkout_tree writes into a fresh directory")
        for rel, text in self.files(ref).items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text, encoding="utf-8")
        dest.mkdir(parents=True, exist_ok=True)
        return dest

    def candidate_sha(self, cand_id: str) -> str:
        """The candidate commit of `cand_id`, pending or decided."""
        sha = self._find_candidate(cand_id)
        if sha is None:
            raise UnknownCandidate(f"no candidate {cand_id!r}: expected a branch cand/{cand_id} or a tag "
                                   f"promoted/<stage>-{cand_id}, rejected/{cand_id} or inconclusive/{cand_id}; "
                                   f"known: {self._known_ids()}")
        return sha

    def pending(self) -> list[str]:
        """Ids of candidates awaiting a verdict (branches cand/*)."""
        return sorted(h.name[len("cand/"):] for h in self.repo.heads if h.name.startswith("cand/"))

    # --- proposing ---

    def propose(self, cand_id: str, files: dict[str, str | None], summary: str, rationale: str, factor: str,
                stage: int, skill: str | None = None, engineer: str = "rule") -> str:
        """Commit ONE change on a new branch cand/<id> off main; returns the commit sha. None as content deletes a
        file. Proposing the same id again returns the existing commit when the content matches, else
        CandidateConflict."""
        self._writer("propose")
        _check_id(cand_id)
        summary = _visible(_one_line(summary, "summary"))
        factor = _one_line(factor, "factor")
        if not rationale or not rationale.strip():
            raise ValueError("rationale must be non-empty: say why this change should help")
        if not isinstance(stage, int) or stage < 0:
            raise ValueError(f"stage must be an int >= 0, got {stage!r}")
        if not files:
            raise ValueError("files is empty: a candidate changes at least one file")
        for rel in files:
            _check_path(rel)
        existing = self._find_candidate(cand_id)
        if existing is not None:
            old = self.repo.commit(existing)
            if self._tree_with(old.parents[0].hexsha, files) != old.tree.hexsha:
                raise CandidateConflict(f"candidate {cand_id!r} already exists ({existing[:12]}) with different "
                                        "content: propose it under a new id")
            return existing
        base = self.head()
        tree = self._tree_with(base, files)
        if tree == self.repo.commit(base).tree.hexsha:
            raise ValueError(f"candidate {cand_id!r} changes nothing on main: files are identical to main's")
        msg = (f"{summary}\n\n{_quote(rationale)}\n\nFactor: {factor}\nCandidate: {cand_id}\nStage: {stage}\n"
               f"Parent: {base}\nSkill: {skill or 'none'}\nEngineer: {engineer}\n")
        sha = self._commit_tree(tree, [base], msg)
        self.repo.git.update_ref(f"refs/heads/cand/{cand_id}", sha, "0" * 40)  # create only: never move a branch
        return sha

    # --- deciding ---

    def _pending_or_done(self, cand_id: str, verdict: str, hint: str) -> tuple[Decision | None, git.Commit | None]:
        """(the earlier Decision, None) when `cand_id` already got `verdict` (idempotent), else (None, its commit).
        Raises when it got the other verdict or is not a pending candidate."""
        done = self.decision(cand_id)
        if done is not None:
            if done.verdict == verdict:
                return done, None
            raise AlreadyDecided(f"candidate {cand_id!r} was {done.verdict} ({done.tag}): expected a pending "
                                 f"candidate; {hint}")
        if f"cand/{cand_id}" not in [h.name for h in self.repo.heads]:
            raise UnknownCandidate(f"no pending candidate {cand_id!r} (no branch cand/{cand_id}); "
                                   f"pending: {self.pending()}")
        return None, self.repo.heads[f"cand/{cand_id}"].commit

    def promote(self, cand_id: str, evidence: Any, reason: str) -> Decision:
        """Merge cand/<id> into main (no-ff), tag promoted/<stage>-<id>; evidence + reason in both messages.
        Promoting twice returns the same Decision; a rejected or unknown id raises."""
        self._writer("promote")
        reason = _reason(reason)
        done, cand = self._pending_or_done(cand_id, "promoted",
                                           "a rejected change cannot be promoted, propose it again under a new id")
        if done is not None:
            return done
        info = _commit_trailers(cand.message)
        stage = _stage_of(info, f"candidate {cand_id!r} ({cand.hexsha[:12]})")  # before the merge: never half-promoted
        ev = _evidence_dict(evidence)
        block = _verdict_block("promoted", reason, ev)
        msg = (f"Promote {cand_id}: {cand.summary}\n\n{block}\n\nCandidate: {cand_id}\nStage: {stage}"
               f"\nFactor: {info.get('Factor', '')}\n")
        msg_file = Path(self.repo.git_dir) / "EVOTRAINER_MSG"
        msg_file.write_text(msg, encoding="utf-8")
        try:
            self.repo.git.merge("--no-ff", "--no-verify", "-F", str(msg_file), f"cand/{cand_id}")
        except git.GitCommandError as exc:
            both = self.repo.git.diff("--name-only", "--diff-filter=U").split()  # git says CONFLICT on stdout
            self.repo.git.merge("--abort")
            said = f"conflict in {', '.join(both)}" if both else (exc.stderr or exc.stdout or "").strip()[:300]
            raise MergeConflict(f"candidate {cand_id!r} no longer merges cleanly into main ({said}); "
                                "reject it and propose the change again from the current main") from exc
        finally:
            msg_file.unlink(missing_ok=True)
        merge = self.head()
        tag = f"promoted/{stage}-{cand_id}"
        self.repo.git.tag("-a", tag, merge, "-m", f"Promoted {cand_id}: {cand.summary}\n\n{block}\n")
        self.repo.git.branch("-D", f"cand/{cand_id}")
        return Decision(cand_id, "promoted", tag, merge, cand.hexsha, reason, ev)

    def reject(self, cand_id: str, reason: str, evidence: Any = None, verdict: str = "rejected") -> Decision:
        """Tag the candidate commit `rejected/<id>` (refuted: never proposed again from this state) or
        `inconclusive/<id>` (its evidence is kept and a re-test pools with it), annotated with the reason and evidence,
        and delete its branch. A tag's name says the verdict, so `git tag -l 'rejected/*'` lists refuted changes only
        (until the fifty-fifth session both verdicts were tagged `rejected/`, the tag's `Verdict:` line telling them
        apart; such tags are still read by that line). Rejecting twice returns the same Decision; a promoted or
        unknown id, or one that got the other of the two verdicts, raises."""
        self._writer("reject")
        if verdict not in ("rejected", "inconclusive"):
            raise ValueError(f"verdict must be 'rejected' or 'inconclusive', got {verdict!r}")
        reason = _reason(reason)
        done, cand = self._pending_or_done(cand_id, verdict, "a verdict is not changed: undo a promotion by proposing "
                                           "the reverse change, re-test an inconclusive one under a new id")
        if done is not None:
            return done
        ev = _evidence_dict(evidence)
        block = _verdict_block(verdict, reason, ev)
        tag = f"{verdict}/{cand_id}"
        self.repo.git.tag("-a", tag, cand.hexsha, "-m", f"{verdict.capitalize()} {cand_id}: {cand.summary}\n\n{block}\n")
        self.repo.git.branch("-D", f"cand/{cand_id}")
        return Decision(cand_id, verdict, tag, cand.hexsha, cand.hexsha, reason, ev)

    # --- history ---

    def history(self) -> list[CandidateRecord]:
        """Every candidate, decided or pending, ordered by (stage, commit time, id)."""
        records: list[CandidateRecord] = []
        seen = set()
        for tag in self.repo.tags:
            m = _PROMOTED.match(tag.name)
            if m:
                merge = tag.commit
                records.append(self._record(merge.parents[1], "promoted", tag, merge.hexsha))
            elif tag.name.startswith(_NOT_MERGED):
                records.append(self._record(tag.commit, _unmerged_verdict(tag), tag, None))
            else:
                continue
            seen.add(records[-1].id)
        for cid in self.pending():
            if cid not in seen:
                records.append(self._record(self.repo.heads[f"cand/{cid}"].commit, "pending", None, None))
        return sorted(records, key=lambda r: (r.stage, self.repo.commit(r.sha).committed_date, r.id))

    def diff(self, cand_id: str) -> str:
        """The unified diff of one candidate's commit against its parent."""
        sha = self.candidate_sha(cand_id)
        return self.repo.git.diff(f"{sha}^", sha)

    # --- crash repair ---

    def repair(self) -> list[str]:
        """Bring the repo back to a consistent state after a crash; return what was done. Nothing committed is lost:
        uncommitted worktree changes are saved on a branch recovered/<time> before the worktree is reset."""
        self._writer("repair")
        done: list[str] = []
        gd = Path(self.repo.git_dir)
        lock = gd / "index.lock"
        if lock.exists():
            lock.unlink()
            done.append("removed a stale .git/index.lock (a git command was interrupted)")
        # a git command killed while updating refs leaves its lock (and packed-refs' temp file): every later ref update
        # then fails ("Unable to create ... .lock: File exists"). Only the run's driver repairs, under the run lock, so
        # no live git process owns them; removing a lock keeps the ref as it was before the interrupted update.
        stale = [gd / "packed-refs.lock", gd / "packed-refs.new", gd / "HEAD.lock", gd / "config.lock",
                 *sorted((gd / "refs").rglob("*.lock"))]
        for f in (f for f in stale if f.is_file()):
            f.unlink()
            done.append(f"removed a stale .git/{f.relative_to(gd)} (a git command was interrupted)")
        if (gd / "MERGE_HEAD").exists():
            self.repo.git.merge("--abort")
            done.append("aborted an interrupted merge")
        (gd / "EVOTRAINER_MSG").unlink(missing_ok=True)
        if self.repo.is_dirty(untracked_files=True):
            saved = self._save_dirty()
            done.append(f"saved uncommitted changes to branch {saved} and reset the worktree to HEAD")
        if self.repo.head.is_detached or self.repo.active_branch.name != "main":
            self.repo.git.checkout("main")
            done.append("switched the worktree back to main")
        done += self._repair_decisions()
        return done

    def _save_dirty(self) -> str:
        index = Path(tempfile.mkdtemp(prefix="evotrainer-idx-")) / "index"
        try:
            env = {"GIT_INDEX_FILE": str(index)}
            self.repo.git.read_tree("HEAD", env=env)
            self.repo.git.add("--all", env=env)
            tree = self.repo.git.write_tree(env=env)
        finally:
            shutil.rmtree(index.parent, ignore_errors=True)
        name = f"recovered/{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        sha = self._commit_tree(tree, [self.repo.head.commit.hexsha],
                                "Recovered uncommitted changes found when reopening the workspace\n\n"
                                "A previous process stopped with these changes in the worktree; they were saved here "
                                "and the worktree was reset to HEAD.\n")
        self.repo.git.update_ref(f"refs/heads/{name}", sha, "0" * 40)
        self.repo.git.reset("--hard", "HEAD")
        self.repo.git.clean("-fd")
        return name

    def _repair_decisions(self) -> list[str]:
        done = []
        tags = {t.name for t in self.repo.tags}
        tagged = {t.commit.hexsha for t in self.repo.tags if t.name.startswith("promoted/")}
        # a promotion merged into main but not yet tagged (crash between merge and tag)
        for c in self.repo.iter_commits("main", first_parent=True):
            if len(c.parents) != 2:
                continue
            info = _trailers(c.message)
            cid = _commit_trailers(c.message).get("Candidate")
            if info.get("Verdict") != "promoted" or not cid or c.hexsha in tagged:
                continue  # tagged already (a repo an older version wrote may carry a non-numeric stage in its tag)
            # the candidate commit's own Stage (what `propose` wrote, a whole number), not the merge's copy of it
            stage = _stage_of(_commit_trailers(c.parents[1].message), f"candidate commit {c.parents[1].hexsha[:12]}")
            if f"promoted/{stage}-{cid}" not in tags:
                block = c.message.split("\n\n", 1)[1].rsplit("\n\nCandidate:", 1)[0]
                self.repo.git.tag("-a", f"promoted/{stage}-{cid}", c.hexsha,
                                  "-m", f"Promoted {cid}: {c.parents[1].summary}\n\n{block}\n")
                done.append(f"tagged the untagged promotion of {cid} (promoted/{stage}-{cid})")
        for cid in self.pending():
            branch = f"cand/{cid}"
            tip = self.repo.heads[branch].commit.hexsha
            decided = self.decision(cid)
            own = self.repo.git.rev_list(f"main..{branch}").split()
            if decided is not None:
                if decided.candidate_sha != tip:
                    raise WorkspaceDamaged(f"branch {branch} ({tip[:12]}) differs from the commit its verdict "
                                           f"{decided.tag} names ({decided.candidate_sha[:12]}): inspect both, then "
                                           f"delete or rename the branch by hand")
                self.repo.git.branch("-D", branch)
                done.append(f"deleted branch {branch}: its candidate was already {decided.verdict} ({decided.tag})")
            elif not own:
                self.repo.git.branch("-D", branch)
                done.append(f"deleted half-made branch {branch}: it had no commit of its own")
            elif len(own) > 1:
                raise WorkspaceDamaged(f"branch {branch} has {len(own)} commits on top of main, expected exactly one "
                                       "candidate commit: inspect it with `git log main..{branch}`")
        return done

    # --- internals ---

    def _tree_with(self, base: str, files: dict[str, str | None]) -> str:
        """The tree sha of `base` with `files` applied, built in a throwaway index (the real one is untouched)."""
        index = Path(tempfile.mkdtemp(prefix="evotrainer-idx-")) / "index"
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            self.repo.git.read_tree(base, env=env)
            for rel, text in files.items():
                if text is None:
                    self.repo.git.update_index("--force-remove", "--", rel, env=env)
                    continue
                data = text.encode("utf-8")
                blob = self.repo.odb.store(IStream("blob", len(data), BytesIO(data))).hexsha.decode()
                self.repo.git.update_index("--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
            return self.repo.git.write_tree(env=env)
        finally:
            shutil.rmtree(index.parent, ignore_errors=True)

    def _commit_tree(self, tree: str, parents: list[str], message: str) -> str:
        args = [tree]
        for p in parents:
            args += ["-p", p]
        return self.repo.git.commit_tree(*args, "-m", message.rstrip("\n"))

    def _find_candidate(self, cand_id: str) -> str | None:
        if f"cand/{cand_id}" in [h.name for h in self.repo.heads]:
            return self.repo.heads[f"cand/{cand_id}"].commit.hexsha
        done = self.decision(cand_id)
        return done.candidate_sha if done else None

    def decision(self, cand_id: str) -> Decision | None:
        """The verdict `cand_id` got in git (its promoted/, rejected/ or inconclusive/ tag), None while pending."""
        for tag in self.repo.tags:
            m = _PROMOTED.match(tag.name)
            if m and m.group(2) == cand_id:
                merge = tag.commit
                info = _trailers(tag.tag.message)
                return Decision(cand_id, "promoted", tag.name, merge.hexsha, merge.parents[1].hexsha,
                                info.get("Reason", ""), _parse_evidence(info))
            if tag.name in (f"rejected/{cand_id}", f"inconclusive/{cand_id}"):
                info = _trailers(tag.tag.message)
                return Decision(cand_id, _unmerged_verdict(tag), tag.name, tag.commit.hexsha, tag.commit.hexsha,
                                info.get("Reason", ""), _parse_evidence(info))
        return None

    def _known_ids(self) -> list[str]:
        return [r.id for r in self.history()]

    def _record(self, commit: git.Commit, verdict: str, tag: Any, merge: str | None) -> CandidateRecord:
        info = _commit_trailers(commit.message)
        body = commit.message.split("\n\n", 1)[1] if "\n\n" in commit.message else ""
        rationale = _unquote(body.rsplit("\n\n", 1)[0].strip()) if "\n\n" in body.strip() else ""
        tinfo = _trailers(tag.tag.message) if tag is not None else {}
        return CandidateRecord(
            id=info.get("Candidate", ""), stage=int(info.get("Stage", "0")), factor=info.get("Factor", ""),
            summary=commit.summary, rationale=rationale, verdict=verdict, reason=tinfo.get("Reason", ""),
            evidence=_parse_evidence(tinfo), sha=commit.hexsha, tag=tag.name if tag is not None else None,
            merge=merge, parent=info.get("Parent", ""),
            skill=None if info.get("Skill", "none") == "none" else info.get("Skill"),
            engineer=info.get("Engineer", ""))


def _parse_evidence(info: dict[str, str]) -> dict[str, Any]:
    return json.loads(info["Evidence"]) if info.get("Evidence") else {}


def _check_id(cand_id: str) -> None:
    if not isinstance(cand_id, str) or not _ID.match(cand_id) or ".." in cand_id or cand_id.endswith(".lock"):
        raise ValueError(f"candidate id {cand_id!r} is not valid: use letters, digits, '.', '_', '-' "
                         "(start with a letter or digit, at most 80 characters), e.g. 's2-c1'")


def _check_path(rel: str) -> None:
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts or p.parts[0] == ".git" or rel != p.as_posix():
        raise ValueError(f"file path {rel!r} must be a relative POSIX path inside the harness (no '..', not .git)")
