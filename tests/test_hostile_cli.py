"""Hostile input at the command line (issue 36): text from outside is never markup and never raw terminal escapes; a run
id or a stray folder never deletes user files; a YAML alias bomb is refused quickly; bad inputs are one line, exit 2.

    .venv/bin/pytest tests/test_hostile_cli.py -q

Every command goes through `python -m harness.cli` (the console script's `main`, which turns errors into one line).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from harness.benchmarks.run import TINY as BENCH_TINY
from harness.lifecycle import RUN_MARKER, RunError, resume_run
from harness.store import RunStore
from sandbox.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]
TINY = {**BENCH_TINY, "name": "t", "stage": {**BENCH_TINY["stage"], "candidates": 1},
        "recipe": {**BENCH_TINY["recipe"], "max_completion_length": 24},
        "backtest": {**BENCH_TINY["backtest"], "carry_confirm": 48}}  # as tests/test_run.py's: not 288-864 decodes
# markup that raises MarkupError, markup that would restyle, OSC (retitle), CSI (clear screen), BEL, C1 CSI, bidi
HOSTILE = "[/x] [/INST] [bold red]red[/] \x1b]0;pwned\x07 \x1b[2J \x9b31m \u202e"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def cli(*args: str, home: Path, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, check=False,
                          timeout=timeout, cwd=cwd or ROOT,
                          env={**os.environ, "EVOTRAINER_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


@pytest.fixture
def main(tmp_path, monkeypatch, capsys):
    """`evotrainer ARGS` in this process, through the console script's `main` (for the quick error paths)."""
    import harness.cli as C

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))

    def call(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["evotrainer", *args])
        with pytest.raises(SystemExit) as exc:
            C.main()
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, exc.value.code, out, err)

    return call


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for n in needles:
        assert n in r.stderr, r.stderr


def shown_safely(out: str) -> None:
    """The hostile text came through as text: literal brackets, control characters as visible escapes, none raw."""
    assert "[/x]" in out and "[/INST]" in out and "[bold red]red[/]" in out, out[-3000:]
    assert "\\x1b]0;pwned\\x07" in out and "\\x9b31m" in out and "\\u202e" in out, out[-3000:]
    assert not any(c in out for c in RAW), [c for c in RAW if c in out]


# --- text from outside through the CLI's printers -----------------------------------------------------------------------


def test_the_progress_printer_prints_hostile_event_messages_as_text(monkeypatch):
    """Catches: event messages rendered as rich markup (MarkupError on `[/x]`) or with raw escapes."""
    import io

    from rich.console import Console

    import harness.cli as C

    buf = io.StringIO()
    monkeypatch.setattr(C, "console", Console(file=buf, width=300, emoji=False))
    on_event = C._run_progress()
    on_event("reply_rejected", {"stage": 1, "node": "propose", "message": HOSTILE})
    on_event("node", {"stage": 1, "node": HOSTILE})
    on_event("step", {"stage": 1, "node": "train", "what": HOSTILE, "step": 1, "total": 1})
    shown_safely(buf.getvalue())


def _harness_snapshot(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()}


def _run_folder(runs: Path, run_id: str, status: str | None) -> tuple[Path, Workspace]:
    """A run folder as `evotrainer run` makes it, without training: marker, config, run.db (the run row, in `status`
    unless None) and an empty harness repo."""
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text(run_id)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(TINY))
    store = RunStore.open(run_dir / "run.db")
    store.create_run(run_id, TINY)
    if status is not None:
        store.set_run_status(run_id, status)
    store.close()
    return run_dir, Workspace.create(run_dir / "harness")


def _fake_run(runs: Path, run_id: str = "r1") -> Path:
    """A run folder as `evotrainer run` leaves it, without training: marker, config, run.db, and a harness repo with one
    rejected candidate whose summary, rationale and reason are hostile, and one promotion merged but not yet tagged
    (the state between a promotion's merge and its tag)."""
    run_dir, ws = _run_folder(runs, run_id, "running")
    recipe = ws.read("recipe.yaml")
    ws.propose("s1-c1", {"recipe.yaml": recipe.replace("temperature: 1.0", "temperature: 0.7")},
               summary="[/x] lower \x1b[2J temperature", rationale=HOSTILE, factor="recipe.temperature", stage=1)
    ws.reject("s1-c1", reason="lost: " + HOSTILE)
    ws.propose("s1-c2", {"recipe.yaml": recipe.replace("steps: 50", "steps: 9")}, summary="fewer steps",
               rationale="r", factor="recipe.steps", stage=1)
    d = ws.promote("s1-c2", {"effect": 0.1}, "won")
    for args in (["tag", "-d", d.tag], ["branch", "cand/s1-c2", d.candidate_sha]):  # the merge, before its tag
        subprocess.run(["git", *args], cwd=ws.path, check=True, capture_output=True)
    return run_dir


def test_review_report_and_status_show_hostile_text_and_never_repair_the_repo(tmp_path):
    """Catches: `review` crashing on a `[/x]` rationale or passing escapes through; the readers (review, report, status,
    runs) running the workspace's crash repair, which would tag a promotion mid-flight under the live run."""
    runs = tmp_path / "runs"
    run_dir = _fake_run(runs)
    before = _harness_snapshot(run_dir / "harness")
    r = cli("review", str(run_dir), home=tmp_path / "home")
    assert r.returncode == 0, r.stderr[-3000:]
    shown_safely(r.stdout)
    assert "lower \\x1b[2J temperature" in r.stdout
    r = cli("review", str(run_dir), "s1-c1", home=tmp_path / "home")  # the candidate's diff
    assert r.returncode == 0 and "temperature: 0.7" in r.stdout, r.stderr[-3000:]
    for args in (["report", str(run_dir)], ["status", str(run_dir)], ["runs", "--runs-dir", str(runs)]):
        r = cli(*args, home=tmp_path / "home")
        assert r.returncode == 0, (args, r.stderr[-3000:])
        assert not any(c in r.stdout for c in RAW), args
    assert _harness_snapshot(run_dir / "harness") == before  # refs, HEAD, index, objects: byte for byte
    assert Workspace(run_dir / "harness").repairs  # the writer still repairs it (tags the promotion)


