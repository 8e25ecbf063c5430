"""The autonomous run end to end, at tiny scale: a real tiny model, real TRL steps, a real git harness repo, real
SQLite, the rule engineer. Then SIGKILL in the middle of a run and resume it; then the bad inputs of the CLI.

    pytest tests/test_run.py -q
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import wait_for_row

from harness.benchmarks.run import TINY as BENCH_TINY
from harness.benchmarks.run import check_run
from harness.config import ConfigError, load_config, parse_config
from harness.lifecycle import RunError, find_run, resume_run, start_run
from harness.store import RunStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: faster for tiny models

ROOT = Path(__file__).resolve().parents[1]

# the crash benchmark's tiny config, one candidate per stage, completions capped at 24 tokens (an 8-step warm start
# rambles to the cap, and generation is most of these tests' time; the collapse test, which needs valid plans, keeps 48)
TINY = {**BENCH_TINY, "name": "t", "stage": {**BENCH_TINY["stage"], "candidates": 1},
        "recipe": {**BENCH_TINY["recipe"], "max_completion_length": 24},
        # carry confirmations of 48 (three batches), not 288: `stage.keep_training` reads one every stage and a final
        # pick, and at 288 they were most of these tests' time
        "backtest": {**BENCH_TINY["backtest"], "carry_confirm": 48}}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _check_consistent(run_dir: Path) -> dict:
    """run.db agrees with the harness repo's tags, nothing is duplicated, git fsck is clean."""
    problems = check_run(run_dir, Path(os.environ["EVOTRAINER_HOME"]) / "skills.db")
    assert not problems, problems
    store = RunStore.open(run_dir / "run.db")
    try:
        return {"candidates": store.candidates(run_dir.name), "stages": store.stages(run_dir.name),
                "events": store.events(run_dir.name), "compute": store.compute(run_dir.name)}
    finally:
        store.close()


# --- a whole run ------------------------------------------------------------------------------------------------------


def test_tiny_run_end_to_end(tmp_path):
    cfg = parse_config(TINY, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="e2e")
    st = _check_consistent(run_dir)
    assert [s["stage"] for s in st["stages"]] == [1, 2]
    assert all(s["status"] == "done" for s in st["stages"])
    assert all("valid" in s["metrics"] for s in st["stages"])
    # stage wall time spans the whole stage (every node plus the LangGraph steps between them) and holds the compute
    store = RunStore.open(run_dir / "run.db")
    for s in st["stages"]:
        m, k = s["metrics"], s["stage"]
        nodes = sum((store.node_result("e2e", k, n) or {}).get("_wall_s", 0.0)
                    for n in ("train", "probe", "diagnose", "propose", "vet", "backtest", "decide"))
        assert 0 < m["compute_s"] <= m["wall_s"] and m["wall_s"] >= nodes, (k, m, nodes)
        assert m["overhead_share"] == pytest.approx((m["wall_s"] - m["compute_s"]) / m["wall_s"])
    # the STAGE's start (not its arms' start, which the stage's training already moved) is judged on the target, and
    # the next stage begins from the control arm only when its estimate there is not below that start
    from harness.results import Backtested, Decided, Probed

    policy = store.node_result("e2e", 0, "setup")["policy"]
    for k in (1, 2):
        bt, dec = store.result("e2e", k, Backtested), store.result("e2e", k, Decided)
        if bt is not None and bt.start is not None:
            assert bt.start.checkpoint == policy, (k, bt.start.checkpoint, policy)
            if dec.winner is None:
                assert dec.next_policy == (policy if bt.start.change < 0 or bt.start.control_regressed
                                           or store.result("e2e", k, Probed).regressed else bt.control), (k, dec)
        policy = dec.next_policy
    store.close()
    # the engineer proposed, every candidate got a verdict with a reason, and git tells the story
    assert st["candidates"], "the rule engineer proposed nothing on a fresh policy"
    for c in st["candidates"]:
        assert c["status"] in ("promoted", "rejected", "inconclusive", "rejected_vet"), c
        assert c["reason"]
    log = _git(run_dir / "harness", "log", "--all", "--format=%s%n%b")
    assert "Candidate: " + st["candidates"][0]["id"] in log
    # every arm's compute is in the ledger
    assert {"sft", "grpo", "rollout", "eval"} <= set(st["compute"])
    # TensorBoard event files for every training phase, by stage and arm (`tensorboard --logdir runs/<id>`)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = run_dir / "tensorboard"
    phases = sorted(str(p.relative_to(tb)) for p in tb.glob("s*/*") if p.is_dir())
    assert {"s0/sft", "s1/policy", "s1/control", "s2/policy"} <= set(phases), phases
    for ph in phases:
        acc = EventAccumulator(str(tb / ph))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        want = {"train/loss"} if ph.endswith("sft") else {"train/reward", "train/frac_reward_zero_std",
                                                         "train/completions/mean_length", "train/learning_rate"}
        assert want <= tags, (ph, sorted(tags))
        assert all(len(acc.Scalars(t)) >= 1 for t in want)
    # run.db for Datasette: every table and column described; every canned query runs on this real run.db
    import sqlite3

    meta = json.loads((run_dir / "datasette.json").read_text())["databases"]["run"]
    con = sqlite3.connect(run_dir / "run.db")
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"):
        cols = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        assert table in meta["tables"] and cols == set(meta["tables"][table]["columns"]), table
    rows = {name: con.execute(q["sql"]).fetchall() for name, q in meta["queries"].items()}
    con.close()
    assert len(rows["decision_timeline"]) == len(st["candidates"]) and rows["heldout_by_stage"]
    # `evotrainer runs` lists it with its status, stages and best held-out valid
    from harness.report import list_runs

    (tmp_path / "runs" / "half-made").mkdir()
    (tmp_path / "runs" / "half-made" / "config.yaml").write_text("task: mapf\n")
    rows = {r["run"]: r for r in list_runs(tmp_path / "runs")}
    assert rows["half-made"]["status"] == "creating"
    r = rows["e2e"]
    assert (r["status"], r["stages_done"], r["stages"]) == ("finished", 2, 2) and r["best_valid"] is not None
    assert r["promoted"] == sum(c["status"] == "promoted" for c in st["candidates"])
    # the run said at start what confines evolved code on this machine
    assert any(e["kind"] == "sandbox" and "bubblewrap" in e["message"] for e in st["events"])
    store = RunStore.open(run_dir / "run.db")
    assert store.get_run("e2e")["status"] == "finished"
    # held-out hygiene: train seeds only from `train`, probe from `probe`, backtest from `backtest`
    assert set(store.seed_cursors("e2e")) <= {"train", "probe", "backtest"}
    store.close()
    # a finished run cannot be resumed as it is, and the error names the way to give it more stages
    with pytest.raises(RunError, match="already finished; give it more stages with `evotrainer resume"):
        resume_run(run_dir)
    _more_stages_for_a_finished_run(run_dir)


def _more_stages_for_a_finished_run(run_dir: Path) -> None:
    """`evotrainer resume RUN --stages N` reopens a finished run (before, a finished run could not be extended, and a
    budget edited into its config.yaml was never read): a budget that would stop it again at once, an invalid one and
    an unknown key are refused with nothing changed; then one more stage runs from the policy the last one left, the
    run is whole (`check_run`), finished again, and config.yaml differs by the one budget line."""
    from harness.results import Backtested, Decided

    text = (run_dir / "config.yaml").read_text()
    for budget, said in [({"stages": 2}, (r"stop again at once \(stage budget reached \(2 stages\)\): pass --stages "
                                          r"above 2; nothing changed")),
                         ({"wall_clock": "soon"}, "the budget edit is not valid"),
                         ({"stage": 3}, "unknown budget key")]:
        with pytest.raises(RunError, match=said):
            resume_run(run_dir, budget=budget)
        assert (run_dir / "config.yaml").read_text() == text, budget
    # `--wall-clock none` and `--compute-s 0` lift those limits (null in the file), not a duration called "none" and
    # not a compute budget of 0 s (which the config refuses): here the stage budget still stops it, and that is said
    from typer.testing import CliRunner

    from harness.cli import app

    res = CliRunner().invoke(app, ["resume", str(run_dir), "--wall-clock", "none", "--compute-s", "0"],
                             env={"COLUMNS": "400"})
    assert isinstance(res.exception, RunError), (res.exception, res.output)  # the entry point prints it as one line
    assert "stop again at once (stage budget reached (2 stages))" in str(res.exception), res.exception
    assert (run_dir / "config.yaml").read_text() == text
    resume_run(run_dir, budget={"stages": 3})
    st = _check_consistent(run_dir)
    assert [(s["stage"], s["status"]) for s in st["stages"]] == [(1, "done"), (2, "done"), (3, "done")]
    changed = [(a, b) for a, b in zip(text.splitlines(), (run_dir / "config.yaml").read_text().splitlines()) if a != b]
    assert [b.strip() for _, b in changed] == ["stages: 3"], changed
    assert [e["message"] for e in st["events"] if e["kind"] == "extended"] == \
        ["budget.stages 2 -> 3 (finished run, reopened for more stages)"]
    assert [e["stage"] for e in st["events"] if e["kind"] == "finished"] == [2, 3]
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run(run_dir.name)["status"] == "finished"
        assert store.get_run(run_dir.name)["budget"]["stages"] == 3  # run.db says the budget it ran to
        dec2, bt3 = store.result(run_dir.name, 2, Decided), store.result(run_dir.name, 3, Backtested)
    finally:
        store.close()
    assert Path(dec2.next_policy).is_dir()  # retention kept the checkpoint the next stage starts from
    if bt3 is not None and bt3.start is not None:  # stage 3 trained from where stage 2 left the policy
        assert bt3.start.checkpoint == dec2.next_policy, (bt3.start.checkpoint, dec2.next_policy)


