"""The sandbox runner: one adversarial test per guarantee, under real bubblewrap, plus the process fallback.

    .venv/bin/pytest tests/test_runner.py -q

Every test checks that the attack was contained AND that the parent (this pytest process) is unharmed.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from pathlib import Path

import pytest

from sandbox import runner
from sandbox.runner import Job, Limits, SandboxUnavailable, run_code, run_function, run_many, run_program

BW = {"require_bwrap": True}
FAST = Limits(cpu_s=2, wall_s=5)


def _uids_alive() -> list[int]:
    """Processes on the host owned by the sandbox uids of this process's jobs (leftovers would mean a job escaped its
    kill); other processes' jobs (another test worker's, pytest -n) have uids of their own block."""
    lo = 200_000 + (os.getpid() % 4096) * 4096  # sandbox.runner._job_uid's block for this process
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if lo <= p.stat().st_uid < lo + 4096:
                    out.append(int(p.name))
            except FileNotFoundError:
                continue
    return out


# --- the happy paths ---------------------------------------------------------------------------------------------


def test_snippet_function_and_program_return_results():
    r = run_code("result = sum(inputs['xs']) * 2", inputs={"xs": [1, 2, 3]}, **BW)
    assert (r.status, r.value, r.isolation) == ("ok", 12, "bwrap")
    src = "def diagnose(rollouts):\n    return {'n': len(rollouts), 'valid': sum(r['valid'] for r in rollouts)}\n"
    r = run_function(src, "diagnose", args=[[{"valid": True}, {"valid": False}]], **BW)
    assert r.value == {"n": 2, "valid": 1}
    r = run_program(["python", "p.py", "a"], files={"p.py": "import sys; print('arg', sys.argv[1])"}, **BW)
    assert (r.status, r.stdout, r.exit_code) == ("ok", "arg a\n", 0)
    r = run_code("raise ValueError('bad input')", **BW)
    assert r.status == "error" and "ValueError: bad input" in r.error and "Traceback" in r.stderr
    r = run_code("result = object()", **BW)
    assert r.status == "error" and "JSON" in r.error
    r = run_function("x = 1\n", "missing", **BW)
    assert r.status == "error" and "missing" in r.error


def test_programs_behave_like_the_interpreter():
    r = run_program(["python", "t.py"], files={"t.py": "def f():\n    raise KeyError('k')\nf()"}, **BW)
    assert (r.status, r.exit_code) == ("error", 1) and "KeyError: 'k'" in r.stderr
    r = run_program(["python", "t.py"], files={"t.py": "import sys\nsys.exit('bye')"}, **BW)
    assert (r.status, r.exit_code, r.stderr) == ("error", 1, "bye\n")
    r = run_program(["python", "-c", "import sys; print(sys.argv[1:])", "x"], **BW)  # exec'd interpreter path
    assert (r.status, r.stdout) == ("ok", "['x']\n")
    r = run_program(["/bin/sh", "-c", "echo $HOME; exit 4"], **BW)
    assert (r.status, r.stdout, r.exit_code) == ("error", "/scratch\n", 4)
    r = run_program(["/no/such/tool"], **BW)
    assert r.status == "error" and r.exit_code == 127 and "cannot run" in r.stderr


def test_a_forged_result_is_only_json(tmp_path):
    r = run_code("import os, sys\nos.write(int(sys.argv[2]), b'{not json')\nos._exit(0)", **BW)
    assert r.status == "error" and "non-JSON" in r.error


def test_function_from_a_file(tmp_path):
    f = tmp_path / "diag.py"
    f.write_text("def go(a, b=1):\n    return [a, b]\n")
    assert run_function(f, "go", args=[5], kwargs={"b": 7}, **BW).value == [5, 7]


# --- adversarial: one per guarantee ------------------------------------------------------------------------------


def test_infinite_loop_hits_the_cpu_limit():
    t = time.perf_counter()
    r = run_code("while True:\n    pass", limits=Limits(cpu_s=1, wall_s=10), **BW)
    assert r.status == "timeout" and "CPU" in r.error
    assert time.perf_counter() - t < 5


def test_sleeping_job_hits_the_wall_clock_and_everything_dies():
    r = run_code("import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(60)", limits=Limits(wall_s=1), **BW)
    assert r.status == "timeout" and 0.9 < r.duration_s < 4
    time.sleep(0.2)
    assert _uids_alive() == []


def test_memory_bomb_is_stopped():
    r = run_code("x = []\nwhile True:\n    x.append(bytearray(50 << 20))", limits=Limits(memory_mb=256), **BW)
    assert r.status == "memory"
    r = run_program(["python", "m.py"], files={"m.py": "b = bytearray(4 << 30)"}, limits=Limits(memory_mb=256), **BW)
    assert r.status == "memory"


def test_fork_bomb_is_contained():
    # bounded: count how many processes the job can hold at once -> at most the limit
    code = ("import os, time\nn = 0\npids = []\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError:\n"
            "        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    pids.append(pid)\n"
            "result = len(pids)")
    r = run_code(code, limits=Limits(processes=8), **BW)
    assert r.status == "ok" and 1 <= r.value < 8
    # the classic bomb: contained by the process limit and killed with the pid namespace at the wall clock
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = run_code(bomb, limits=Limits(processes=16, wall_s=2), **BW)
    assert r.status == "timeout"
    time.sleep(0.2)
    assert _uids_alive() == []
    assert os.fork is not None and len(os.listdir("/proc")) > 0  # parent still works


def test_deep_recursion_ends_the_job_not_the_parent():
    r = run_code("def f(n):\n    return f(n + 1)\nf(0)", **BW)
    assert r.status == "error" and "RecursionError" in r.error
    # unbounded: Python 3.11 keeps frames on the heap, so this grows until a limit ends it, within bounded time
    t = time.perf_counter()
    r = run_code("import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
                 limits=Limits(memory_mb=96, cpu_s=5, wall_s=10), **BW)
    assert r.status in ("error", "memory", "timeout", "killed") and time.perf_counter() - t < 12


def test_cannot_write_outside_scratch(tmp_path):
    target = tmp_path / "escaped.txt"
    code = ("import os\nres = {}\nfor p in inputs['paths']:\n    try:\n        open(p, 'w').write('x')\n"
            "        res[p] = 'written'\n    except OSError as e:\n        res[p] = type(e).__name__\n"
            "open('/scratch/ok.txt', 'w').write('fine')\nres['scratch'] = open('/scratch/ok.txt').read()\nresult = res")
    paths = [str(target), "/usr/evil", "/evil", "/root/.pyenv/evil", str(Path(runner.__file__))]
    r = run_code(code, inputs={"paths": paths}, **BW)
    assert r.status == "ok"
    assert r.value["scratch"] == "fine"
    assert all(r.value[p] != "written" for p in paths)
    assert not target.exists()
    r = run_code("open('/scratch/big', 'wb').write(b'x' * (3 << 20))", limits=Limits(file_size_mb=1), **BW)
    assert r.status in ("killed", "error") and r.status != "ok"


def test_python_path_is_importable_and_read_only(tmp_path):
    """Catches a library folder bound writable (a job could plant code the next job or the host imports) or not at
    all (a verifier's package would not import), and its siblings leaking in with it."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "trusted_mod.py").write_text("VALUE = 41\n")
    (tmp_path / "secret.txt").write_text("s3cret")
    code = ("import trusted_mod\nres = {'v': trusted_mod.VALUE + 1}\nfor p in inputs['paths']:\n    try:\n"
            "        open(p, 'w').write('x')\n        res[p] = 'written'\n    except OSError as e:\n"
            "        res[p] = type(e).__name__\ntry:\n    res['secret'] = open(inputs['secret']).read()\n"
            "except OSError as e:\n    res['secret'] = type(e).__name__\nresult = res")
    paths = [str(lib / "trusted_mod.py"), str(lib / "planted.py")]
    r = runner.run(Job(kind="code", code=code, inputs={"paths": paths, "secret": str(tmp_path / "secret.txt")},
                       python_path=[str(lib)]), **BW)
    assert r.status == "ok" and r.value["v"] == 42, r
    assert all(r.value[p] != "written" for p in paths) and r.value["secret"] != "s3cret", r.value
    assert (lib / "trusted_mod.py").read_text() == "VALUE = 41\n" and not (lib / "planted.py").exists()
    with pytest.raises(ValueError, match="python_path entry 'lib' must be an absolute path"):
        Job(kind="code", code="x = 1", python_path=["lib"])


def test_secrets_in_env_and_home_are_invisible(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_SECRET", "hunter2")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("password hunter2")
    monkeypatch.setenv("HOME", str(home))
    code = ("import os\nseen = dict(os.environ)\nres = {'env': 'hunter2' in str(seen)}\nfor p in inputs['files']:\n"
            "    try:\n        res[p] = open(p).read()\n    except OSError as e:\n        res[p] = type(e).__name__\n"
            "res['root'] = sorted(os.listdir('/root'))\nresult = res")
    files = [str(home / ".netrc"), str(Path.home() / ".netrc"), "/root/.bashrc", "/etc/passwd"]
    r = run_code(code, inputs={"files": files}, **BW)
    assert r.status == "ok" and r.value["env"] is False
    assert "hunter2" not in str(r.value)
    assert all(r.value[p] in ("FileNotFoundError", "PermissionError") for p in files)
    assert r.value["root"] == [".pyenv"]


def test_no_network_even_to_a_local_listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', inputs['port']), timeout=2)\n"
            "    result = 'connected'\nexcept OSError as e:\n    result = type(e).__name__")
    r = run_code(code, inputs={"port": port}, **BW)
    assert r.status == "ok" and r.value != "connected"
    with pytest.raises(TimeoutError):
        srv.accept()
    srv.close()


def test_cannot_signal_the_parent():
    code = ("import os, signal\nres = []\nfor pid in (inputs['parent'], os.getppid(), 1, -1):\n    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n        res.append('sent')\n    except OSError as e:\n"
            "        res.append(type(e).__name__)\nresult = res")
    r = run_code(code, inputs={"parent": os.getpid()}, **BW)
    # our pid does not exist in its pid namespace; its parent (bwrap, pid 1) is root's; kill(-1) finds nobody else
    assert r.status == "ok" and r.value == ["ProcessLookupError", "PermissionError", "PermissionError",
                                            "ProcessLookupError"]
    r = run_code("import os, signal\nos.killpg(0, signal.SIGKILL)", **BW)
    assert r.status == "killed" and "SIGKILL" in r.error  # it can only kill itself
    assert os.getpid() > 0  # and we are still here


def test_stdout_flood_is_capped_and_killed():
    t = time.perf_counter()
    r = run_code("while True:\n    print('x' * 1000)", limits=Limits(output_bytes=100_000, wall_s=20), **BW)
    assert r.status == "killed" and "output exceeded" in r.error
    assert len(r.stdout) <= 100_000
    assert time.perf_counter() - t < 5


def test_sys_exit_and_os_exit():
    assert run_code("import sys\nresult = 1\nsys.exit(0)", **BW).status == "ok"
    r = run_code("import sys\nsys.exit(3)", **BW)
    assert r.status == "error" and "SystemExit(3)" in r.error
    r = run_code("import os\nos._exit(5)", **BW)
    assert r.status == "error" and r.exit_code == 5 and "before returning" in r.error
    r = run_program(["python", "p.py"], files={"p.py": "import os; os._exit(7)"}, **BW)
    assert (r.status, r.exit_code) == ("error", 7)


@pytest.mark.parametrize("isolation", ["bwrap", "process"])
def test_any_exit_status_or_signal_is_an_ordinary_result(isolation):
    """An exit status past 128 + the last signal (bwrap reports a signal as 128 + its number) is the job's own exit
    code, and a real-time signal has no name in `signal.Signals`: before, both raised ValueError out of the runner
    (`os._exit(200)` in a policy's completion failed the code scorer's whole batch; an evolved diagnostic that did it
    on live data crashed the diagnose node at every stage; an outside review, eighty-second session)."""
    kw = BW if isolation == "bwrap" else {"isolation": "process"}
    r = run_code("import os\nos._exit(200)", **kw)
    assert (r.status, r.exit_code) == ("error", 200) and "code 200" in r.error, r
    r = run_program(["python", "p.py"], files={"p.py": "raise SystemExit(255)"}, **kw)
    assert (r.status, r.exit_code) == ("error", 255), r
    r = run_code("import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 6)", **kw)
    assert r.status == "killed" and "signal number" in r.error, r
    r = run_many([Job(kind="code", code=f"import os\nos._exit({c})") for c in (0, 201, 3)], **kw)
    assert [x.status for x in r] == ["error", "error", "error"]  # a batch survives a job's odd exit


def test_cannot_read_the_run_directory(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "heldout.jsonl").write_text("answer 42")
    code = ("import os\nres = {}\nfor p in inputs['paths']:\n    try:\n        res[p] = open(p).read()[:20]\n"
            "    except OSError as e:\n        res[p] = type(e).__name__\nres['cwd'] = os.getcwd()\nresult = res")
    paths = [str(run_dir / "heldout.jsonl"), str(Path.cwd() / "pyproject.toml"), str(Path(runner.__file__))]
    r = run_code(code, inputs={"paths": paths}, **BW)
    assert r.value["cwd"] == "/scratch"
    assert all(r.value[p] == "FileNotFoundError" for p in paths)


# --- the process fallback ----------------------------------------------------------------------------------------


def test_process_fallback_applies_the_same_limits(monkeypatch):
    monkeypatch.setenv("EVOTRAINER_SECRET", "hunter2")
    P = {"isolation": "process"}
    r = run_code("import os\nresult = [inputs['a'], 'hunter2' in str(os.environ), os.getcwd()]", inputs={"a": 1}, **P)
    assert r.isolation == "process" and r.value[:2] == [1, False] and r.value[2].endswith("scratch")
    assert run_code("while True:\n    pass", limits=Limits(cpu_s=1), **P).status == "timeout"
    assert run_code("x = bytearray(2 << 30)", limits=Limits(memory_mb=256), **P).status == "memory"
    r = run_code("while True:\n    print('y' * 1000)", limits=Limits(output_bytes=50_000), **P)
    assert r.status == "killed" and len(r.stdout) <= 50_000
    r = run_code("import time\ntime.sleep(30)", limits=Limits(wall_s=1), **P)
    assert r.status == "timeout" and r.duration_s < 3
    r = run_code("open('big', 'wb').write(b'x' * (3 << 20))", limits=Limits(file_size_mb=1), **P)
    assert r.status != "ok"
    r = run_code("import resource\nresult = resource.getrlimit(resource.RLIMIT_NOFILE)[0]",
                 limits=Limits(open_files=32), **P)
    assert r.value == 32


def test_missing_bwrap_warns_once_or_refuses(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    monkeypatch.setattr(runner, "_WARNED", False)
    with pytest.warns(RuntimeWarning, match="apt-get install bubblewrap"):
        r = run_code("result = 2")
    assert (r.status, r.value, r.isolation) == ("ok", 2, "process")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run_code("result = 3").value == 3  # warned once only
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_code("result = 1", require_bwrap=True)


# --- batch mode and bad input ------------------------------------------------------------------------------------


def test_run_many_keeps_order_and_isolates_failures():
    jobs = [Job(kind="code", code=f"result = {i} * {i}", limits=FAST) for i in range(6)]
    jobs.insert(2, Job(kind="code", code="raise RuntimeError('boom')"))
    jobs.append(Job(kind="program", argv=["python", "t.py"], files={"t.py": "assert 1 + 1 == 3"}))
    rs = run_many(jobs, workers=2, **BW)
    assert [r.value for r in rs[:2] + rs[3:7]] == [0, 1, 4, 9, 16, 25]
    assert rs[2].status == "error" and rs[7].status == "error" and "AssertionError" in rs[7].stderr
    assert all(r.isolation == "bwrap" for r in rs)


def test_bad_jobs_are_clear_errors():
    with pytest.raises(ValueError, match="relative path"):
        Job(kind="program", argv=["python", "x.py"], files={"../x.py": ""})
    with pytest.raises(ValueError, match="needs `function`"):
        Job(kind="function", code="x = 1")
    with pytest.raises(ValueError, match="needs `argv`"):
        Job(kind="program")
    with pytest.raises(ValueError, match="extra"):
        Limits(cpu=3)
    with pytest.raises(ValueError, match="workers"):
        run_many([], workers=-1)