def test_skills_list_and_show_print_a_hostile_trigger_as_text(tmp_path):
    """Catches: `skills list` rendering a trigger code as markup (MarkupError) or a skill's text with raw escapes."""
    from skills.library import SkillLibrary
    from skills.model import Intervention, Skill, Trigger

    home = tmp_path / "home"
    with SkillLibrary.open(home / "skills.db") as lib:
        lib.add(Skill(name="hostile-trigger", kind="env", trigger=Trigger(findings=[HOSTILE]),
                      intervention=Intervention(knob="env.sizes.{size}.hole_ratio", op="add", value=0.1),
                      expected="[/x] \x1b]0;pwned\x07", domains=["mapf"]))
    r = cli("skills", "list", "--home", str(home), home=home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[/x]" in r.stdout and "[/INST]" in r.stdout and not any(c in r.stdout for c in RAW), r.stdout
    r = cli("skills", "show", "hostile-trigger", "--home", str(home), home=home)
    assert r.returncode == 0 and "hostile-trigger" in r.stdout and not any(c in r.stdout for c in RAW), r.stdout


def test_an_error_quoting_hostile_text_is_one_line_without_raw_escapes(main):
    """Catches: a run id with escapes or markup reaching the terminal through the one-line error."""
    r = main("status", "[/x]\x1b]0;pwned\x07")
    one_line_error(r, "[/x]")
    assert not any(c in r.stderr for c in RAW), r.stderr


# --- a run id or a stray folder never deletes user files -------------------------------------------------------------


def _project(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A user's project folder: their own config.yaml and a harness/ folder (a git repo with work in it)."""
    proj = tmp_path / "proj"
    (proj / "harness").mkdir(parents=True)
    (proj / "config.yaml").write_text("my: settings\n")
    (proj / "harness" / "notes.md").write_text("my work\n")
    subprocess.run(["git", "init", "-q", str(proj / "harness")], check=True)
    return proj, _harness_snapshot(proj)


def test_run_id_dotdot_or_absolute_or_control_is_refused_and_nothing_is_touched(tmp_path, main):
    """Catches: `--run-id ..` making PROJ the run folder (its harness/ deleted, its config.yaml overwritten)."""
    proj, before = _project(tmp_path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    for rid in ("..", ".", "../proj", str(proj), "a/b", "a\x1bb", "x" * 300, ""):
        r = main("run", str(cfg), "--runs-dir", str(proj / "runs"), "--run-id", rid)
        one_line_error(r, "is not a plain name")
        assert not any(c in r.stderr for c in RAW)
    assert _harness_snapshot(proj) == before and not (proj / "runs").exists()


def test_a_new_run_never_writes_into_a_folder_it_did_not_make(tmp_path, main):
    """Catches: a run id naming an existing user folder: config.yaml overwritten, harness/ deleted."""
    proj, before = _project(tmp_path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    r = main("run", str(cfg), "--runs-dir", str(tmp_path), "--run-id", "proj")
    one_line_error(r, "already exists and is not empty")
    assert _harness_snapshot(proj) == before


def test_resume_of_a_foreign_folder_is_refused_and_nothing_is_touched(tmp_path, main):
    """Catches: `find_run` accepting any folder with a config.yaml, then `_prepare` deleting its harness/."""
    proj, before = _project(tmp_path)
    (proj / "config.yaml").write_text(yaml.safe_dump(TINY))  # even a valid run config is not enough
    before = _harness_snapshot(proj)
    for cmd in (["resume", str(proj)], ["approve", str(proj)], ["review", str(proj)]):
        r = main(*cmd)
        one_line_error(r, "is not a run folder")
        assert "neither" not in r.stderr  # a path is named once
    assert _harness_snapshot(proj) == before and not (proj / "run.db").exists()


def test_a_run_folder_whose_harness_is_not_ours_is_refused_not_deleted(tmp_path):
    """Catches: `_prepare` deleting any harness/ that is not a harness repo, even inside a real run folder."""
    run_dir = tmp_path / "runs" / "mine"
    (run_dir / "harness").mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("mine")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(dict(TINY, budget={"stages": 1})))
    (run_dir / "harness" / "precious.txt").write_text("not the tool's\n")
    subprocess.run(["git", "init", "-q", str(run_dir / "harness")], check=True)
    with pytest.raises(RunError, match="not a harness repo this tool made; nothing was deleted"):
        resume_run(run_dir)
    assert (run_dir / "harness" / "precious.txt").read_text() == "not the tool's\n"


# --- YAML alias bombs -------------------------------------------------------------------------------------------------

# the billion laughs as one flow mapping (~400 bytes): key i holds 9^9 "lol"s once its aliases are expanded; placed
# inside a free-form field (reasoning params, quick:) it passes validation and hangs whatever walks it next
BOMB = "{a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol], " + ", ".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")) + "}"


@pytest.mark.parametrize("name,doc,args", [
    ("env stats --config (reasoning params)", "datasets:\n  - {name: leg_counting, params: BOMB}",
     ["env", "stats", "--task", "reasoning", "--config", "{f}"]),
    ("train --config (its validation error)", "sizes: BOMB", ["train", "--out", "{tmp}/ckpt", "--config", "{f}"]),
    ("run (reasoning params)", "task: reasoning\nenv:\n  datasets:\n    - {name: leg_counting, params: BOMB}",
     ["run", "{f}", "--runs-dir", "{tmp}/runs"]),
    ("experiment --quick (quick: block)", ("run: {task: reasoning, env: {datasets: [{name: leg_counting}]}}\n"
     "quick: {env: {datasets: [{name: leg_counting, params: BOMB}]}}"), ["experiment", "{f}", "--quick", "--out",
                                                                       "{tmp}/exp"]),
], ids=["env-stats", "train", "run", "experiment-quick"])
def test_an_alias_bomb_is_refused_in_one_line_quickly(tmp_path, name, doc, args):
    """Catches: a ~500-byte billion-laughs document hanging the CLI (pydantic walking 9^9 nodes, or an error message
    printing the expanded input). On the unfixed code each of these runs until memory or the timeout runs out."""
    f = tmp_path / "bomb.yaml"
    text = doc.replace("BOMB", BOMB) + "\n"
    f.write_text(text)
    assert len(text) < 1000
    t0 = time.time()
    r = cli(*[a.format(f=f, tmp=tmp_path) for a in args], home=tmp_path / "home", timeout=60)
    one_line_error(r, "alias")
    assert time.time() - t0 < 30 and len(r.stderr) < 600, (time.time() - t0, len(r.stderr))


def test_a_validation_error_does_not_print_the_input(tmp_path, main):
    """Catches: a pydantic error message repeating a huge input value (`train --config` printed the whole input)."""
    f = tmp_path / "big.yaml"
    f.write_text(yaml.safe_dump({"sizes": [{"size": "x" * 2000, "hole_ration": "y" * 2000}] * 100}))
    r = main("train", "--out", str(tmp_path / "ckpt"), "--config", str(f))
    one_line_error(r, "sizes.0.size", "sizes.0.hole_ration", "and 195 more")
    assert len(r.stderr) < 1000 and "xxxx" not in r.stderr, len(r.stderr)  # 50 KB of repeated input before


# --- tracebacks instead of one line -----------------------------------------------------------------------------------


def test_bad_names_and_folders_are_one_line(tmp_path, main):
    """Catches: a 300-character run name (file name too long), --runs-dir /dev/null (not a folder) and an experiment
    YAML that is a list each ending in a traceback."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(dict(TINY, name="n" * 300)))
    one_line_error(main("run", str(cfg), "--runs-dir", str(tmp_path / "runs")), "name")
    cfg.write_text(yaml.safe_dump(TINY))
    one_line_error(main("run", str(cfg), "--runs-dir", "/dev/null"), "/dev/null")
    one_line_error(main("run", str(cfg), "--runs-dir", "/dev/null/runs"), "/dev/null")
    exp = tmp_path / "exp.yaml"
    exp.write_text("- run: {task: mapf}\n- arms: [fixed-random]\n")
    one_line_error(main("experiment", str(exp), "--out", str(tmp_path / "exp")), "mapping")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "exp").exists()


@pytest.mark.parametrize("over,field", [
    ({"seed": -1}, "seed"),
    ({"budget": {"stages": 2, "wall_clock": -5}}, "budget.wall_clock"),
    ({"budget": {"stages": 2, "wall_clock": float("inf")}}, "budget.wall_clock"),
    ({"budget": {"stages": 2, "wall_clock": 0}}, "budget.wall_clock"),
    ({"recipe": {**TINY["recipe"], "learning_rate": float("inf")}}, "learning_rate"),
    ({"env": {"min_distance": 1, "sizes": [{"size": 3, "data_ratio": float("nan")}]}}, "env.sizes.0.data_ratio"),
    ({"recipe": {**TINY["recipe"], "learning_rate": 1e10}}, "recipe.learning_rate"),  # trained, to NaN
    ({"stage": {**TINY["stage"], "train_instances": 10**9}}, "stage.train_instances"),  # drew until memory ran out
])
def test_nonsense_numbers_are_refused_before_the_run_folder_exists(tmp_path, main, over, field):
    """Before: a negative seed trained a warm start and a stage, then crashed in the probe naming nothing; a negative
    or infinite wall clock and a NaN data ratio trained; an infinite learning rate passed its "> 0" check."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, **over}))
    one_line_error(main("run", str(cfg), "--runs-dir", str(tmp_path / "runs")), field)
    assert not (tmp_path / "runs").exists()


def test_bad_environment_and_a_missing_script_are_refused_before_the_run_folder_exists(tmp_path, main, monkeypatch):
    """Before: a bad EVOTRAINER_THREADS left a run marked "running" forever, a missing engineer script was found after
    training (each stage then fell back to the rule engineer and the run exited 0), so was one that did not parse (an
    outside review), and `--stages 0` was ignored."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    runs = tmp_path / "runs"
    monkeypatch.setenv("EVOTRAINER_THREADS", "abc")
    one_line_error(main("run", str(cfg), "--runs-dir", str(runs)), "EVOTRAINER_THREADS")
    monkeypatch.delenv("EVOTRAINER_THREADS")
    monkeypatch.setenv("EVOTRAINER_CORES", "two")
    one_line_error(main("run", str(cfg), "--runs-dir", str(runs)), "EVOTRAINER_CORES")
    monkeypatch.delenv("EVOTRAINER_CORES")
    cfg.write_text(yaml.safe_dump({**TINY, "engineer": {"kind": "scripted", "script": str(tmp_path / "no.jsonl")}}))
    one_line_error(main("run", str(cfg), "--runs-dir", str(runs)), "engineer.script")
    for name, text in (("bad.yaml", "- {knob: [unclosed\n"), ("one.yaml", "knob: recipe.temperature\n")):
        (tmp_path / name).write_text(text)  # a script that does not parse, or is not a list of replies: the same
        cfg.write_text(yaml.safe_dump({**TINY, "engineer": {"kind": "scripted", "script": str(tmp_path / name)}}))
        one_line_error(main("run", str(cfg), "--runs-dir", str(runs)), "engineer.script")
    cfg.write_text(yaml.safe_dump(TINY))
    one_line_error(main("run", str(cfg), "--runs-dir", str(runs), "--stages", "0"), "budget.stages")
    assert not runs.exists()


def test_a_key_written_twice_or_an_empty_config_is_refused_in_one_line(tmp_path, main):
    """Before: PyYAML kept the last of two equal keys (`task: mapf` ... `task: math` trained math), and an empty file
    trained every built-in default."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY) + "task: math\n")
    one_line_error(main("run", str(cfg), "--runs-dir", str(tmp_path / "runs")), "'task' appears twice")
    cfg.write_text("")
    one_line_error(main("run", str(cfg), "--runs-dir", str(tmp_path / "runs")), "empty")
    assert not (tmp_path / "runs").exists()


def test_a_damaged_or_missing_run_database_is_one_line_and_readers_write_nothing(tmp_path, main):
    """Before: a corrupt run.db was a sqlite3 traceback in status/review/report, and `status` on a folder whose run.db
    was lost created an empty one (and said to start the run)."""
    d = tmp_path / "r1"
    d.mkdir()
    (d / RUN_MARKER).write_text("r1\n")
    (d / "config.yaml").write_text(yaml.safe_dump(TINY))
    for cmd in ("status", "review", "report"):
        one_line_error(main(cmd, str(d)), "run.db not found")
        assert not (d / "run.db").exists()
    (d / "run.db").write_bytes(os.urandom(8192))
    for cmd in ("status", "review", "report"):
        one_line_error(main(cmd, str(d)), "is not a readable run database")
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(main("bench", "scenarios", str(ROOT / "examples/scenarios/mapf-healthy.yaml"), "--quick", "--out",
                        str(afile)), "afile")


# --- end to end: a hostile engineer endpoint through `run` and `resume` ----------------------------------------------


class _Endpoint:
    """An OpenAI-compatible endpoint on 127.0.0.1 answering request i with replies[i]: (status, body) or "hold"
    (keeps the request open until released: the run is killed while waiting on it)."""

    def __init__(self, replies: list):
        self.replies, self.requests, self.release = list(replies), [], threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(self.path)
                reply = outer.replies.pop(0) if outer.replies else (503, "no more replies")
                if reply == "hold":
                    outer.release.wait(300)
                    reply = (503, "released")
                status, body = reply
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _chat(content: str) -> tuple[int, str]:
    return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


def test_run_and_resume_survive_hostile_replies_and_print_them_as_text(tmp_path):
    """Catches: the live progress printer dying on an engineer reply whose knob is `[/x]` (the run stops as
    interrupted) and on an HTTP 500 whose body holds `[/INST]` and escapes (every resume dies the same way).
    Stage 1's reply is rejected (its reason quotes the knob); stage 2's request is held open and the run SIGKILLed
    there; the resume re-enters stage 2's propose, gets the 500, and finishes."""
    bad_knob = json.dumps({"candidates": [{"knob": "[/x]", "value": 1, "rationale": HOSTILE, "expected": "e"}]})
    # each start and resume first asks for one token (the engineer pre-flight): "OK" before each stage reply
    with _Endpoint([_chat("OK"), _chat(bad_knob), "hold", _chat("OK"), (500, "<s>[INST] hi [/INST] " + HOSTILE)]) as ep:
        url = f"http://127.0.0.1:{ep.server.server_address[1]}/v1"
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(yaml.safe_dump(dict(TINY, engineer={"kind": "llm", "base_url": url, "model": "m",
                                                           "max_retries": 0, "timeout_s": 120})))
        home, runs, out = tmp_path / "home", tmp_path / "runs", tmp_path / "run.out"
        env = {**os.environ, "EVOTRAINER_HOME": str(home), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with out.open("w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(cfg), "--runs-dir", str(runs),
                                     "--run-id", "h"], env=env, stdout=fh, stderr=subprocess.STDOUT)
            try:
                t0 = time.time()
                while len(ep.requests) < 3:  # stage 2's propose is waiting on the endpoint
                    assert proc.poll() is None, out.read_text()[-3000:]
                    assert time.time() - t0 < 600, "stage 2 never asked the engineer"
                    time.sleep(0.2)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        first = out.read_text()
        assert "'[/x]'" in first and "Traceback" not in first and "MarkupError" not in first, first[-3000:]
        # where the run is, before anything trains (a fresh user had to `ls runs/` to find it)
        said = " ".join(first.split())  # the console wraps at its width
        # its first line, whatever the elapsed-time prefix reads on a loaded machine ("1s" under a parallel suite)
        assert re.match(rf"\d+s run h in {re.escape(str(runs / 'h'))}: `evotrainer status "
                        rf"{re.escape(str(runs / 'h'))}` from another shell", said), first[:500]
        assert not any(c in first for c in RAW)
        ep.release.set()
        r = cli("resume", str(runs / "h"), home=home, timeout=600)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert "[/INST]" in r.stdout and "\\x1b]0;pwned\\x07" in r.stdout, r.stdout[-3000:]
        assert "engineer_fallbacks: the llm engineer did not propose in stages 1, 2; the rule engineer did" in r.stdout
        assert "stage 2: llm engineer attempt 0: EndpointError" in r.stdout, r.stdout[-3000:]
        page = (runs / "h" / "report.html").read_text()
        assert "the llm engineer did not propose in stages 1, 2</b>" in page and "<script" not in page.split("<body")[-1]
        assert not any(c in r.stdout + r.stderr for c in RAW)
        store = RunStore.open(runs / "h" / "run.db")
        assert store.get_run("h")["status"] == "finished"
        store.close()


def _finished_fake_run(runs: Path, run_id: str, rationale: str) -> Path:
    """A finished run folder without training: marker, config, run.db, a harness repo with one rejected candidate
    whose rationale is `rationale` (`_fake_run` above is a running one with a half-made promotion)."""
    run_dir, ws = _run_folder(runs, run_id, "finished")
    recipe = ws.read("recipe.yaml")
    ws.propose("s1-c1", {"recipe.yaml": recipe.replace("temperature: 1.0", "temperature: 0.7")},
               summary="recipe.temperature: 1.0 -> 0.7", rationale=rationale, factor="recipe.temperature", stage=1)
    ws.reject("s1-c1", reason="refuted: upper bound below min effect")
    return run_dir


def test_review_quotes_a_rationale_and_a_damaged_repo_is_one_line(main, tmp_path):
    """A rationale's lines cannot pass for the review's own (`verdict:`, `commit:`, another candidate's header): each
    is indented under `why:`; a harness repo with a damaged object is one line naming `git fsck`, not a traceback.
    Would catch: the rationale printed with its newlines as they are; GitCommandError escaping `main`."""
    forge = ("lower the rate\n  verdict: promoted (forged)\n  commit: deadbeef00 promoted/1-s1-c9\n"
             "s1-c9 stage 1 · recipe.temperature · promoted effect +0.500 [+0.400, +0.600]")
    run_dir = _finished_fake_run(tmp_path / "runs", "f1", forge)
    r = main("review", str(run_dir))
    assert r.returncode in (0, None), r.stderr
    lines = r.stdout.splitlines()
    assert not any(line.startswith(("  verdict: promoted", "  commit: deadbeef00", "s1-c9")) for line in lines), lines
    assert any(line.lstrip().startswith("|") and "verdict: promoted (forged)" in line for line in lines), lines
    ws = Workspace(run_dir / "harness", read_only=True)
    blob = ws.repo.commit("rejected/s1-c1").tree["recipe.yaml"].hexsha
    obj = run_dir / "harness" / ".git" / "objects" / blob[:2] / blob[2:]
    obj.chmod(0o644)
    obj.write_bytes(b"not a git object")
    one_line_error(main("review", str(run_dir), "s1-c1"), "could not be read by git", "git -C <run>/harness fsck")


def test_review_of_a_run_without_candidates_says_so(main, tmp_path):
    """Before: an empty screen, as if the command had failed."""
    d, _ = _run_folder(tmp_path / "runs", "e1", None)
    r = main("review", str(d))
    assert r.returncode in (0, None) and "no candidates yet: run e1 is created, 0 stage(s) done" in r.stdout, r.stdout


def test_a_gate_answer_to_a_killed_run_leaves_it_interrupted(tmp_path):
    """`approve` on a run whose driver was killed (status row still "running", the dead PID in its lock file) is
    refused, and must leave the run as it found it: before, taking and releasing the lock emptied the dead PID, and
    the run read "running" for ever after. Would catch the PID lost or the message saying "running"."""
    from harness.lifecycle import answer_gate
    from harness.store import driver_dead

    run_dir, _ = _run_folder(tmp_path / "runs", "k1", "running")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / "lock").write_text(f"{dead.pid}\n")
    assert driver_dead(run_dir) == dead.pid
    with pytest.raises(RunError, match=f"status: interrupted: its driver, pid {dead.pid}, died; `evotrainer resume"):
        answer_gate(run_dir, "approve")
    assert driver_dead(run_dir) == dead.pid  # still read as interrupted


def test_a_refused_budget_on_a_killed_run_leaves_it_interrupted(tmp_path):
    """`resume RUN --stages N` refused before anything changed (a budget that would stop the run at once) must leave a
    killed driver's PID in the lock file, as a refused gate answer does: emptied, `status` read "running" for ever (an
    outside review). Would catch the lock released as if the resume had run."""
    from harness.lifecycle import resume_run
    from harness.store import driver_dead

    run_dir, _ = _run_folder(tmp_path / "runs", "k2", "running")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / "lock").write_text(f"{dead.pid}\n")
    with pytest.raises(RunError, match="nothing changed"):  # refused by the budget's own check, under the lock
        resume_run(run_dir, budget={"stages": 0})
    assert driver_dead(run_dir) == dead.pid  # still read as interrupted