def test_backtests_judge_the_run_config_target_not_the_incumbent_env(tmp_path):
    """The judge (judge.json) is fixed at run start from backtest.env; arms train on the harness' env.yaml (3x3 here)
    but every backtest instance is a 4x4 board, in every stage, sampled k=2 times per instance at the judge's fixed
    temperature. Had the arms been judged on the incumbent's env.yaml (the old behaviour), they would be 3x3. The
    completion budget is the judge's too (backtest.max_new_tokens 24 against the round-0 recipe's 6): the arms train
    and the probe rolls out under 6 tokens, while the backtests and the held-out test set are scored under 24 (with
    the recipe's budget, as before, no test completion could pass 6 tokens)."""
    from harness.records import read_rollouts

    env = {"sizes": [{"size": 3, "agents": 2, "hole_ratio": 0.2}]}
    target = {"sizes": [{"size": 4, "agents": 2, "hole_ratio": 0.2}]}
    cfg = parse_config({**TINY, "env": env, "recipe": {**TINY["recipe"], "temperature": 0.9, "max_completion_length": 6},
                        "backtest": {**TINY["backtest"], "env": target, "samples": 2, "max_new_tokens": 24}}, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="judge")
    judge = json.loads((run_dir / "judge.json").read_text())
    assert judge["samples"] == 2 and judge["temperature"] == 0.9 and judge["env"]["sizes"][0]["size"] == 4
    assert judge["max_new_tokens"] == 24
    files = sorted((run_dir / "rollouts").glob("*-backtest.jsonl.gz"))
    assert files, "no backtest ran"
    for f in files:
        rs = read_rollouts(f)
        assert {r.slices["size"] for r in rs} == {"4"}, f
        assert len(rs) == 2 * TINY["backtest"]["n"]
    assert max(r.tokens for f in files for r in read_rollouts(f)) > 6
    train = read_rollouts(next((run_dir / "rollouts").glob("s1-probe.jsonl.gz")))
    assert {r.slices["size"] for r in train} == {"3"}  # the probe follows the harness, as before
    assert max(r.tokens for r in train) <= 6
    store = RunStore.open(run_dir / "run.db")
    tests = [r for r in store.ledger("judge") if r["label"] == "test"]
    n_test = {e["stage"]: e["n"] for e in store.evaluations("judge", arm="policy") if e["split"] == "test"
              and not e["slice_key"]}
    store.close()
    assert tests and any(r["tokens"] > 6 * n_test[r["stage"]] for r in tests), (tests, n_test)
    store = RunStore.open(run_dir / "run.db")  # the round-0 budget cuts expert answers: said once, at run start
    warned = [e["message"] for e in store.events("judge") if e["kind"] == "warning" and e["stage"] == 0]
    store.close()
    assert any("max_completion_length (6) cuts off" in m for m in warned), warned
    # ... and the diagnosis sees the target too: the arms' start checkpoint on the judge's boards (probe seeds, cached,
    # charged, recorded as arm `target`), whose 4x4 boards the 3x3 training mix does not cover
    from harness.records import Diagnosis
    from harness.seeds import split_of

    tgt = read_rollouts(run_dir / "rollouts" / "s1-target.jsonl.gz")
    assert {r.slices["size"] for r in tgt} == {"4"} and {split_of(r.seed) for r in tgt} == {"probe"}
    assert len(tgt) == TINY["stage"]["probe_n"] * TINY["stage"]["probe_samples"]
    assert not {r.seed for r in tgt} & {r.seed for r in train}  # fresh probe seeds
    d = Diagnosis.model_validate_json((run_dir / "stages" / "s1" / "diagnosis.json").read_text())
    assert [(s.value, s.mix_share, s.target_share) for s in d.target.slices] == [("4", 0.0, 1.0)]
    assert any(f.code == "target.uncovered" and f.slice == {"size": "4"} for f in d.findings)
    store = RunStore.open(run_dir / "run.db")
    rows = [e for e in store.evaluations("judge", stage=1, arm="target") if not e["slice_key"]]
    assert [(e["split"], e["n"]) for e in rows] == [("probe", len(tgt))]
    assert any(r["label"] == "target-probe" and r["stage"] == 1 for r in store.ledger("judge"))
    store.close()


# --- crash safety ------------------------------------------------------------------------------------------------------


