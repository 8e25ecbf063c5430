"""The runner's parent side and whole-job limits against hostile jobs (issue #15), under real bubblewrap.

    .venv/bin/pytest tests/test_runner_hostile.py -q

Each test is an attack that worked against the runner before this file existed (the issue lists them) and checks both
that it is contained and that `run()` returned a result instead of raising or hanging. Tests of a kernel limit skip,
with the reason, on a machine that cannot enforce it (no writable cgroup, no seccomp); the project machine and CI can.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from sandbox import runner
from sandbox.kernel import REFUSED, JobCgroup, cgroup_support, seccomp_program
from sandbox.runner import Limits, parse_result, run_code

BW = {"require_bwrap": True}
needs_cgroup = pytest.mark.skipif(cgroup_support() not in ("v1", "v2"),
                                  reason=f"whole-job memory cap unavailable here: {cgroup_support()}")


def _bounded(fn, seconds: float):
    """Run fn in a thread; fail (instead of hanging the suite) when it does not return within `seconds`."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"run() did not return within {seconds}s"
    return box["r"]


# --- the result channel: nothing the job puts on disk is ever opened by the parent ----------------------------------


def test_a_result_path_replaced_by_a_symlink_to_a_host_secret_leaks_nothing(tmp_path):
    secret = tmp_path / "root-only.txt"
    secret.write_text("TOP-SECRET-HOST-CONTENT")
    secret.chmod(0o600)
    for name in (".result", "result", ".job"):
        code = (f"import os\ntry:\n    os.symlink({str(secret)!r}, '/scratch/{name}')\nexcept OSError:\n    pass\n"
                "result = 'done'")
        r = run_code(code, **BW)
        assert r.status == "ok" and r.value == "done"
        assert "TOP-SECRET" not in repr(r)


def test_a_fifo_or_dev_zero_where_a_result_was_expected_does_not_hang_or_exhaust_the_parent():
    code = "import os\nos.mkfifo('/scratch/.result')\nos.symlink('/dev/zero', '/scratch/result')\nos._exit(0)"
    r = _bounded(lambda: run_code(code, limits=Limits(wall_s=5), **BW), 20)
    assert r.status == "error" and "before returning a value" in r.error
    # /dev/zero poured into the result channel itself: cut at the cap, the job killed
    flood = "import os, sys\nfd = int(sys.argv[2])\nz = open('/dev/zero', 'rb')\nwhile True:\n    os.write(fd, z.read(1 << 16))"
    r = _bounded(lambda: run_code(flood, limits=Limits(wall_s=10, result_bytes=1 << 20), **BW), 30)
    assert r.status == "error" and "result exceeded" in r.error


@pytest.mark.parametrize("payload,why", [
    (b"[" * 50_000, "nested"), (b'{"status": "ok", "error": null, "value": ' + b"9" * 5000 + b"}", "not UTF-8 JSON"),
    (b"\xff\xfe not utf8", "not UTF-8"), (b'{"status": "pwned", "error": null, "value": 1}', "bad status"),
    (b'{"status": "ok", "error": 7, "value": 1}', "bad status"), (b"[1, 2]", "not a result object"),
    (b'{"status": "ok", "error": null, "value": ' + b"[" * 500 + b"]" * 500 + b"}", "nested deeper"),
])
def test_forged_results_are_errors_never_exceptions(payload, why):
    with pytest.raises(ValueError, match=why):
        parse_result(payload)
    code = f"import os, sys\nos.write(int(sys.argv[2]), {payload!r})\nos._exit(0)"
    r = run_code(code, **BW)
    assert r.status == "error" and "unreadable or non-JSON result" in r.error and why.split()[0] in r.error


def test_print_output_comes_back():
    r = run_code("print('hello from the job')\nresult = 1", **BW)
    assert (r.status, r.value, r.stdout) == ("ok", 1, "hello from the job\n")
    r = run_code("import sys\nprint('partial', end='')\nsys.stderr.write('err-no-newline')\nresult = 2", **BW)
    assert r.stdout == "partial" and r.stderr == "err-no-newline"


# --- whole-job limits ---------------------------------------------------------------------------------------------


def test_many_files_cannot_fill_the_host_disk():
    before = shutil.disk_usage("/tmp").free
    code = ("import os\nn = 0\ntry:\n    for i in range(64):\n        with open(f'/scratch/f{i}', 'wb') as fh:\n"
            "            fh.write(b'x' * (4 << 20))\n        n += 1\nexcept OSError as e:\n    err = e.errno\n"
            "result = [n, err if n < 64 else None]")
    r = run_code(code, limits=Limits(scratch_mb=32, file_size_mb=16, memory_mb=512), **BW)
    assert r.status == "ok"
    written, err = r.value
    assert written <= 8 and err == 28  # ENOSPC at 32 MiB, not 256 MiB
    # the job tried 256 MiB; the slack is for other test workers writing to /tmp meanwhile (pytest -n)
    assert shutil.disk_usage("/tmp").free > before - (160 << 20)


@needs_cgroup
def test_several_processes_cannot_exceed_the_total_memory_cap():
    # 4 children of 200 MiB each, every one under the 384 MiB per-process address-space limit: 800 MiB in total
    code = ("import os, time\npids = []\nfor i in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            "        b = bytearray(200 << 20)\n        for j in range(0, len(b), 4096):\n            b[j] = 1\n"
            "        time.sleep(3)\n        os._exit(0)\n    pids.append(pid)\n"
            "codes = [os.waitpid(p, 0)[1] for p in pids]\nresult = codes")
    r = run_code(code, limits=Limits(memory_mb=384, wall_s=20, cpu_s=20), **BW)
    assert r.status == "memory" or (r.status == "ok" and any(c != 0 for c in r.value)), r
    # the same job under a cap that fits it runs to the end: the test can tell the two apart
    r = run_code(code.replace("200 << 20", "20 << 20"), limits=Limits(memory_mb=384, wall_s=20, cpu_s=20), **BW)
    assert r.status == "ok" and r.value == [0, 0, 0, 0]