def test_two_runs_started_in_one_second_get_a_folder_each(tmp_path, monkeypatch):
    """A made-up run id is the config's name and the second: a scripted sweep starting two runs at once collided
    ("already exists ... resume it", about a run live in the other process). The second now gets `<id>-2`; an id the
    user chose is still refused when taken. Would catch the folder claimed without an atomic mkdir."""
    import harness.lifecycle as lc
    from harness.config import parse_config

    monkeypatch.setattr(lc, "new_run_id", lambda config: "sweep-20261203-090531")
    monkeypatch.setattr(lc, "_drive_prepared", lambda run_dir, *a, **k: None)
    cfg = parse_config(dict(BENCH_TINY, name="sweep"), "t")
    first = lc.start_run(cfg, tmp_path / "runs")
    second = lc.start_run(cfg, tmp_path / "runs")
    assert (first.name, second.name) == ("sweep-20261203-090531", "sweep-20261203-090531-2")
    assert (second / RUN_MARKER).read_text().strip() == second.name
    with pytest.raises(RunError, match="already exists"):
        lc.start_run(cfg, tmp_path / "runs", run_id=first.name)


@pytest.mark.parametrize("boom", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: "
                                                              "can't allocate memory: you tried to allocate 8e12 bytes")])
def test_a_size_the_machine_cannot_hold_is_one_line_not_a_traceback(monkeypatch, capsys, boom):
    """`recipe.batch_size: 1e9` or `max_completion_length: 1e7` ended in an allocator traceback (after the warm start
    for the second); whatever raised it, the command now says one line naming the sizes to lower."""
    from harness import cli

    def app():
        raise boom

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out = capsys.readouterr().err
    assert exc.value.code == 2 and "out of memory" in out and "recipe.batch_size" in out and "Traceback" not in out
    other = RuntimeError("some other failure")
    monkeypatch.setattr(cli, "app", lambda: (_ for _ in ()).throw(other))
    with pytest.raises(RuntimeError, match="some other failure"):  # not every RuntimeError is the user's
        cli.main()