def _spawn(cfg_path: Path, runs: Path, run_id: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(cfg_path), "--runs-dir", str(runs),
                             "--run-id", run_id], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for_node(run_dir: Path, node: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    wait_for_row(run_dir, "SELECT COUNT(*) FROM nodes WHERE node = ?", [node], proc, f"node {node} finishing", timeout)


def test_sigkill_then_resume_duplicates_nothing(tmp_path):
    cfg = dict(TINY, budget={"stages": 1})
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    proc = _spawn(cfg_path, runs, "crash")
    _wait_for_node(runs / "crash", "propose", proc)
    time.sleep(0.5)  # inside vet / backtest now
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # a second driver on the same run is refused while... the first is dead: the stale lock is taken over
    run_dir = resume_run(runs / "crash")
    st = _check_consistent(run_dir)
    assert [s["stage"] for s in st["stages"]] == [1]
    kinds = [e["kind"] for e in st["events"]]
    assert "resumed" in kinds and kinds.count("finished") == 1


def _killed_in_report_eval(tmp_path, monkeypatch, stages: int, run_id: str) -> Path:
    """Start a `stages`-stage run and kill its driver (KeyboardInterrupt) in the last stage's `report_eval`, the
    stage's last node; returns the run's folder, the kill switched off for what follows."""
    import harness.graph as G

    real = G.report_eval
    dead = {"on": True}

    def report_eval(run, k, *a, **kw):
        if dead["on"] and k == stages:
            raise KeyboardInterrupt
        return real(run, k, *a, **kw)

    monkeypatch.setattr(G, "report_eval", report_eval)
    with pytest.raises(KeyboardInterrupt):
        start_run(parse_config(dict(TINY, budget={"stages": stages}), "test"), tmp_path / "runs", run_id=run_id)
    dead["on"] = False
    return tmp_path / "runs" / run_id


def test_status_of_an_interrupted_run_says_how_to_go_on_with_its_folder(tmp_path, monkeypatch):
    """`evotrainer status` on a run stopped by Ctrl-C printed no way on (only the Ctrl-C line had said it), and the
    report line's hint named a literal `RUN` (a fresh user's walkthrough of the README). Would catch: the hint gone,
    or a placeholder instead of the folder."""
    import io

    from rich.console import Console

    from harness.report import print_summary

    run_dir = _killed_in_report_eval(tmp_path, monkeypatch, 1, "cut")
    buf = io.StringIO()
    print_summary(run_dir, Console(file=buf, width=400))
    out = buf.getvalue()
    assert f"resume: evotrainer resume {run_dir}" in out, out
    assert f"(not written yet: `evotrainer report {run_dir}`)" in out and "report RUN" not in out


def test_a_stage_budget_below_the_stage_an_interrupted_run_is_in_is_refused(tmp_path, monkeypatch):
    """A two-stage run killed inside stage 2, resumed with `--stages 1`: before, the edit was taken silently, stage 2
    ran to its end and the run "stopped at its budget of 1 stage" after two. Now refused with the stage it is in and
    the budget that would stop it there; config.yaml and run.db unchanged. More stages under a wall clock already
    spent is taken (a budget stops new stages, never one begun) and the resume says, in run.db and on the console,
    that the stage it was interrupted in runs to its end first and then ends the run (it said only the edit, so the
    run seemed to ignore it)."""
    run_dir = _killed_in_report_eval(tmp_path, monkeypatch, 2, "lower")  # late in stage 2
    text = (run_dir / "config.yaml").read_text()
    with pytest.raises(RunError, match=r"interrupted in stage 2: a stage budget of 1 is below the stages it has "
                                       r"begun; pass --stages 2 to stop it after the stage it is in"):
        resume_run(run_dir, budget={"stages": 1})
    assert (run_dir / "config.yaml").read_text() == text
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run("lower")["budget"]["stages"] == 2
    finally:
        store.close()
    shown = []
    resume_run(run_dir, budget={"stages": 3, "wall_clock": "1s"},
               progress=lambda kind, data: shown.append(data.get("message")))
    st = _check_consistent(run_dir)
    assert [(s["stage"], s["status"]) for s in st["stages"]] == [(1, "done"), (2, "done")]
    said = [e["message"] for e in st["events"] if e["kind"] == "extended"]
    assert len(said) == 1 and said[0].startswith("budget.stages 2 -> 3, budget.wall_clock None -> '1s' (interrupted "
                                                 "run; it stops after stage 2, the stage it was interrupted in, which "
                                                 "runs to its end first (wall"), said
    assert said[0] in shown


def test_more_stages_for_a_run_killed_after_its_last_stop_was_decided(tmp_path, monkeypatch):
    """A one-stage run dies in its last `remember` after that node decided to stop (StopChecked "stage budget reached")
    but before the run ended; `resume --stages 2` must give it the second stage. Before the reviewer's fix the
    re-entered node read its recorded stop back and finished: the new budget was written and ignored. Also: the
    reopen said once in the events, and a plain resume of a run whose graph had ended finishes it (a failed reopen
    used to leave "running" forever)."""
    from harness.results import StopChecked

    run_dir = _killed_in_report_eval(tmp_path, monkeypatch, 1, "late")  # in the stage's last node
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run("late")["status"] == "interrupted"
        assert store.result("late", 1, StopChecked).reason == "stage budget reached (1 stages)"
    finally:
        store.close()
    resume_run(run_dir, budget={"stages": 2})
    st = _check_consistent(run_dir)
    assert [(s["stage"], s["status"]) for s in st["stages"]] == [(1, "done"), (2, "done")]
    said = [e["message"] for e in st["events"] if e["kind"] == "extended"]
    assert said == [("budget.stages 1 -> 2 (interrupted run; stage 1's stop (stage budget reached (1 stages)) decided "
                     "again: it goes on)")], said
    assert [e["stage"] for e in st["events"] if e["kind"] == "finished"] == [2]
    # a run whose graph has ended but whose status says otherwise (a reopen that failed before it reopened) is
    # finished by a plain resume, not left "running"
    store = RunStore.open(run_dir / "run.db")
    store.set_run_status("late", "interrupted")
    store.close()
    resume_run(run_dir)
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run("late")["status"] == "finished"
    finally:
        store.close()


def test_a_node_that_fails_on_one_candidate_rejects_it_and_the_stage_goes_on(tmp_path, monkeypatch):
    import harness.arms as A
    import harness.vet as V

    real_arm, real_vet = A.arm_job, V.vet

    def arm(run, k, name, *a, **kw):
        if name != "control":
            raise RuntimeError("arm exploded")
        return real_arm(run, k, name, *a, **kw)

    def vet(cand, *a, **kw):
        if cand.id.endswith("c2"):
            raise MemoryError("vet exploded")
        return real_vet(cand, *a, **kw)

    monkeypatch.setattr(A, "arm_job", arm)
    monkeypatch.setattr(V, "vet", vet)
    cfg = parse_config(dict(TINY, budget={"stages": 1}, stage={**TINY["stage"], "candidates": 2}), "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="hurt")
    st = _check_consistent(run_dir)
    by = {c["id"]: c for c in st["candidates"]}
    assert set(by) == {"s1c1", "s1c2"}, by
    assert by["s1c1"]["status"] == "rejected" and "its backtest arm failed: RuntimeError: arm exploded" in \
        by["s1c1"]["reason"]
    assert by["s1c2"]["status"] == "rejected_vet" and "the vet step failed on it: MemoryError" in by["s1c2"]["reason"]
    store = RunStore.open(run_dir / "run.db")
    assert store.get_run("hurt")["status"] == "finished"
    store.close()


def test_a_full_disk_inside_an_arm_decides_nothing_and_a_resume_trains_it_again(tmp_path, monkeypatch):
    """The run folder filled up while a backtest arm saved its checkpoint (what safetensors raises: "I/O error: No
    space left on device (os error 28)"). Before: the candidate was recorded as rejected ("the control arm failed"),
    the run finished with exit 0, and the change was never proposed again. Now the run stops interrupted with a
    `MachineFault` naming the fix, no verdict is recorded, and the resume after space is freed trains the arm and
    decides on evidence. Would catch any catch-all that turns the machine's fault into a candidate's verdict."""
    import harness.run as R
    from harness.faults import MachineFault, machine_fault

    real_save = R.Run.save
    full = {"on": True}

    def save(self, model, tok, ckpt, *a, **kw):
        if full["on"] and str(ckpt).endswith("s1-control"):
            raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_save(self, model, tok, ckpt, *a, **kw)

    monkeypatch.setattr(R.Run, "save", save)
    import harness.faults as F

    monkeypatch.setattr(F, "_bears_out", lambda where: full["on"])  # the disk, as the OS reports it: full
    cfg = parse_config(dict(TINY, budget={"stages": 1}), "test")
    with pytest.raises(MachineFault, match=r"arm control of stage 1 failed because the machine did: no space left on "
                                           r"device .*nothing was decided on it.*evotrainer resume"):
        start_run(cfg, tmp_path / "runs", run_id="full")
    run_dir = tmp_path / "runs" / "full"
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run("full")["status"] == "interrupted"
        assert not [c for c in store.candidates("full") if c["status"] in ("rejected", "promoted", "inconclusive")]
    finally:
        store.close()
    full["on"] = False  # space freed
    resume_run(run_dir)
    st = _check_consistent(run_dir)
    assert st["candidates"] and all("arm failed" not in (c["reason"] or "") for c in st["candidates"]), st
    assert all(c["status"] in ("rejected", "promoted", "inconclusive", "rejected_vet") for c in st["candidates"])
    # what counts as the machine's fault: the disk and the file system, by errno or by the OS's words; not memory
    assert machine_fault(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device"
    assert machine_fault(sqlite3.OperationalError("database or disk is full")) == "disk is full"
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as inner:
            raise RuntimeError("could not write the tree") from inner
    except RuntimeError as outer:
        assert machine_fault(outer) == "read-only file system"
    assert machine_fault(MemoryError()) is None and machine_fault(RuntimeError("arm exploded")) is None
    # torch.save on a full disk says it in its stream writer's words (an outside review: a traceback, no resume line)
    torn = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 730176 vs 730068")
    assert machine_fault(torn) == "unexpected pos"
    # the OS's words in a text count only where the run folder's file system bears them out: a sandboxed program
    # that filled its own scratch says "No space left on device" too, and that is the candidate's failure
    monkeypatch.setattr(F, "_bears_out", lambda where: False)
    said = RuntimeError("cannot start in the sandbox: No space left on device")
    assert machine_fault(said, tmp_path) is None and machine_fault(said) == "no space left on device"
    assert machine_fault(OSError(errno.ENOSPC, "No space left on device"), tmp_path) == "no space left on device"


def test_a_run_started_with_a_relative_runs_dir_records_paths_any_working_directory_can_read(tmp_path, monkeypatch):
    """`--runs-dir runs` (the default) as typed: the run's records named its checkpoints and rollouts
    `runs/<id>/...`, so a resume from another working directory failed ("No such file or directory:
    'rel/r/rollouts/s2-probe.jsonl.gz'"), and a copy of the folder read another run's files. Now the folder is made
    absolute before anything is recorded. Would catch a relative path in the stages' checkpoints."""
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(dict(TINY, budget={"stages": 1}), "test")
    run_dir = start_run(cfg, "runs", run_id="rel")
    assert run_dir.is_absolute() and run_dir == tmp_path / "runs" / "rel"
    monkeypatch.chdir(tmp_path.parent)
    store = RunStore.open(run_dir / "run.db")
    try:
        ckpts = [s["checkpoint"] for s in store.stages("rel") if s["checkpoint"]]
    finally:
        store.close()
    assert ckpts and all(Path(c).is_absolute() and Path(c).exists() for c in ckpts), ckpts
    # a copy (or a moved folder) is refused by name: its records name the original's files, which it would read
    import shutil

    copy = tmp_path / "elsewhere" / "rel"
    shutil.copytree(run_dir, copy)
    (copy / "lock").unlink(missing_ok=True)
    # beside its original, a copy is never told to `mv` over it (that advice moved it INTO the original's folder)
    with pytest.raises(RunError, match=r"is a copy of the run .*runs/rel, which is still there.*resume the original"):
        resume_run(copy)
    moved = tmp_path / "runs" / "rel-moved"
    run_dir.rename(moved)
    with pytest.raises(RunError, match=r"was made as .*runs/rel and moved or copied since.*move it back"):
        resume_run(copy)
    moved.rename(run_dir)
    with pytest.raises(RunError, match="already finished"):  # the folder where it was made is itself
        resume_run(run_dir)
    # config.yaml edited since the start: what a resume may change passes the check (and the run says it finished);
    # anything else is refused by name before anything is written (a task or env edit failed mid-stage before)
    text = (run_dir / "config.yaml").read_text()
    data = yaml.safe_load(text)
    data["engineer"]["kind"] = "rule"
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**data, "budget": {**data["budget"], "plateau": 4}}))
    with pytest.raises(RunError, match="already finished"):
        resume_run(run_dir)
    db = (run_dir / "run.db").read_bytes()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**data, "seed": data["seed"] + 1,
                                                         "recipe": {**data["recipe"], "steps": 7}}))
    with pytest.raises(RunError, match=r"config.yaml was edited since the run started: (seed 0 -> 1; recipe.steps "
                                       r"\d+ -> 7|recipe.steps \d+ -> 7; seed 0 -> 1)\. A resume may change only budget"):
        resume_run(run_dir)
    from harness.lifecycle import answer_gate

    with pytest.raises(RunError, match="edited since the run started"):
        answer_gate(run_dir, "approve")
    assert (run_dir / "run.db").read_bytes() == db


# --- the human gate ----------------------------------------------------------------------------------------------------


def _run_status(run_dir: Path, run_id: str) -> str:
    store = RunStore.open(run_dir / "run.db")
    try:
        return store.get_run(run_id)["status"]
    finally:
        store.close()


