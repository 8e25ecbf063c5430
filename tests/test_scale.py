"""Backtest arms on Ray (`scale.backend: ray`), against a real local Ray cluster the run starts (num_cpus=2).

- the same seeds give the same arms under `local` and under Ray: identical training curves and identical backtest
  completions, arm by arm (and the candidate arms differ from the control arm, so the comparison can see a difference);
- a Ray worker SIGKILLed in the middle of an arm: Ray starts the arm again, it is recorded once, the run finishes;
- the driver SIGKILLed while arms are in flight: `evotrainer resume` finishes the run, nothing is recorded twice;
- bad input: Ray missing or an unreachable address is one line before anything trains; an arm no worker can host
  (it asks for a GPU the cluster lacks) fails its decision with the reason, and the run goes on.

    pytest tests/test_scale.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray", reason="Ray is the optional extra evotrainer[ray]; `make venv` installs it")

from conftest import wait_for_row

from harness.benchmarks.run import TINY, check_run
from harness.config import parse_config
from harness.lifecycle import RunError, resume_run, start_run
from harness.records import read_rollouts
from harness.store import RunStore

# easy 3x3 boards and a warm start that solves some of them: rewards vary inside groups, so GRPO moves the arms
EASY = {"sizes": [{"size": 3, "agents": 1, "hole_ratio": 0.0, "wait_ratio": 0.0}], "min_distance": 1}
# The engineer is scripted: these tests are about where arms run, so stage 1 always has the same two candidates
# (a rule engineer's proposals follow the tiny policy's probe, and a different draw can leave one skill firing)
SCRIPT = Path(tempfile.gettempdir()) / f"evotrainer-test-scale-{uuid.uuid4().hex}.yaml"
BASE = {**TINY, "name": "sc", "env": EASY, "warm_start": {"sft_examples": 400, "sft_steps": 150},
        "recipe": {**TINY["recipe"], "learning_rate": 1e-3, "temperature": 1.0},
        "budget": {"stages": 1}, "stage": {**TINY["stage"], "candidates": 2},
        "backtest": {"arm_steps": 2, "n": 16, "carry_confirm": 32}, "eval": {"suite": "small", "limit": 4},
        "engineer": {"kind": "scripted", "script": str(SCRIPT)}}
STAGE1 = {"candidates": [
    {"knob": "recipe.temperature", "value": 0.7, "rationale": "scripted", "expected": "a different arm"},
    {"knob": "recipe.learning_rate", "value": 5e-4, "rationale": "scripted", "expected": "a different arm"}]}
# arms take both CPUs, one at a time, with 2 torch threads: the same arithmetic as the local backend
RAY = {"backend": "ray", "num_cpus": 2, "arm_resources": {"num_cpus": 2}}


@pytest.fixture(scope="module", autouse=True)
def _home(tmp_path_factory):
    """One EVOTRAINER_HOME for the module: the warm start is trained once and loaded from the cache after that."""
    old = os.environ.get("EVOTRAINER_HOME")
    os.environ["EVOTRAINER_HOME"] = str(tmp_path_factory.mktemp("home"))
    key, value = TAG.split("=", 1)
    os.environ[key] = value
    SCRIPT.write_text(yaml.safe_dump([None, STAGE1]))
    yield
    SCRIPT.unlink(missing_ok=True)
    os.environ.pop(key, None)
    if old is None:
        os.environ.pop("EVOTRAINER_HOME", None)
    else:
        os.environ["EVOTRAINER_HOME"] = old


def _arms(run_dir: Path) -> dict[str, tuple[list[dict], list[str]]]:
    """arm -> (training curve without timings, backtest completions in order)."""
    store = RunStore.open(run_dir / "run.db")
    try:
        out = {}
        for row in store.db.execute("SELECT node FROM nodes WHERE run = ? AND node LIKE 'arm:%'", [run_dir.name]):
            r = store.node_result(run_dir.name, 1, row[0])
            curve = [{k: v for k, v in s.items() if k not in ("seconds", "generation_seconds")} for s in r["curve"]]
            out[row[0].removeprefix("arm:")] = (curve, [x.completion for x in read_rollouts(Path(r["rollouts"]))])
        return out
    finally:
        store.close()


def _state(run_dir: Path) -> dict:
    problems = check_run(run_dir, Path(os.environ["EVOTRAINER_HOME"]) / "skills.db")
    assert not problems, problems
    store = RunStore.open(run_dir / "run.db")
    try:
        return {"candidates": store.candidates(run_dir.name), "events": store.events(run_dir.name),
                "status": store.get_run(run_dir.name)["status"],
                "arms": [r[0].removeprefix("arm:") for r in store.db.execute(
                    "SELECT node FROM nodes WHERE run = ? AND node LIKE 'arm:%' ORDER BY node", [run_dir.name])]}
    finally:
        store.close()


def _recorded_once(run_dir: Path, st: dict) -> None:
    """Every arm came back once (one 'came back' event) and left one TensorBoard file: a worker that died mid-arm
    left nothing in the run directory or run.db."""
    assert sorted(st["arms"]) == ["control", "s1c1", "s1c2"], st["arms"]
    back = [e["message"].split()[1] for e in st["events"] if e["kind"] == "scale" and "came back" in e["message"]]
    assert sorted(back) == sorted(st["arms"]), back
    for name in st["arms"]:
        assert len(list((run_dir / "tensorboard" / "s1" / name).glob("events.out.tfevents.*"))) == 1, name


TAG = f"EVOTRAINER_TEST_SCALE={uuid.uuid4().hex}"  # in this module's environment: its clusters' workers inherit it


def _ray_arm_pids() -> list[int]:
    """Processes of THIS module's Ray workers running an arm right now (Ray titles them `ray::arm:<name>`; the
    module's tag in their environment, found as the soak benchmark finds its own, tells them from another Ray user's
    on the same machine, which the killer test must never touch and the leak checks must not count)."""
    from harness.benchmarks.soak import tagged

    var, value = TAG.split("=", 1)
    return [x["pid"] for x in tagged(value, var=var) if x["cmd"].startswith("ray::arm:")]


def test_ray_arms_match_local_arms(tmp_path):
    local = start_run(parse_config(BASE, "test"), tmp_path / "runs", run_id="local")
    # retention kept off for the Ray run: its checkpoints must be on disk to show they came back from the workers
    ray = start_run(parse_config({**BASE, "scale": RAY, "retention": {"delete_superseded": False}}, "test"),
                    tmp_path / "runs", run_id="ray")
    a, b = _arms(local), _arms(ray)
    assert set(a) == set(b) == {"control", "s1c1", "s1c2"}
    for name in a:
        assert a[name][0] == b[name][0], (name, a[name][0], b[name][0])  # same losses, rewards, tokens
        assert a[name][1] == b[name][1], name  # same backtest completions, sample by sample
    # the arms did learn something different, so equality above is not that of untouched copies
    assert any(a[c][1] != a["control"][1] for c in ("s1c1", "s1c2"))
    assert any(s["loss"] != 0 for s in a["control"][0])
    va, vb = _state(local), _state(ray)
    assert [(c["id"], c["status"], c["reason"]) for c in va["candidates"]] == \
        [(c["id"], c["status"], c["reason"]) for c in vb["candidates"]]
    assert any("submitted to Ray" in e["message"] for e in vb["events"] if e["kind"] == "scale")
    # the trained checkpoints and TensorBoard files came back into the run directory
    for name in ("control", "s1c1", "s1c2"):
        assert (ray / "checkpoints" / f"s1-{name}" / "model.safetensors").is_file()
        assert list((ray / "tensorboard" / "s1" / name).glob("events.out.tfevents.*"))
    assert not _ray_arm_pids(), "the local cluster outlived the run"


def test_a_ray_worker_killed_mid_arm_is_retried_and_recorded_once(tmp_path):
    killed: list[int] = []
    niceness: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set() and not killed:
            for pid in _ray_arm_pids():
                time.sleep(1.0)  # inside the arm (loading, training), not at its first instruction
                try:
                    niceness.append(os.getpriority(os.PRIO_PROCESS, pid))
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    continue
                break
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        run_dir = start_run(parse_config({**BASE, "scale": RAY}, "test"), tmp_path / "runs", run_id="kill")
    finally:
        stop.set()
        t.join(5)
    assert killed, "no Ray arm worker was ever seen to kill"
    # an arm on the local cluster runs at the run's own priority, not Ray's default niceness 15 (under which it
    # starved beside any other job on the machine)
    assert niceness and set(niceness) == {os.getpriority(os.PRIO_PROCESS, 0)}, niceness
    st = _state(run_dir)
    assert st["status"] == "finished"
    _recorded_once(run_dir, st)
    # every candidate got a real decision: its arm (or the control) was run again, not failed
    for c in st["candidates"]:
        assert c["status"] in ("promoted", "rejected", "inconclusive") and "arm failed" not in c["reason"], c


def _wait_for_event(run_dir: Path, text: str, proc: subprocess.Popen, timeout: float = 400) -> None:
    wait_for_row(run_dir, "SELECT COUNT(*) FROM events WHERE message LIKE ?", [f"%{text}%"], proc, f"event {text!r}",
                 timeout)


def test_driver_sigkill_with_arms_in_flight_then_resume(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({**BASE, "scale": RAY}))
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(cfg_path), "--runs-dir", str(runs),
                             "--run-id", "driver"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _wait_for_event(runs / "driver", "submitted to Ray", proc)
    deadline = time.time() + 60
    while not _ray_arm_pids() and time.time() < deadline:  # an arm is running on a worker
        time.sleep(0.1)
    assert _ray_arm_pids(), "no arm ever ran on a Ray worker"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_dir = resume_run(runs / "driver")
    st = _state(run_dir)
    assert st["status"] == "finished"
    _recorded_once(run_dir, st)
    kinds = [e["kind"] for e in st["events"]]
    assert "resumed" in kinds and kinds.count("finished") == 1
    deadline = time.time() + 30  # the killed driver's cluster went with it
    while _ray_arm_pids() and time.time() < deadline:
        time.sleep(0.5)
    assert not _ray_arm_pids()


def test_an_arm_no_worker_can_host_fails_its_decision_and_the_run_goes_on(tmp_path):
    cfg = parse_config({**BASE, "scale": {**RAY, "arm_resources": {"num_cpus": 1, "num_gpus": 1}}}, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="nogpu")
    st = _state(run_dir)
    assert st["status"] == "finished" and st["candidates"]
    for c in st["candidates"]:
        assert c["status"] == "rejected", c
        assert "the control arm failed" in c["reason"] and "asks 1 GPU per arm but the Ray cluster has 0" in \
            c["reason"], c["reason"]


def test_ray_missing_or_unreachable_is_one_line_before_anything_trains(tmp_path, monkeypatch):
    import harness.scale as S

    t0 = time.time()
    with pytest.raises(RunError, match=r"127\.0\.0\.1:1' cannot be reached .*ray start --head --port=1"):
        start_run(parse_config({**BASE, "scale": {"backend": "ray", "address": "127.0.0.1:1"}}, "test"),
                  tmp_path / "runs", run_id="far")
    assert time.time() - t0 < 10 and not (tmp_path / "runs" / "far").exists()
    # `auto` with no cluster running, and an open port that is not a Ray head (an HTTP server: it hung the first
    # backtest for ever): joined once at start, in a child with a time limit
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    with pytest.raises(RunError, match=r"scale.address 'auto': could not join the Ray cluster .*ray start --head"):
        start_run(parse_config({**BASE, "scale": {"backend": "ray", "address": "auto"}}, "test"),
                  tmp_path / "runs", run_id="auto")
    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(S, "JOIN_TIMEOUT_S", 20.0)
    try:
        with pytest.raises(RunError, match=r"no Ray cluster answered within 20 s|could not join the Ray cluster"):
            start_run(parse_config({**BASE, "scale": {"backend": "ray",
                                                      "address": f"127.0.0.1:{server.server_port}"}}, "test"),
                      tmp_path / "runs", run_id="http")
    finally:
        server.shutdown()
    assert not (tmp_path / "runs" / "auto").exists() and not (tmp_path / "runs" / "http").exists()
    monkeypatch.setattr(S, "ray_installed", lambda: False)
    with pytest.raises(RunError, match=r"Ray is not installed: pip install 'evotrainer\[ray\]'.*scale.backend: local"):
        start_run(parse_config({**BASE, "scale": {"backend": "ray"}}, "test"), tmp_path / "runs", run_id="none")
    assert not (tmp_path / "runs" / "none").exists()
    # the CLI prints it as one line and exits 2
    cfg_path = tmp_path / "far.yaml"
    cfg_path.write_text(yaml.safe_dump({**BASE, "scale": {"backend": "ray", "address": "127.0.0.1:1"}}))
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(cfg_path), "--runs-dir", str(tmp_path / "r")],
                       check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot be reached" in lines[0], p.stderr
    # config typos in the scale section name the key
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match=r"scale.arm_resources.num_gpu: unknown key"):
        parse_config({**BASE, "scale": {"backend": "ray", "arm_resources": {"num_gpu": 1}}}, "test")
    with pytest.raises(ConfigError, match=r"scale.backend"):
        parse_config({**BASE, "scale": {"backend": "dask"}}, "test")


def test_a_full_disk_on_a_ray_worker_stops_the_run_as_it_does_here():
    """A Ray arm's failure carries the arm's own exception as its cause: a worker's ENOSPC is a machine fault (the run
    stops, resumable) as it is for an arm run in this process; from its text alone it was the candidate's failure and
    the change was rejected for good (an outside review). No Ray needed: the error Ray hands back has a `cause`."""
    import errno

    from harness.faults import machine_fault
    from harness.scale import arm_failure

    class RayTaskError(Exception):  # ray.exceptions.RayTaskError's shape: the worker's exception as `.cause`
        def __init__(self, cause):
            super().__init__("ray::arm() failed")
            self.cause = cause

    full = arm_failure(RayTaskError(OSError(errno.ENOSPC, "No space left on device")), 1)
    assert machine_fault(full) == "no space left on device"
    assert machine_fault(arm_failure(RayTaskError(ValueError("a bad harness")), 1)) is None