def test_a_value_error_from_a_library_is_one_line_that_says_where_it_came_from(monkeypatch, capsys):
    """The entry point reads a ValueError as the user's input (our checks raise them with their fix). One raised inside
    a library (a bug's, not the input's) was shown as if it were a config problem, with nothing to report. Now its one
    line names the module and line it came from and how to get the traceback; ours stay unchanged; with
    EVOTRAINER_DEBUG=1 the traceback is shown. Would catch: the suffix on our own errors, or a library's without it."""
    import json

    from harness import cli
    from harness.config import ConfigError

    def lib_error():
        json.loads("{")  # raised in json.decoder

    from harness.cli import UserError

    for boom, suffix in [(lib_error, "raised in json.decoder line"), (ConfigError("run.yaml: seed: bad"), None),
                         (UserError("--out x is a file"), None)]:
        monkeypatch.delenv("EVOTRAINER_DEBUG", raising=False)
        monkeypatch.setattr(cli, "app", boom if callable(boom) else (lambda b=boom: (_ for _ in ()).throw(b)))
        with pytest.raises(SystemExit) as exc:
            cli.main()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert (suffix in err and "EVOTRAINER_DEBUG=1" in err) if suffix else "EVOTRAINER_DEBUG" not in err, err
        monkeypatch.setenv("EVOTRAINER_DEBUG", "1")
        with pytest.raises(Exception):  # noqa: B017 - each its own type; the point is that it is raised, not said
            cli.main()