def test_human_gate_revise_reaches_the_engineer_and_abort_stops_the_run(tmp_path):
    from harness.diagnostics import diagnosis_text
    from harness.lifecycle import answer_gate
    from harness.records import Diagnosis

    cfg = parse_config(dict(TINY, budget={"stages": 3}, gate={"human": "always"}), "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="gated")  # returns when it pauses at stage 1's gate
    assert _run_status(run_dir, "gated") == "paused"
    # the person at the gate reads the evidence they decide on: the gate's verdicts are on no candidate row yet
    from harness.report import status
    from harness.report_page import build

    waiting = [c for c in status(run_dir)["candidates"] if c["stage"] == 1 and c["status"] != "rejected_vet"]
    assert waiting and all(c["verdict"].endswith("(pending: not applied yet)") and c["effect"] is not None
                           and c["interval"] and c["reason"] for c in waiting), waiting
    page = build(run_dir)
    assert "judged, awaiting the decision" in page and "waiting at the human gate" in page
    assert "rejected before the backtest" not in page
    with pytest.raises(RunError, match="waits at the human gate") as refused:
        resume_run(run_dir)
    # the answers it names are the run's folder, which works wherever the run lives (an id alone is looked up only
    # under ./runs, so a run started with --runs-dir was told a command that could not find it)
    assert f"evotrainer approve {run_dir}`" in str(refused.value), refused.value
    store = RunStore.open(run_dir / "run.db", read_only=True)
    said = [e["message"] for e in store.events("gated") if e["kind"] == "gate_waiting"]
    store.close()
    assert said and f"evotrainer approve {run_dir}`" in said[0], said
    answer_gate(run_dir, "revise", "fewer holes on 5x5, please")
    assert _run_status(run_dir, "gated") == "paused"  # at stage 2's gate now
    store = RunStore.open(run_dir / "run.db")
    s1 = store.candidates("gated", stage=1)
    decisions = [e for e in store.events("gated") if e["kind"] == "gate_decision"]
    store.close()
    # nothing is promoted; a change the gate found inconclusive keeps that verdict (and its evidence for a re-test):
    # a person's revision is not a refutation
    assert s1 and all(c["status"] in ("rejected", "rejected_vet", "inconclusive") for c in s1), s1
    assert any("revised by a human at the gate: fewer holes on 5x5, please" in c["reason"] for c in s1), s1
    assert all(c["status"] == "inconclusive" for c in s1 if "(pending" not in c["reason"]
               and c["status"] != "rejected_vet" and c.get("evidence")
               and (c["evidence"].get("looks") or [{}])[-1].get("decision") == "inconclusive"), s1
    assert decisions[0]["data"] == {"action": "revise", "feedback": "fewer holes on 5x5, please"}
    diag = Diagnosis.model_validate_json((run_dir / "stages" / "s2" / "diagnosis.json").read_text())
    assert "human reviewer feedback (stage 1): fewer holes on 5x5, please" in diagnosis_text(diag)  # the prompt
    answer_gate(run_dir, "abort")
    st = _check_consistent(run_dir)
    assert _run_status(run_dir, "gated") == "finished" and [s["stage"] for s in st["stages"]] == [1, 2]
    assert any(e["kind"] == "finished" and "aborted by a human at the gate (stage 2)" in e["message"]
               for e in st["events"])
    with pytest.raises(RunError, match="not waiting at a gate"):  # twice, or on a finished run: nothing changes
        answer_gate(run_dir, "approve")
    # a run folder renamed (or copied under another name): read as it is, never driven under the new name
    import shutil

    moved = tmp_path / "elsewhere" / "gated-copy"
    shutil.copytree(run_dir, moved)
    assert status(moved)["run"] == "gated" and status(moved)["candidates"]
    with pytest.raises(RunError, match=r"holds run 'gated', created under that name and renamed since.*mv "):
        resume_run(moved)


def test_a_paused_run_survives_sigkill_and_approve_continues_it(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(TINY, budget={"stages": 1}, gate={"human": "always"})))
    runs = tmp_path / "runs"
    proc = _spawn(cfg_path, runs, "pz")
    t0 = time.time()
    while time.time() - t0 < 300:
        db = runs / "pz" / "run.db"
        if db.exists():  # read-only: opening it through RunStore would create it under the starting run
            import sqlite3

            try:
                con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
                row = con.execute("SELECT status FROM runs WHERE id = 'pz'").fetchone()
                con.close()
            except sqlite3.Error:
                row = None
            if row and row[0] == "paused":
                break
        assert proc.poll() in (None, 0), proc.stderr.read().decode()[-2000:]
        time.sleep(0.5)
    time.sleep(1.0)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    cli = [sys.executable, "-m", "harness.cli"]
    out = subprocess.run([*cli, "runs", "--runs-dir", str(runs), "--json"], capture_output=True, text=True, check=True)
    [row] = json.loads(out.stdout)
    assert (row["status"], row["waiting"]) == ("paused", "human gate, stage 1")
    done = subprocess.run([*cli, "approve", "pz", "--runs-dir", str(runs)], check=False, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _run_status(runs / "pz", "pz") == "finished"
    before = _check_consistent(runs / "pz")["candidates"]
    again = subprocess.run([*cli, "approve", "pz", "--runs-dir", str(runs)], check=False, capture_output=True,
                           text=True)
    assert again.returncode == 2 and "not waiting at a gate (status: finished); nothing changed" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert _check_consistent(runs / "pz")["candidates"] == before


# --- bad input ---------------------------------------------------------------------------------------------------------


def test_config_typo_names_the_field(tmp_path):
    bad = dict(TINY, backtest={"arm_step": 1})
    with pytest.raises(ConfigError, match=r"backtest\.arm_step: unknown key"):
        parse_config(bad, "x.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    # sections validated by other models name their full path in the run config
    bad_env = dict(TINY, env={"sizes": [{"size": 3, "hole_ratio": 0.9, "agents": 2}]})
    with pytest.raises(ConfigError, match=r"invalid run config:\s+env\.sizes\.0\.hole_ratio: hole_ratio must be"):
        parse_config(bad_env, "x.yaml")
    with pytest.raises(ConfigError, match=r"recipe\.learning_rte: unknown key"):
        parse_config(dict(TINY, recipe={"learning_rte": 1e-4}), "x.yaml")
    with pytest.raises(ConfigError, match=r"backtest\.env\.sizes\.0\.hole_ratio"):
        parse_config(dict(TINY, backtest={"env": bad_env["env"]}), "x.yaml")
    with pytest.raises(ConfigError, match=r"policy\.style.*'trac'.*trace, compact, chat"):
        parse_config(dict(TINY, policy={"preset": "tiny", "style": "trac"}), "x.yaml")
    # an imperfect teacher only where the family has one; a share of 1 would leave no expert demonstration
    assert parse_config(dict(TINY, warm_start={"teacher_noise": 0.6})).warm_start.teacher_noise == 0.6
    with pytest.raises(ConfigError, match=r"warm_start\.teacher_noise: .*less than 1"):
        parse_config(dict(TINY, warm_start={"teacher_noise": 1.0}), "x.yaml")
    with pytest.raises(ConfigError, match=r"warm_start\.teacher_noise: task math has no imperfect teacher"):
        parse_config({"task": "math", "warm_start": {"teacher_noise": 0.5}}, "x.yaml")
    # keep training, keep the best moves its anchor only on confirmation readings: turning them off is refused
    with pytest.raises(ConfigError, match=r"backtest\.carry_confirm: 0 turns off .*stage\.keep_training: false"):
        parse_config(dict(TINY, backtest={**TINY.get("backtest", {}), "carry_confirm": 0}), "x.yaml")
    assert parse_config(dict(TINY, backtest={**TINY.get("backtest", {}), "carry_confirm": 0},
                             stage={**TINY.get("stage", {}), "keep_training": False})).backtest.carry_confirm == 0
    assert parse_config(dict(TINY, policy={"preset": "tiny"})).style == "trace"  # char models: the task's first style
    assert parse_config(dict(TINY, policy={"checkpoint": str(tmp_path)})).style == "chat"
    (tmp_path / "evotrainer.json").write_text('{"task": "mapf", "style": "trace"}')  # one of ours: its own style
    assert parse_config(dict(TINY, policy={"checkpoint": str(tmp_path)})).style == "trace"


def test_cli_bad_inputs_one_clear_line(tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, check=False,
                              env={**os.environ, "EVOTRAINER_HOME": str(tmp_path / "home")}, cwd=tmp_path)

    p = tmp_path / "typo.yaml"
    p.write_text(yaml.safe_dump(dict(TINY, stage={"probe": 3})))
    r = cli("run", str(p))
    assert r.returncode == 2 and "stage.probe: unknown key" in r.stderr
    r = cli("status", "no-such-run")
    assert r.returncode == 2 and "no run 'no-such-run'" in r.stderr
    p.write_text(yaml.safe_dump(dict(TINY, policy={"checkpoint": str(tmp_path / "missing-ckpt")})))
    r = cli("run", str(p), "--runs-dir", str(tmp_path / "runs"))
    assert r.returncode == 2 and "missing-ckpt" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    p.write_text(yaml.safe_dump(dict(TINY, policy={"preset": "tiny", "backend": "vllm"})))
    r = cli("run", str(p), "--runs-dir", str(tmp_path / "runs"))
    assert r.returncode == 2 and "policy.backend" in r.stderr and "transformers" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing started


def test_cli_inputs_that_ran_or_wrote_what_nobody_asked_for_are_refused_first(tmp_path, monkeypatch):
    """Each of these ran with exit 0 or trained before refusing (a read-only review found them): `run --budget 8`
    (8 seconds: one stage, where 8 hours was meant), `runs --runs-dir TYPO` ("no runs"), `skills import EMPTY_DIR`
    ("imported: 0 skills"), `bench scenarios --arms ""` (every arm), `train --out` over a checkpoint (replaced it
    silently) or a file (refused after training), `run RUN_DIR` ("not found"), and a Ctrl-C, which printed a worker's
    traceback and no way on. Each is now one line, exit 2 (130 for Ctrl-C), nothing written."""
    from typer.testing import CliRunner

    from harness import lifecycle
    from harness.cli import app
    from harness.run import RunInterrupted

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def cli(*args: str):
        return runner.invoke(app, list(args), env={"COLUMNS": "400"})

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    r = cli("run", str(cfg), "--budget", "8", "--runs-dir", "r")
    assert r.exit_code == 2 and "--budget 8: give the unit, e.g. 8h, 8m or 8s" in r.output, r.output
    r = cli("resume", "whatever", "--wall-clock", "12")
    assert r.exit_code == 2 and "--wall-clock 12: give the unit" in r.output, r.output
    r = cli("runs", "--runs-dir", "no-such")
    assert r.exit_code == 2 and "--runs-dir no-such: no such folder" in r.output, r.output
    r = cli("runs")  # the default folder not made yet: an empty list, said
    assert r.exit_code == 0 and "no runs under runs/" in r.output, r.output
    (tmp_path / "empty").mkdir()
    r = cli("skills", "import", "empty", "--home", "h")
    assert r.exit_code != 0 and "no *.md skill files" in str(r.exception), (r.exception, r.output)
    r = cli("bench", "scenarios", "--arms", "", "--out", "o")
    assert r.exit_code == 2 and "--arms names no arm" in r.output, r.output
    r = cli("experiment", "examples/none.yaml", "--arms", " , ")
    assert r.exit_code == 2 and "--arms names no arm" in r.output, r.output
    r = cli("bench", "scenarios", "--scenarios", "", "--out", "o")
    assert r.exit_code == 2 and "--scenarios names no scenario" in r.output, r.output
    for opt in ("--runs-dir", "--engineer"):  # "" meant the working folder, or the config's engineer
        r = cli("run", str(cfg), opt, "")
        assert r.exit_code == 2 and f"{opt} is empty" in r.output, (opt, r.output)
    r = cli("skills", "export", "", "--home", "h")
    assert r.exit_code == 2 and "needs a folder of its own" in r.output, r.output
    from harness.experiment import ExperimentError, load_experiment

    (tmp_path / "noarms.yaml").write_text(yaml.safe_dump({"run": {"task": "mapf"}, "arms": []}))
    with pytest.raises(ExperimentError, match="arms: names no arm"):  # was an IndexError after writing its out
        load_experiment(tmp_path / "noarms.yaml")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "afile").write_text("x")
    for out, said in [("ckpt", "already holds a checkpoint; pass another --out, or --overwrite"),
                      ("afile", "is a file"), ("", "--out names no folder")]:
        t0 = time.time()
        r = cli("train", "--out", out, "--sft-examples", "8", "--grpo-steps", "0")
        assert r.exit_code != 0 and said in str(r.exception), (out, r.exception, r.output)
        assert time.time() - t0 < 30  # before the minutes of training, not after
    assert (tmp_path / "ckpt" / "config.json").read_text() == "{}"
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()
    # a parent that cannot hold --out, and counts past what one command draws: said before training (an outside
    # review: "not a directory" came after 20 s of training, and 1e11 demonstrations drew until memory ran out)
    for args, said in [(["--out", "afile/sub"], "cannot write beside it"),
                       (["--out", "big", "--grpo-steps", "100000000"], "more than 1000000 instances")]:
        t0 = time.time()
        r = cli("train", *args, "--sft-examples", "8")
        assert r.exit_code != 0 and said in str(r.exception), (args, r.exception, r.output)
        assert time.time() - t0 < 30
    r = cli("train", "--out", "huge", "--sft-examples", "100000000000")
    assert r.exit_code == 2 and "sft-examples" in r.output, r.output
    # --overwrite replaces the folder whole: a file of the old checkpoint (a chat template the new weights never saw)
    # is gone, and no staging folder is left beside it
    (tmp_path / "ckpt" / "chat_template.jinja").write_text("{{ messages }}")
    r = cli("train", "--out", "ckpt", "--overwrite", "--task", "math", "--sft-examples", "8", "--sft-steps", "1",
            "--grpo-steps", "0")
    assert r.exit_code == 0, (r.exception, r.output)
    assert not (tmp_path / "ckpt" / "chat_template.jinja").exists() and (tmp_path / "ckpt" / "evotrainer.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.")]
    # a run's folder where a config belongs names the command meant
    made = lifecycle.open_run(tmp_path / "runs" / "x", parse_config(TINY, "test"))
    made.close()
    made.store.close()
    r = cli("run", "runs/x")
    assert r.exit_code == 2 and "is a run's folder, not a run config: `evotrainer resume runs/x`" in r.output, r.output
    # Ctrl-C while a run is driven: the run's folder and how to go on, exit 130 (the driver records it interrupted)
    monkeypatch.setattr(lifecycle, "_drive_prepared", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(RunInterrupted) as got:
        lifecycle.start_run(parse_config(TINY, "test"), tmp_path / "runs", run_id="ctrlc")
    assert got.value.run_dir == tmp_path / "runs" / "ctrlc"
    r = cli("run", str(cfg), "--runs-dir", "runs", "--run-id", "ctrlc2")
    assert r.exit_code == 130, (r.exit_code, r.output)
    assert "interrupted (Ctrl-C); what run ctrlc2 recorded is kept" in r.output and \
        f"`evotrainer resume {tmp_path / 'runs' / 'ctrlc2'}` continues it" in r.output, r.output


def test_second_process_on_same_run_is_locked(tmp_path):
    from harness.store import RunLockedError, acquire_lock

    run_dir = tmp_path / "runs" / "locked"
    run_dir.mkdir(parents=True)
    (run_dir / "run.db").touch()
    (run_dir / ".evotrainer-run").write_text("locked\n")  # start_run's marker: a run folder is more than one file
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from harness.store import acquire_lock; "
            f"from pathlib import Path; l = acquire_lock(Path({str(run_dir)!r}), 'locked'); print('held', flush=True); "
            "time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match="already being driven by pid"):
            acquire_lock(run_dir, "locked")
        assert find_run(run_dir) == run_dir
    finally:
        holder.kill()
        holder.wait()


def test_status_json_lists_candidates(tmp_path):
    cfg = parse_config(dict(TINY, budget={"stages": 1}), "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="st")
    r = subprocess.run([sys.executable, "-m", "harness.cli", "status", str(run_dir), "--json"], capture_output=True,
                       text=True, check=False, env={**os.environ, "EVOTRAINER_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["status"] == "finished" and data["stages"][0]["stage"] == 1
    for c in data["candidates"]:
        assert {"id", "factor", "verdict", "reason", "effect", "interval", "commit", "tag"} <= set(c)
    html = (run_dir / "report.html").exists() or subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(run_dir)], capture_output=True, check=False).returncode == 0
    assert html and (run_dir / "report.html").read_text().count("<tr") >= 2


def test_resume_of_a_run_killed_while_being_created(tmp_path):
    """Killed after config.yaml and a `git init` but before the harness' first commit and any graph checkpoint."""
    run_dir = tmp_path / "runs" / "born"
    (run_dir / "harness").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(run_dir / "harness")], check=True)
    (run_dir / ".evotrainer-run").write_text("born\n")  # start_run writes its marker first
    (run_dir / "config.yaml").write_text(yaml.safe_dump(dict(TINY, budget={"stages": 1})))
    resume_run(run_dir)
    st = _check_consistent(run_dir)
    assert [s["stage"] for s in st["stages"]] == [1]