@needs_cgroup
def test_a_child_that_leaves_the_session_is_killed_with_the_job(tmp_path):
    # process fallback: setsid() used to escape the process-group kill; the cgroup catches it. The marker's folder is
    # one the job's uid may write (a root caller's job runs as a fresh unprivileged uid), so only the kill stops it
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="evotrainer-marker-"))
    shared.chmod(0o777)
    marker = shared / "alive"
    code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1.5)\n"
            f"    open({str(marker)!r}, 'w').write('escaped')\n    os._exit(0)\nresult = 'parent done'")
    r = run_code(code, isolation="process")
    assert r.value == "parent done"
    time.sleep(2.5)
    assert not marker.exists()
    escaped = run_code(f"open({str(marker)!r}, 'w').write('x')\nresult = 1", isolation="process")
    assert escaped.value == 1 and marker.exists()  # the folder was writable: the kill, not a permission, stopped it
    shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="a root caller's case: run as root (CI does)")
@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="needs a system Python any user can read")
def test_the_process_fallback_never_runs_a_root_callers_job_as_root_where_it_can_drop(tmp_path, monkeypatch):
    """`EVOTRAINER_CODE_ISOLATION=process` under root ran the policy's programs as root (they could read and rewrite
    anything: the run folder, the judge, ~/.ssh). Now the job drops to a fresh unprivileged uid, as under bubblewrap,
    wherever a trial drop works (the system Python here); its own files work by relative and absolute path, and its
    temp folder is its own. Where the trial fails (here: a library folder only root can read), the job runs as root
    and that is said once, with the reason."""
    import warnings

    secret = tmp_path / "secret"
    secret.write_text("judge answers")
    secret.chmod(0o600)
    code = (f"import os, tempfile\nopen('mine.txt', 'w').write('ok')\ntry:\n    seen = open({str(secret)!r}).read()\n"
            "except OSError as exc:\n    seen = type(exc).__name__\nresult = [os.getuid(), os.geteuid(), seen, "
            "open(os.path.abspath('mine.txt')).read(), tempfile.gettempdir() == os.getcwd()]")
    system = Path(os.path.realpath("/usr/bin/python3"))
    monkeypatch.setattr(runner, "interpreter", lambda: system)
    monkeypatch.setattr(runner, "_RUNNABLE", {})
    monkeypatch.setattr(runner, "_ROOT_WARNED", False)
    r = run_code(code, isolation="process")
    assert r.status == "ok", r
    uid, euid, seen, mine, own_tmp = r.value
    assert uid != 0 and euid != 0 and seen == "PermissionError" and mine == "ok" and own_tmp, r.value
    # a library folder the dropped uid cannot read: the trial fails, the job runs as root, said once with why
    private = tmp_path / "lib"
    private.mkdir(mode=0o700)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        job = runner.Job(kind="code", code=code, python_path=[str(private)])
        r = runner.run(job, isolation="process")
        again = runner.run(job, isolation="process")
    assert r.status == "ok" and r.value[0] == 0 and r.value[2] == "judge answers", r.value
    assert again.value[0] == 0
    root_said = [str(w.message) for w in said if "runs jobs as root" in str(w.message)]
    assert len(root_said) == 1 and "PermissionError" in root_said[0], root_said


@pytest.mark.skipif(seccomp_program() is None, reason="no seccomp filter for this CPU architecture")
def test_no_nested_user_namespaces_and_the_filter_is_loaded():
    code = ("import subprocess\nout = {}\nfor flag in ('-U', '-m', '-n'):\n"
            "    p = subprocess.run(['/usr/bin/unshare', flag, 'true'], capture_output=True, text=True)\n"
            "    out[flag] = p.returncode\n"
            "out['seccomp'] = [l for l in open('/proc/self/status') if l.startswith('Seccomp:')][0].split()[1]\n"
            "result = out")
    r = run_code(code, limits=Limits(processes=32), **BW)
    assert r.status == "ok", r
    assert r.value["seccomp"] == "2"  # filter mode
    assert r.value["-U"] != 0 and r.value["-m"] != 0 and r.value["-n"] != 0
    assert {"unshare", "setns", "mount", "ptrace", "bpf"} <= set(REFUSED)
    # ordinary work still runs under the filter: threads, subprocesses
    r = run_code("import threading, subprocess\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
                 "result = subprocess.run(['/usr/bin/echo', 'ok'], capture_output=True, text=True).stdout", **BW)
    assert r.value == "ok\n"


def test_protections_say_what_is_and_is_not_capped():
    p = runner.protections()
    assert p["isolation"] == "bwrap" and p["seccomp"] is True
    assert p["disk"].startswith("capped")
    fallback = runner.protections("process")
    assert fallback["disk"].startswith("NOT capped") and "cannot" in fallback["seccomp"]


@needs_cgroup
def test_job_cgroups_are_removed_after_every_job():
    cg = JobCgroup.create(64, 4)
    parents = [d.parent for d in cg.dirs.values()]
    cg.remove()

    def ours() -> set[str]:
        return {n for d in parents for n in os.listdir(d) if n.startswith(f"evotrainer-job-{os.getpid()}-")}

    assert ours() == set()
    for code in ("result = 1", "import time\ntime.sleep(30)", "raise SystemExit(3)"):
        run_code(code, limits=Limits(wall_s=1), **BW)
    assert ours() == set()