def test_our_errors_under_python_dash_m_carry_no_library_hint(tmp_path):
    """Under `python -m harness.cli` (soak, the run bench, scripts) cli.py is `__main__`, and every refusal raised
    there was labelled "raised in __main__ ..., not by evotrainer's checks". Would catch a check by module name."""
    import subprocess
    import sys

    (tmp_path / "f").write_text("x")
    r = subprocess.run([sys.executable, "-m", "harness.cli", "train", "--out", str(tmp_path / "f")],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "is a file" in r.stderr and "EVOTRAINER_DEBUG" not in r.stderr, r.stderr


def test_options_that_were_ignored_or_made_what_nobody_asked_for_are_refused_first(tmp_path, main):
    """A read-only attack found each: `eval --n 5` without --env scored the 'small' suite; `eval --suite X --env Y`
    scored Y; `env stats --seed-start 1e20` was an OverflowError traceback; `train --sft-examples 0 --sft-steps 500`
    saved an untrained checkpoint with exit 0; `skills list --home TYPO` made an empty library there and `--task TYPO`
    listed the general skills as that family's; `skills export` replaced hand-edited files; `bench scenarios --seeds
    51` or an arm twice was refused after printing the plan and left --out/lock; `experiment SCENARIO.yaml` said
    `oracle.env: Input should be a valid string`; `experiment --arms oracle` skipped it and trained the rest. Each is
    now one line, exit 2, before anything is loaded, trained or written."""
    one_line_error(main("eval", str(tmp_path / "no-ckpt"), "--n", "5"), "--n 5 sizes a draw from --env")
    one_line_error(main("eval", str(tmp_path / "no-ckpt"), "--suite", "small", "--env", "t.yaml"),
                   "both name the test set")
    r = main("env", "stats", "--seed-start", str(10**20), "--n", "3")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "seed-start" in r.stderr, r.stderr
    one_line_error(main("train", "--out", str(tmp_path / "ck"), "--sft-examples", "0", "--sft-steps", "500"),
                   "no demonstrations to train on")
    assert not (tmp_path / "ck").exists()
    one_line_error(main("skills", "list", "--home", str(tmp_path / "typo")), "holds no skill library")
    assert not (tmp_path / "typo").exists()
    one_line_error(main("skills", "list", "--task", "mpaf"), "no such task family (did you mean mapf?)")
    assert main("skills", "list", "--task", "math").returncode in (0, None)
    out = tmp_path / "exported"
    assert main("skills", "export", str(out)).returncode in (0, None)
    assert main("skills", "export", str(out)).returncode in (0, None)  # the same text again: rewritten, no question
    mine = min(out.glob("*.md"))
    mine.write_text(mine.read_text() + "\n# my note\n")
    one_line_error(main("skills", "export", str(out)), "say something else", mine.name, "--overwrite")
    assert mine.read_text().endswith("# my note\n")
    assert main("skills", "export", str(out), "--overwrite").returncode in (0, None)
    assert "# my note" not in mine.read_text()
    for args, said in [(("--seeds", "51"), "seeds:"), (("--arms", "oracle,oracle"), "an arm is listed twice")]:
        r = main("bench", "scenarios", str(ROOT / "examples" / "scenarios"), "--scenarios", "mapf-too-hard", *args,
                 "--out", str(tmp_path / "bs"))
        one_line_error(r, said)
        assert "Value error" not in r.stderr and "scenario mapf-too-hard" not in r.stdout, (r.stdout, r.stderr)
        assert not (tmp_path / "bs").exists()
    one_line_error(main("experiment", str(ROOT / "examples" / "scenarios" / "mapf-too-hard.yaml"), "--out",
                        str(tmp_path / "ex")), "is a scenario file", "evotrainer bench scenarios")
    one_line_error(main("experiment", str(ROOT / "examples" / "experiment_mapf.yaml"), "--arms",
                        "oracle,fixed-template", "--out", str(tmp_path / "ex")), "--arms oracle", "no known-good")
    assert not (tmp_path / "ex").exists()


@pytest.mark.parametrize("human,said,not_said", [
    ("sometimes", "gate.human: Input should be 'never' or 'always'; or a mapping of its fields", "literal["),
    ({"after_failures": 0}, "gate.human.after_failures: Input should be greater than or equal to 1", "'never'"),
    ({"after_failure": 2}, "gate.human.after_failure: unknown key", "HumanAfterFailures"),
])
def test_a_value_that_fits_no_member_of_a_union_is_one_reading_of_the_field(tmp_path, main, human, said, not_said):
    """`gate.human: sometimes` read `gate.human.literal['never','always']: ... gate.human.HumanAfterFailures: Input
    should be a valid dictionary or instance of HumanAfterFailures` (pydantic's names for a union's members); a
    mapping with a typo read both members' complaints. Now the field's own path, and only what applies."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "gate": {**TINY.get("gate", {}), "human": human}}))
    r = main("run", str(cfg), "--runs-dir", str(tmp_path / "runs"))
    one_line_error(r, said)
    assert not_said not in r.stderr and "Value error" not in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_an_engineer_endpoint_its_kind_never_uses_is_said_and_a_switched_kind_drops_it():
    """`engineer: {base_url: ..., model: ...}` without `kind: llm` ran the rule engineer and never said so. The run
    now warns at its start (`EngineerConfig.unused`, read by the setup node); `run --engineer rule` and an
    experiment's evolved-rule arm switch the kind on purpose and drop what it does not read (`switched`)."""
    from harness.config import EngineerConfig, switched

    eng = {"base_url": "http://127.0.0.1:1/v1", "model": "m", "temperature": 0.3}
    assert EngineerConfig(**eng).unused() == ["base_url", "model"]
    assert EngineerConfig(kind="llm", **eng).unused() == []
    assert EngineerConfig(kind="scripted", script="r.yaml", model="m").unused() == ["model"]
    assert switched({**eng, "kind": "llm"}, "rule") == {"temperature": 0.3, "kind": "rule"}
    assert switched({**eng, "kind": "rule"}, "llm") == {**eng, "kind": "llm"}
    assert switched(None, "rule") == {"kind": "rule"}
    assert EngineerConfig(**switched({**eng, "kind": "llm"}, "rule")).unused() == []


def test_only_commands_that_record_something_say_it_is_kept(monkeypatch):
    """An out-of-memory line ended "What the run recorded is kept: `evotrainer resume` continues it" after `env stats
    --n 1e11`, which has no run."""
    from harness.cli import _kept_hint

    assert "evotrainer resume" in _kept_hint(["run", "c.yaml"])
    assert "evotrainer resume" in _kept_hint(["resume", "--stages", "4", "r"])
    assert "same --out resumes" in _kept_hint(["bench", "scenarios"])
    assert _kept_hint(["bench", "rollout"]) == ""  # records nothing, has no --out
    assert _kept_hint(["env", "stats", "--n", "100000000000"]) == "" and _kept_hint([]) == ""


def test_a_capitalised_key_and_sibling_field_errors_are_never_read_as_a_union():
    """The first `union_merged` took any capitalised location part for a union member's name: `recipe: {Temperature:
    0.5}` read `recipe: Extra inputs are not permitted` (the key's name and "typo?" lost), two errors of a family's
    own fields `N` and `K` were merged into one line, and an error beside a nested one was dropped."""
    from pydantic import BaseModel, ConfigDict, Field

    from harness.config import _nested, parse_config

    with pytest.raises(ValueError) as exc:
        parse_config({"task": "mapf", "recipe": {"Temperature": 0.5, "Foo": 1}}, "x")
    assert "recipe.Temperature: unknown key" in str(exc.value) and "recipe.Foo: unknown key" in str(exc.value)

    class GridCfg(BaseModel):
        model_config = ConfigDict(extra="forbid")
        w: int = Field(1, ge=1)

    class Cfg(BaseModel):
        model_config = ConfigDict(extra="forbid")
        N: int = Field(4, ge=4)
        K: int = Field(1, ge=1)
        Grid: GridCfg = Field(default_factory=GridCfg)

    Cfg.model_rebuild(_types_namespace={"GridCfg": GridCfg})
    with pytest.raises(ValueError) as exc:
        _nested("env", Cfg, {"N": 2, "K": 0, "Grid": {"w": 0}})
    assert [x.split(":")[0] for x in str(exc.value).split("; ")] == ["env.N", "env.K", "env.Grid.w"], str(exc.value)


def test_an_export_refreshes_after_the_library_learns_and_an_old_arm_record_with_an_endpoint_still_matches(tmp_path):
    """Two review findings: re-exporting after a run recorded a try was refused as "says something else" (the check
    compared text, evidence included; now definitions and descriptions), and an evolved-rule arm recorded before
    `switched` dropped the experiment's endpoint was refused as made from other settings."""
    from harness.experiment import check_made_from
    from skills.library import SkillLibrary

    lib = SkillLibrary.open(tmp_path / "skills.db")
    try:
        [path] = lib.export(tmp_path / "out", names=["adopt-target"], overwrite=False)
        lib.record_try("adopt-target", promoted=True, effect=0.05, interval=(0.01, 0.09), run="r", candidate="c",
                       family="mapf")
        lib.export(tmp_path / "out", names=["adopt-target"], overwrite=False)  # refreshed, not refused
        assert "promotions: 1" in path.read_text()
    finally:
        lib.close()
    eng = {"kind": "rule", "base_url": "http://127.0.0.1:8000/v1", "model": "m"}
    folder = tmp_path / "arm"
    folder.mkdir()
    (folder / "made_from.json").write_text(json.dumps({"made_from": {"run": {"engineer": eng, "seed": 1}}}))
    check_made_from(folder, {"run": {"engineer": {"kind": "rule"}, "seed": 1}})
    with pytest.raises(ValueError, match="run.seed"):
        check_made_from(folder, {"run": {"engineer": {"kind": "rule"}, "seed": 2}})


def test_a_union_of_plain_types_is_one_reading_of_the_field_and_a_key_named_str_stays_a_key():
    """`budget: {wall_clock: [1]}` read `budget.wall_clock.str: Input should be a valid string` and
    `budget.wall_clock.float: ...` (pydantic's names for a `str | float | None` field's members); now the field's own
    path once. A key of one's own called `str` is not taken for a union's member when it alone fails."""
    from pydantic import BaseModel, ConfigDict, Field

    from harness.config import _nested, parse_config

    with pytest.raises(ValueError) as exc:
        parse_config({"task": "mapf", "budget": {"stages": 2, "wall_clock": [1]}}, "x")
    said = str(exc.value)
    assert "budget.wall_clock: Input should be a valid string; or Input should be a valid number" in said, said
    assert ".str:" not in said and ".float:" not in said, said

    class Cfg(BaseModel):
        model_config = ConfigDict(extra="forbid")
        str: int = Field(1, ge=1)

    with pytest.raises(ValueError) as exc:
        _nested("env", Cfg, {"str": 0})
    assert str(exc.value).split(":")[0] == "env.str", str(exc.value)


@pytest.mark.parametrize("data,said", [
    ({"recipe": {"stpes": 3}}, "recipe.stpes: unknown key (did you mean steps?)"),
    ({"stage": {"probe_nn": 4}}, "stage.probe_nn: unknown key (did you mean probe_n?)"),
    ({"backtst": {"n": 8}}, "backtst: unknown key (did you mean backtest?)"),
    ({"env": {"min_distanse": 1, "sizes": [{"size": 3, "data_ratio": 1.0}]}},
     "env.min_distanse: unknown key (did you mean min_distance?)"),
    ({"env": {"sizes": [{"size": 3, "data_ratoi": 1.0}]}}, "env.sizes.0.data_ratoi: unknown key (did you mean "),
    ({"recipe": {"zzz": 1}}, "recipe.zzz: unknown key (typo?)"),  # nothing close: as before
])
def test_a_misspelt_key_names_the_field_it_is_close_to(data, said):
    """A fresh user's `recipe.stpes` read "unknown key (typo?)" where the field it meant is one edit away (a
    walkthrough of the README); the scenario files already said which. Now every section does, nested ones and the
    task's generator config included. Would catch: the hint lost, or read from the wrong model."""
    from harness.config import parse_config

    with pytest.raises(ValueError) as exc:
        parse_config({"task": "mapf", **data}, "x")
    assert said in str(exc.value), str(exc.value)


def test_ctrl_c_during_train_says_what_out_holds(tmp_path, main, monkeypatch):
    """Ctrl-C during `train` exited 130 without a line (the user could not tell whether --out held a checkpoint).
    Now one line: before the checkpoint was written, --out is as it was and the partial training is gone; a Ctrl-C
    that lands between the swap's two renames (the old checkpoint moved aside, the new one not yet in) is held until
    the swap is whole, then said. The training is the real CLI's up to `train_policy`, which the user interrupts."""
    import os
    import signal

    import harness.policy_glue as glue

    def interrupted(task, path, **kw):
        Path(path, "config.json").write_text("{}")  # a partial save
        raise KeyboardInterrupt

    monkeypatch.setattr(glue, "train_policy", interrupted)
    out = tmp_path / "ck"
    r = main("train", "--out", str(out), "--sft-examples", "4", "--grpo-steps", "0")
    assert r.returncode == 130 and "before the checkpoint was written" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not out.exists() and os.listdir(tmp_path) == [], os.listdir(tmp_path)  # no staging folder left

    out.mkdir()
    (out / "weights").write_text("old")

    def trained(task, path, **kw):
        Path(path, "weights").write_text("new")
        return None, None, type("Rep", (), {"sft": None, "grpo": None})()

    monkeypatch.setattr(glue, "train_policy", trained)
    real = os.replace
    calls = []

    def replace(a, b):  # the user presses Ctrl-C right after the old checkpoint is moved aside
        real(a, b)
        calls.append(b)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace)
    r = main("train", "--out", str(out), "--sft-examples", "4", "--grpo-steps", "0", "--overwrite")
    monkeypatch.setattr(os, "replace", real)
    assert len(calls) == 2, calls  # both renames ran: the interrupt waited for the second
    assert r.returncode == 130 and "after the checkpoint was written" in r.stderr, r.stderr
    assert (out / "weights").read_text() == "new"
    assert os.listdir(tmp_path) == ["ck"], os.listdir(tmp_path)