def test_an_exploit_stage_trains_for_its_arms_compute_and_confirms_its_carry(tmp_path, monkeypatch):
    """The stage after a promotion (`stage.exploit_after_promotion`; whether stage 1 promotes is up to real training,
    so which stage exploits is fixed here): its policy trains `recipe.steps` + (candidates + 1) x `arm_steps` GRPO
    steps under harness@main, it proposes nothing and trains no arm, the review says so, and its checkpoint continues
    only after a greedy reading against the run's anchor on fresh backtest instances (`stage.keep_training`). Caught: an exploit stage
    that trains only its own steps, still proposes or trains arms, or carries its checkpoint unchecked (a stage
    without arms had no target check before)."""
    from harness import graph
    from harness.results import Decided, Probed, Proposed, Trained

    monkeypatch.setattr(graph, "exploiting", lambda run, k: "s1c1" if k == 2 else None)
    cfg = parse_config({**TINY, "backtest": {**TINY["backtest"], "carry_confirm": 32}}, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="exploit")
    st = _check_consistent(run_dir)
    store = RunStore.open(run_dir / "run.db")
    try:
        want = TINY["recipe"]["steps"] + (cfg.stage.candidates + 1) * cfg.backtest.arm_steps
        grpo2 = [c for c in store.ledger("exploit") if c["stage"] == 2 and c["kind"] == "grpo"]
        assert [(c["arm"], c["steps"]) for c in grpo2] == [("policy", want)], grpo2
        assert len(store.result("exploit", 2, Trained).steps) == want
        assert store.result("exploit", 2, Trained).exploits == "s1c1"
        assert store.result("exploit", 2, Proposed).engineer == "exploit"
        assert not [c for c in st["candidates"] if c["stage"] == 2] and [c for c in st["candidates"] if c["stage"] == 1]
        assert any(e["kind"] == "exploit" and e["stage"] == 2 for e in st["events"])
        dec, probe = store.result("exploit", 2, Decided), store.result("exploit", 2, Probed)
        one = store.result("exploit", 1, Decided)
        start, anchor = one.next_policy, one.anchor or one.next_policy
        if not probe.regressed and start == anchor:  # checked where it matters, against the anchor, to continue
            c = dec.carry_check
            assert c is not None and c.start == anchor and c.against_anchor and c.n > 0
            assert dec.next_policy == (c.chosen if c.confirmed or c.kept else anchor)
            assert dec.anchor == (c.chosen if c.confirmed else anchor)  # `stage.keep_training`: keep the best
            # against the anchor every reading obeys `carry_margin` (`backtest.exploit_margin` is the margin against
            # the stage's start without `stage.keep_training`)
            margin = cfg.backtest.carry_margin
            assert c.confirmed == (c.change >= margin * c.se and c.change > 0)
            assert c.kept == (not c.confirmed and c.change >= -margin * c.se)
        elif probe.regressed:
            assert dec.next_policy == start
    finally:
        store.close()
    from io import StringIO

    from rich.console import Console

    from harness.report import print_summary

    out = StringIO()
    print_summary(run_dir, Console(file=out, width=400))
    assert "exploits s1c1" in out.getvalue(), out.getvalue()
    from harness.report_page import build

    assert "<ul class=exploits><li>stage 2: stage 2 exploits s1c1 (promoted at stage 1)" in build(run_dir)
    # `evotrainer review`: the exploit stage is a line of its own after stage 1's candidates, with what it trained
    # and whether its checkpoint continued
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.report import exploit_stages

    xs = exploit_stages(run_dir)
    assert [(x["stage"], x["exploits"], x["steps"]) for x in xs] == [(2, "s1c1", want)], xs
    res = CliRunner().invoke(app, ["review", str(run_dir)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("stage 2 · exploit"))
    assert f"trained {want} GRPO steps under s1c1" in lines[at] and any(x.startswith("s1c1 stage 1") for x in lines[:at])
    # which engineer proposed each candidate (an outside attack found the review never said, nor that an LLM fell back)
    flat = " ".join(res.output.split())  # the console may wrap a long line whatever COLUMNS says
    head = flat[flat.index("s1c1 stage 1 · "):]
    assert head[:head.index(" change: ")].endswith("· by the rule engineer"), head[:300]


def test_a_stage_that_backs_off_exploring_exploits_harness_main_and_says_why(tmp_path, monkeypatch):
    """`stage.explore_backoff` on a real run (which stages found nothing is up to real training, so the rule's answer
    is fixed here; `tests/test_decisions.py::test_exploring_that_keeps_finding_nothing_backs_off` pins the rule):
    the stage trains harness@main for its arms' compute, proposes nothing, records why (`Trained.backoff`), and the
    event log, `evotrainer review` and the report page say that exploring found nothing. Caught: a backed-off stage
    that still proposes, trains only its own steps, or is shown as exploiting a promotion or a confirmed gain; a
    stage that exploits a promotion taken for a backed-off one."""
    from harness import graph
    from harness.decisions import INCUMBENT
    from harness.results import Proposed, Trained

    monkeypatch.setattr(graph, "backing_off", lambda run, k: (2, 0, 1) if k in (2, 3) else None)
    monkeypatch.setattr(graph, "exploiting", lambda run, k: "s1c1" if k == 3 else None)  # both rules at stage 3
    cfg = parse_config({**TINY, "budget": {**TINY["budget"], "stages": 3}}, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="backoff")
    st = _check_consistent(run_dir)
    store = RunStore.open(run_dir / "run.db")
    try:
        want = TINY["recipe"]["steps"] + (cfg.stage.candidates + 1) * cfg.backtest.arm_steps
        t = store.result("backoff", 2, Trained)
        assert (t.exploits, t.backoff, len(t.steps)) == (INCUMBENT, [2, 0, 1], want)
        assert store.result("backoff", 1, Trained).backoff is None
        three = store.result("backoff", 3, Trained)  # a promotion's exploitation is not a backed-off stage
        assert (three.exploits, three.backoff, len(three.steps)) == ("s1c1", None, want)
        assert store.result("backoff", 2, Proposed).engineer == "exploit"
        assert not [c for c in st["candidates"] if c["stage"] == 2]
        msg = next(e["message"] for e in st["events"] if e["kind"] == "exploit" and e["stage"] == 2)
        assert "found nothing" in msg and "stage.explore_backoff" in msg and "exploit stage 1 of 1" in msg, msg
    finally:
        store.close()
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.report_page import build

    res = CliRunner().invoke(app, ["review", str(run_dir)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())  # the console may wrap the line, whatever COLUMNS says in a long session
    assert f"stage 2 · exploit · trained {want} GRPO steps under harness@main (the last 2 exploring stages found " \
        "nothing)" in flat, res.output
    assert "stage.explore_backoff" in build(run_dir)


def test_a_recipe_that_collapses_the_policy_is_caught_and_not_carried_forward(tmp_path):
    """Bad input: a learning rate that destroys the policy. The warm start solves some easy 4x4 boards it never saw
    (until the fifty-fourth session it "solved" 3x3 ones: 72 boards in all, every probe board a training board too;
    held apart by content, it solved none of the probe's); one stage of GRPO at lr 0.05 wrecks it (sampled at 1.2:
    at 0.7 every group on the training boards, which the warm start learnt, was solved alike, so no gradient moved
    it; two candidate slots, since the wrecked policy's parse errors bring a temperature skill beside the rate). The probe sees the fall (paired, beyond noise), records grpo.policy_regressed, the arms and
    the next stage start from the warm start (the wrecked checkpoint is not carried), and the rule engineer proposes
    halving the learning rate. Nothing already recorded is lost: the stage still finishes with its verdicts."""
    easy = {"sizes": [{"size": 4, "agents": 1, "hole_ratio": 0.0, "wait_ratio": 0.0}], "min_distance": 1}
    cfg = parse_config({**TINY, "env": easy, "warm_start": {"sft_examples": 800, "sft_steps": 250},
                        "recipe": {**TINY["recipe"], "learning_rate": 0.05, "steps": 4, "temperature": 1.2,
                                   "max_completion_length": 48},
                        "backtest": {**TINY["backtest"], "arm_steps": 4},  # 1 step is all warmup: lr 0, no change
                        "budget": {"stages": 1}, "stage": {**TINY["stage"], "probe_n": 64, "probe_samples": 2,
                                                           "candidates": 2},
                        "eval": {"suite": "small", "limit": 8}}, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="collapse")
    store = RunStore.open(run_dir / "run.db")
    try:
        probe = store.node_result("collapse", 1, "probe")
        seen = {k: probe.get(k) for k in ("start_valid", "valid", "change_ci", "regressed")}
        assert probe["start_valid"] > 0.1, seen  # the warm start solves some unseen boards ...
        assert probe["regressed"] and probe["change_ci"][1] < 0, seen  # ... and the stage wrecked it
        assert probe["carried"].endswith("warmstart"), probe
        assert any(e["kind"] == "regression" and "NOT carried" in e["message"] for e in store.events("collapse"))
        assert "grpo.policy_regressed" in [f.code for f in store.findings("collapse", stage=1)]
        cands = store.candidates("collapse")
        assert any(c["knob"] == "recipe.learning_rate" and (c["patch"] or {}).get("value") < 0.05 for c in cands), \
            [(c["knob"], c["skill"]) for c in cands]
        assert store.stages("collapse")[0]["status"] == "done"
        # the control arm trained under the same collapsing recipe is not carried either: the next stage starts from
        # the warm start unless a candidate won
        dec = store.node_result("collapse", 1, "decide")
        assert dec["winner"] or dec["next_policy"].endswith("warmstart"), dec
        # the arms' start is judged too, on the arms' backtest instances: the control arm (4 more steps at lr 0.05
        # from the warm start) is below it by more than noise, which is said once as a regression event
        start = store.node_result("collapse", 1, "backtest")["start"]
        assert start["checkpoint"].endswith("warmstart") and start["n"] == cfg.backtest.n, start
        assert start["valid"] > start["control_valid"] and start["control_regressed"], {
            k: start.get(k) for k in ("valid", "control_valid", "control_regressed", "n")}
        assert start["valid"] == pytest.approx(store.node_result("collapse", 1, "judge:start")["valid"])
        assert any(e["kind"] == "regression" and "control arm" in e["message"] for e in store.events("collapse"))
    finally:
        store.close()


def test_a_control_arm_below_its_start_is_the_next_stage_finding_unless_something_won():
    """Stage k-1's control arm fell below its start on the backtest (the recipe lowers the policy over more steps
    than a stage trains, which the probe cannot see): stage k's engineer gets grpo.policy_regressed with the
    figures, and so proposes a lower learning rate; not when stage k-1 promoted a candidate (the incumbent changed)
    or when the control arm held."""
    from harness.memory import carried_regression
    from harness.results import Backtested, Decided, StartJudged

    start = StartJudged(checkpoint="s1-train", n=160, valid=0.25, control_valid=0.09, change=-0.16,
                        change_ci=[-0.2, -0.12], control_regressed=True)
    f = carried_regression(2, Backtested(start=start), Decided(winner=None, next_policy="s1-train"), arm_steps=50)
    assert f is not None and f.code == "grpo.policy_regressed" and f.rate == 0.16 and f.count == 160
    assert "0.250 -> 0.090" in f.message and "50 more GRPO steps" in f.message
    assert carried_regression(2, Backtested(start=start), Decided(winner="s1c1", next_policy="x"), arm_steps=50) is None
    held = start.model_copy(update={"control_regressed": False})
    assert carried_regression(2, Backtested(start=held), None, arm_steps=50) is None
    assert carried_regression(2, Backtested(verdicts=[]), None, arm_steps=50) is None  # nothing was backtested


def test_an_exploit_stage_that_lowered_the_policy_is_the_next_stage_finding():
    """Stage k-1 exploited a promoted change and its training lowered the probe beyond noise; an exploit stage proposes
    nothing, so stage k's engineer gets grpo.policy_regressed with those figures (and so can lower the learning rate)
    even when stage k's own 30 steps fell within noise. Not when stage k-1 explored (its own engineer had the finding)
    or its exploit training held. Would catch the demo seed whose exploit stage fell 0.285 -> 0.086 and whose next
    stage, hearing nothing of it, proposed a hole ratio."""
    from harness.memory import exploit_regression
    from harness.results import Probed, Trained

    fell = Probed(rollouts="r", valid=0.086, start_valid=0.285, change=-0.199, change_ci=[-0.277, -0.117],
                  regressed=True)
    exploit = Trained(checkpoint="s2-train", exploits="s1c1")
    f = exploit_regression(3, exploit, fell, probe_n=64)
    assert f is not None and f.code == "grpo.policy_regressed" and f.rate == 0.199 and f.count == 64
    assert "stage 2 exploited s1c1" in f.message and "0.285 -> 0.086" in f.message
    assert exploit_regression(3, Trained(checkpoint="s2-train"), fell, probe_n=64) is None  # it explored
    held = fell.model_copy(update={"regressed": False, "valid": 0.27, "change": -0.015})
    assert exploit_regression(3, exploit, held, probe_n=64) is None
    assert exploit_regression(3, None, None, probe_n=64) is None


def test_a_second_run_loads_the_warm_start_from_the_cache(tmp_path):
    """Run 1 trains the SFT warm start and stores it under $EVOTRAINER_HOME/warmstart; run 2 with the same settings and
    code loads it (no SFT charged, same weights, the path printed as an event); other settings or other code make
    another key, and EVOTRAINER_WARMSTART_CACHE=0 turns the cache off."""
    from harness import warmstart

    cfg = parse_config({**TINY, "budget": {"stages": 1}, "stage": {**TINY["stage"], "candidates": 1}}, "test")
    first = start_run(cfg, tmp_path / "runs", run_id="ws1")
    second = start_run(cfg, tmp_path / "runs", run_id="ws2")
    entries = list(warmstart.cache_root().iterdir())
    assert len(entries) == 1 and (entries[0] / "DONE").exists()
    for run_dir, hit in ((first, False), (second, True)):
        store = RunStore.open(run_dir / "run.db")
        try:
            msgs = [e["message"] for e in store.events(run_dir.name) if e["kind"] == "cache"]
            assert any(("loaded from the cache" if hit else "cached at") in m and str(entries[0]) in m for m in msgs)
            assert ("sft" in store.compute(run_dir.name)) is not hit
        finally:
            store.close()
    a, b = (d / "checkpoints" / "warmstart" / "model.safetensors" for d in (first, second))
    assert a.read_bytes() == b.read_bytes()
    base = {"task": "mapf", "preset": "tiny", "seeds": [1, 2], "sft_steps": 8}
    assert warmstart.cache_key(**base) == warmstart.cache_key(**base)
    assert warmstart.cache_key(**base) != warmstart.cache_key(**{**base, "sft_steps": 9})
    old = warmstart.code_version()
    warmstart.CODE = (*warmstart.CODE, "harness/config.py")  # as if another file were part of the code version
    try:
        assert warmstart.code_version() != old
    finally:
        warmstart.CODE = warmstart.CODE[:-1]
    os.environ["EVOTRAINER_WARMSTART_CACHE"] = "0"
    try:
        assert warmstart.lookup(entries[0].name) is None
    finally:
        del os.environ["EVOTRAINER_WARMSTART_CACHE"]


def test_a_resume_says_which_judge_settings_an_edited_config_cannot_change(tmp_path):
    """The judge is fixed at run start (judge.json): before, an edited `backtest.samples` in config.yaml resumed in
    silence, as if it applied."""
    from harness.lifecycle import _say_judge_edits, open_run

    cfg = parse_config(TINY, "test")
    run = open_run(tmp_path / "runs" / "j", cfg)
    try:
        _say_judge_edits(run, cfg)
        edited = parse_config({**TINY, "backtest": {**TINY["backtest"], "samples": 3}}, "test")
        _say_judge_edits(run, edited)
        said = [e["message"] for e in run.store.events(run.id) if e["kind"] == "warning" and "judge settings" in e["message"]]
    finally:
        run.close()
        run.store.close()
    assert len(said) == 1 and "backtest.samples 4 -> 3" in said[0] and "no effect" in said[0], said  # the unedited one: silent


def test_what_reopening_a_run_repaired_is_in_its_events(tmp_path):
    """Before, `_prepare` repaired on its first open of the harness repo and dropped the list, and the driver logged
    the repairs of a second open, which had nothing left to repair: a resume's repairs were never said."""
    from harness.lifecycle import open_run

    cfg = parse_config(TINY, "test")
    run = open_run(tmp_path / "runs" / "rp", cfg)
    run.close()
    run.store.close()
    (tmp_path / "runs" / "rp" / "harness" / ".git" / "index.lock").write_text("")
    run = open_run(tmp_path / "runs" / "rp", cfg)
    try:
        said = [e["message"] for e in run.store.events(run.id) if e["kind"] == "repair"]
    finally:
        run.close()
        run.store.close()
    assert any("index.lock" in m for m in said), said


def test_status_says_interrupted_when_the_runs_driver_was_killed(tmp_path):
    """A kill -9 leaves run.db saying "running" (nothing could record the stop) and the dead driver's PID in the lock
    file: before, `status`, `runs` and the review said "running" forever."""
    from harness.lifecycle import open_run
    from harness.report import status

    cfg = parse_config(TINY, "test")
    run = open_run(tmp_path / "runs" / "dead", cfg)
    run.store.set_run_status(run.id, "running")
    run.close()
    run.store.close()
    lock = tmp_path / "runs" / "dead" / "lock"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True,
                           text=True)
    lock.write_text(child.stdout.strip() + "\n")  # a PID that no longer lives
    assert status(tmp_path / "runs" / "dead")["status"] == "interrupted"
    lock.write_text(f"{os.getpid()}\n")  # a live holder: running
    assert status(tmp_path / "runs" / "dead")["status"] == "running"


def test_status_of_a_running_run_says_which_node_it_is_in(tmp_path):
    """A running run's status names its last node and what it said, the warm start included (before, nothing said
    where a run was until its first stage had a row: the warm start of a real checkpoint can take hours)."""
    import io

    from rich.console import Console

    from harness.lifecycle import open_run
    from harness.report import print_summary

    run = open_run(tmp_path / "runs" / "live", parse_config(TINY, "test"))
    run.store.set_run_status(run.id, "running")
    run.event(0, "setup", "node_start", "building the policy and warm-starting it on expert demonstrations")
    run.close()
    run.store.close()
    (tmp_path / "runs" / "live" / "lock").write_text(f"{os.getpid()}\n")
    out = io.StringIO()
    print_summary(tmp_path / "runs" / "live", Console(file=out, width=200))
    assert "now: stage 0 setup, since " in out.getvalue() and "warm-starting it" in out.getvalue(), out.getvalue()


def test_a_warm_start_copy_left_by_a_killed_writer_is_swept(tmp_path, monkeypatch):
    """A kill -9 mid-copy left `$EVOTRAINER_HOME/warmstart/.<key>.<pid>.tmp` for good (a checkpoint's size each);
    the next store removes it, and never a live writer's copy."""
    from harness import warmstart

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    root = warmstart.cache_root()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True,
                           text=True)
    dead, live = root / f".abc.{child.stdout.strip()}.tmp", root / f".abd.{os.getppid()}.tmp"
    for d in (dead, live):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    assert warmstart.store("k1", ckpt, {}) == root / "k1"
    assert not dead.exists() and live.exists()
    # a copy untouched for a day is a dead writer's whose pid a live process has since taken: swept too
    os.utime(live, (time.time() - warmstart.STALE_TMP_S - 60,) * 2)
    assert warmstart.store("k2", ckpt, {}) == root / "k2"
    assert not live.exists()


def test_a_start_killed_before_its_marker_leaves_a_folder_a_new_run_takes(tmp_path):
    """A kill right after the run lock was taken left a folder holding only `lock`: `run` refused it as not empty and
    `resume` as not a run folder, so only deleting it by hand helped; and the marker was written before config.yaml,
    so a kill between them left a marker beside an empty config that neither took."""
    run_dir = tmp_path / "runs" / "born"
    run_dir.mkdir(parents=True)
    (run_dir / "lock").write_text("999999999\n")
    (run_dir / "config.yaml.tmp").write_text("task: ma")
    start_run(parse_config(dict(TINY, budget={"stages": 1}), "test"), tmp_path / "runs", run_id="born")
    assert [s["stage"] for s in _check_consistent(run_dir)["stages"]] == [1] and not (run_dir / "config.yaml.tmp").exists()


def test_every_generator_config_and_the_recipe_seed_are_checked_before_the_run_folder_exists(tmp_path):
    """An `eval.env` or `warm_start.env` the generator cannot draw from failed after the warm start trained, its
    message naming `env.`; a `recipe.seed` of -1 failed in the warm start with no field named; a control character
    in a YAML file was a reader traceback. Each is one line before anything is made."""
    from harness.config import ConfigError, load_config, parse_config
    from harness.lifecycle import RunError, start_run

    # valid as a config, but no 3x3 board with 60% holes keeps every agent 4 apart: the generator gives up
    tight = {"min_distance": 4, "sizes": [{"size": 3, "data_ratio": 1.0, "hole_ratio": 0.6, "wait_ratio": 1.0,
                                           "agents": 2}]}
    for field, cfg in (("eval.env", {"eval": {"env": tight, "n": 8}}), ("warm_start.env", {"warm_start": {"env": tight}}),
                       ("env", {"env": tight})):
        with pytest.raises(RunError, match=rf"^{field}: .*{field}.min_distance") as exc:
            start_run(parse_config({"task": "mapf", "name": "g", **cfg}, "x"), tmp_path / "runs", run_id="g")
        assert "\n" not in str(exc.value) and not (tmp_path / "runs" / "g").exists()
    # a config that misses one seed of four is started (the run draws that seed from a replacement); two misses
    # refuse it with the generator's words (before: seed 0 alone failing refused a config that draws 99% of seeds)
    from harness.lifecycle import _check_generators
    from harness.tasks import get_task

    mapf = type(get_task("mapf"))
    real, bad = mapf.generate, {0}

    def generate(self, c, sd):
        if sd in bad:
            raise ValueError(f"could not draw seed {sd}; change env.min_distance")
        return real(self, c, sd)

    import unittest.mock

    with unittest.mock.patch.object(mapf, "generate", generate), \
            unittest.mock.patch.dict(os.environ, {"EVOTRAINER_INSTANCE_CACHE": "0"}):
        env = get_task("mapf").default_config().model_dump(mode="json")
        _check_generators(parse_config({"task": "mapf", "name": "g", "env": env}, "x"))
        bad.add(4)
        with pytest.raises(RunError, match=r"^env: could not draw seed 0; change env.min_distance"):
            _check_generators(parse_config({"task": "mapf", "name": "g", "env": env}, "x"))
    far = {**tight, "min_distance": 10}  # refused by the config itself, in the field's own words
    with pytest.raises(ConfigError, match=r"eval.env: min_distance 10 cannot fit .* lower eval.env.min_distance"):
        parse_config({"task": "mapf", "eval": {"env": far, "n": 8}}, "x")
    with pytest.raises(ConfigError, match="recipe.seed"):
        parse_config({"task": "mapf", "recipe": {"seed": -1}}, "x")
    p = tmp_path / "ctl.yaml"
    p.write_text("task: mapf\nname: a\x1bb\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_a_yes_or_no_where_a_number_belongs_is_refused_by_name():
    """`budget.wall_clock: true` was a one-second budget and `recipe.steps: true` one step (pydantic's lax mode); a
    flag still takes true/false."""
    from harness.config import ConfigError, parse_config

    for section, field in (("budget", "wall_clock"), ("recipe", "steps"), ("stage", "probe_n")):
        with pytest.raises(ConfigError, match=rf"{section}.{field}: true is not a value of this field"):
            parse_config({"task": "mapf", section: {field: True}}, "x")
    assert parse_config({"task": "mapf", "recipe": {"pipeline": False}}, "x").recipe["pipeline"] is False


def test_a_run_copied_without_its_wal_is_not_resumed_over(tmp_path):
    """A run folder copied while its run was going on, without run.db-wal: run.db holds no run, yet graph.db says the
    run got past its start. `resume` (and a gate answer) used to start it again from setup on top of its records and
    rewrite run.db (a reviewer: 4 KB -> 100 KB, after which even `status` read an empty run); now refused before
    anything is written, naming the -wal file. Would catch: the guard missing from resume or approve, or a guard that
    writes first."""
    import hashlib
    import shutil

    from test_store import left_in_wal  # tests/ is on sys.path (rootdir-relative "prepend" imports)

    from harness.lifecycle import answer_gate

    src = left_in_wal(tmp_path / "live" / "w1" / "run.db", "w1").parent
    dst = tmp_path / "runs" / "w1"
    dst.mkdir(parents=True)
    shutil.copyfile(src / "run.db", dst / "run.db")
    (dst / "graph.db").write_bytes(b"")  # the run got as far as its graph
    (dst / "config.yaml").write_text(yaml.safe_dump(dict(TINY)))
    (dst / ".evotrainer-run").write_text("w1\n")
    before = hashlib.sha256((dst / "run.db").read_bytes()).hexdigest()
    with pytest.raises(RunError, match="does not hold run 'w1'.*without run.db-wal"):
        resume_run(dst)
    with pytest.raises(RunError, match="does not hold run 'w1'"):
        answer_gate(dst, "approve")
    assert hashlib.sha256((dst / "run.db").read_bytes()).hexdigest() == before
    assert not (dst / "run.db-wal").exists() or (dst / "run.db-wal").stat().st_size == 0  # a reader's empty one


def test_config_edits_names_changed_added_and_removed_settings_and_lets_a_resume_change_its_own():
    """What `resume` compares (config.yaml against run.db's start): a key removed from a section falls back to its
    default, so it is an edit (a reviewer found it passed); what a resume may change (budget, engineer, scale,
    retention, gate.human, sandbox: the run's own hint says to set sandbox.allow_unisolated_diagnostics) is not."""
    from harness.lifecycle import config_edits

    start = {"env": {"a": 1, "b": 2}, "recipe": {}, "budget": {"stages": 3}, "sandbox": {"x": False},
             "gate": {"human": "never", "min_effect": 0.02}}
    assert config_edits(start, start) == []
    assert config_edits(start, {**start, "budget": {"stages": 9}, "sandbox": {"x": True},
                                "gate": {"human": "always", "min_effect": 0.02}}) == []
    assert config_edits(start, {**start, "env": {"a": 1}}) == ["env.b 2 -> (removed)"]
    assert config_edits(start, {**start, "recipe": {"steps": 3}}) == ["recipe.steps '(not set)' -> 3"]
    assert config_edits(start, {**start, "gate": {"human": "never", "min_effect": 0.05}}) == \
        ["gate.min_effect 0.02 -> 0.05"]
    assert config_edits(start, {**start, "new_section": {"k": 1}}) == []  # a field a later version added


def test_a_run_stopped_before_its_first_stage_starts_from_its_setup_and_says_so(tmp_path, monkeypatch):
    """A run killed after its folder was made but before the graph's first checkpoint (listed "creating" or
    "interrupted" with nothing recorded): `resume` starts it from its setup, and now says so in run.db and on the
    console (it used to say only "resumed", as if it went on from somewhere). Would catch a resume that feeds the graph
    nothing (LangGraph then has no state to continue) or says nothing of the fresh start."""
    from harness import lifecycle
    from harness.lifecycle import RunInterrupted

    real = lifecycle._drive_prepared
    monkeypatch.setattr(lifecycle, "_drive_prepared", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(RunInterrupted):
        start_run(parse_config(TINY, "test"), tmp_path / "runs", run_id="early")
    monkeypatch.setattr(lifecycle, "_drive_prepared", real)
    seen: dict = {}
    monkeypatch.setattr(lifecycle, "_drive", lambda run, first, reopen=None: seen.update(first=first))
    shown: list = []
    resume_run(tmp_path / "runs" / "early", progress=lambda kind, data: shown.append(data.get("message")))
    assert seen["first"] == {"run_id": "early", "stage": 0, "log": []}
    store = RunStore.open(tmp_path / "runs" / "early" / "run.db")
    try:
        said = [e["message"] for e in store.events("early") if e["kind"] == "fresh_start"]
    finally:
        store.close()
    want = "run early was stopped before its first stage began (nothing of it was recorded): it starts from its setup now"
    assert said == [want] and want in shown, (said, shown)


def test_a_started_run_whose_judge_file_is_gone_is_refused_not_judged_anew(tmp_path, monkeypatch):
    """The judge (judge.json) is fixed when a run starts; a folder restored without it was given a new judge made from
    the harness as its stages left it (a promoted env and recipe) and the config as edited since, and the gate's
    distribution moved mid-run while the resume said an edit "has no effect". Now such a run is refused with the fix
    named; a new run folder still makes its judge. Would catch the judge made again from a changed harness."""
    from harness import lifecycle
    from harness.run import JUDGE_FILE

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    cfg = parse_config({**TINY, "name": "jdg"})
    run_dir = tmp_path / "runs" / "jdg-1"
    made = lifecycle.open_run(run_dir, cfg)
    made.close()
    made.store.close()
    assert (run_dir / JUDGE_FILE).is_file()
    again = lifecycle.open_run(run_dir, cfg)  # an ordinary re-open
    again.close()
    again.store.close()
    (run_dir / JUDGE_FILE).unlink()
    with pytest.raises(RunError, match=r"judge\.json is missing: this run's judge was fixed when it started"):
        lifecycle.open_run(run_dir, cfg)
    assert not (run_dir / JUDGE_FILE).exists()


def test_an_engineer_asked_before_a_kill_and_again_on_the_resume_is_charged_both_times(tmp_path, monkeypatch):
    """The engineer is asked (another model's tokens and seconds), then the driver is killed before the answer is
    recorded: the resume asks again and pays again. Both asks belong in the ledger. Before, the second charge went
    under the same (stage, arm, kind, label) key and replaced the first, so the killed ask's tokens were lost. The
    engineer here is the rule engineer with a stated usage (the outside boundary's bill, not its reply). Would catch:
    the charge keyed so that a re-ask replaces it, or the resume not asking again (one row then)."""
    import harness.engineer as E
    import harness.graph as G
    from harness.engineer.proposal import EngineerUsage

    real_propose, real_retest = E.propose, G.signal_retest
    dead = {"on": True}

    def billed(*a, **kw):
        res = real_propose(*a, **kw)
        return res.model_copy(update={"usage": EngineerUsage(calls=1, prompt_tokens=90, completion_tokens=10,
                                                             seconds=2.0)})

    def killed_after_the_ask(run, k, *a, **kw):  # runs after the charge, before the answer is recorded
        if dead["on"]:
            raise KeyboardInterrupt
        return real_retest(run, k, *a, **kw)

    monkeypatch.setattr(E, "propose", billed)
    monkeypatch.setattr(G, "signal_retest", killed_after_the_ask)
    with pytest.raises(KeyboardInterrupt):
        start_run(parse_config(dict(TINY, budget={"stages": 1}), "test"), tmp_path / "runs", run_id="asked")
    dead["on"] = False
    run_dir = resume_run(tmp_path / "runs" / "asked")
    store = RunStore.open(run_dir / "run.db")
    try:
        rows = [r for r in store.ledger("asked") if r["kind"] == "engineer"]
    finally:
        store.close()
    assert sorted(r["label"] for r in rows) == ["local propose", "local propose, again 2"], rows
    assert sum(r["tokens"] for r in rows) == 200 and sum(r["seconds"] for r in rows) == pytest.approx(4.0)
