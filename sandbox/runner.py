"""Run untrusted code (engineer-written diagnostics, policy-written programs) in isolation; return a result, never raise.

    from sandbox.runner import run_code, run_function, run_program, run_many, Job, Limits
    r = run_code("result = sum(inputs['xs'])", inputs={"xs": [1, 2]})        # r.status == "ok", r.value == 3
    r = run_function(Path("diagnostics/x.py").read_text(), "diagnose", args=[rollouts])
    r = run_program(["python", "prog.py"], files={"prog.py": src})          # exit code 0 -> status "ok"
    rs = run_many([Job(kind="program", argv=[...], files={...}), ...], workers=2)

Inputs and the return value travel as JSON. The result (`RunResult`) says what happened (`status`: ok, error, timeout,
memory, killed), what came back (`value`, capped `stdout`/`stderr`), how long it took and which isolation was used.
The code's own failures (exceptions, exit codes, crashes, limits) are results, not exceptions; only bad arguments to
these functions raise (`ValueError`, `SandboxUnavailable`).

## What it does (bubblewrap, `isolation: bwrap`)
- A fresh mount namespace holding only /usr (+ the /bin, /lib, /lib64 links), the Python interpreter's own prefix
  (read-only), the job's `python_path` (trusted library folders such as a verifier's site-packages, read-only),
  minimal /dev and /proc, a 16 MiB tmpfs /tmp, the job spec read-only at /.job, and /scratch: a tmpfs of
  `scratch_mb` (nothing the job writes touches the host disk, and all its files together are capped). Not visible:
  the run directory, the project, home, held-out data, /etc, the rest of /root.
- New network (only a private loopback: no network at all), pid, ipc, uts and cgroup namespaces; `--die-with-parent`,
  `--new-session` (no terminal injection), no_new_privs (setuid binaries do not elevate).
- A seccomp filter (`sandbox.kernel`, x86_64 and aarch64): no new namespaces of any kind (so no nested user
  namespace), no mounts, ptrace, bpf, perf, userfaultfd, io_uring, keyring, modules, kexec, reboot; foreign ABIs kill.
- The code runs as a fresh unprivileged uid per job with no capabilities. This is why, when the caller is root, the
  user namespace is deliberately NOT unshared: a root-made user namespace maps the sandbox back to real uid 0, which the
  kernel exempts from RLIMIT_NPROC, so a fork bomb would not be stopped. Dropping to a unique real uid makes the process
  limit hold (and is per job, so concurrent jobs do not share it). A non-root caller gets `--unshare-all --uid 65534`.
- Whole-job limits through a cgroup per job where a writable hierarchy exists (v2, or v1 memory + pids): the resident
  memory of the job's whole process tree (tmpfs files included) is capped at `memory_mb`, its tasks at `processes`
  + 4, and every process of the job is killed at the end, whatever session or process group it moved to.
- setrlimit: CPU seconds, address space, file size, open files, processes; a wall-clock timeout that kills the whole
  sandbox (the pid namespace dies with bwrap); scrubbed environment; stdin is /dev/null; stdout/stderr capped (a job
  that floods past the cap is killed) and flushed before the job exits.
- One interpreter start per job: a small boot script applies the limits, drops privileges, writes the job's files,
  then runs the snippet, the function, or a `python prog.py` program in that same interpreter (other argv are exec'd).
  The boot imports only builtin modules. The value comes back as JSON on an inherited pipe, read with a cap
  (`result_bytes`) and parsed inside the error handling (never pickle/marshal; bad UTF-8, deep nesting, a wrong shape
  or status are an `error` result): the parent never opens a path inside the sandbox, so a symlink, FIFO or device put
  where a result file used to be is never read. A job can forge only its own result.
- `run()` never raises for anything a job does. `protections()` says which of the above hold on this machine.

## What it does NOT protect against
- Kernel exploits through the syscalls the filter allows, side channels, CPU contention with other jobs (no CPU
  shares: a job uses up to its CPU seconds), reading world-readable files under /usr.
- Without a writable cgroup (an unprivileged container), memory and processes are capped per process only (RLIMIT_AS,
  RLIMIT_NPROC): N processes may use N x `memory_mb`. `protections()` and `kernel.cgroup_support()` say so.
- The fallback (`isolation: process`, used when bwrap is missing, with a one-time warning) is a plain subprocess with
  the same rlimits, scrubbed environment and temp working directory (and the cgroup where available), but no seccomp
  and no disk cap (it writes to a host temp dir), and it sees the whole filesystem and network as the caller's user
  does; when the caller is root the job drops to a fresh unprivileged uid as under bubblewrap (so it reads only what
  any user may, and RLIMIT_NPROC holds) where such a uid can run the interpreter (`_drops_root`, tried once: a Python
  under a private /root, a user namespace whose map does not reach the uid, root without CAP_SETUID cannot, and there
  the job runs as root, with a one-time warning). Use `require_bwrap=True`
  wherever it matters: the loop's evolved diagnostics do.
"""

from __future__ import annotations

import itertools
import json
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox.kernel import JobCgroup, cgroup_support, seccomp_program

# --- public records -----------------------------------------------------------------------------------------------

Status = Literal["ok", "error", "timeout", "memory", "killed"]
WALL_CLOCK = "wall-clock limit"  # how a timeout by the wall clock (not the CPU limit) begins its `error`
Isolation = Literal["bwrap", "process"]


class SandboxUnavailable(RuntimeError):
    """bubblewrap was required (require_bwrap=True) but cannot be used on this machine."""


class Limits(BaseModel):
    """Resource limits of one job. Defaults suit a diagnostic or a unit-test program."""

    model_config = ConfigDict(extra="forbid")
    cpu_s: int = Field(10, ge=1, description="CPU seconds (RLIMIT_CPU); exceeding it ends the job with status timeout")
    wall_s: float = Field(20.0, gt=0, description="wall-clock seconds before the whole sandbox is killed (timeout)")
    memory_mb: int = Field(1024, ge=64, description="address space of each process in MiB (RLIMIT_AS) and resident "
                           "memory of the job's whole process tree (its cgroup, where one can be made); exceeding "
                           "either gives status memory")
    file_size_mb: int = Field(16, ge=1, description="largest file the job may write, MiB (RLIMIT_FSIZE)")
    scratch_mb: int = Field(64, ge=1, description="size of the /scratch filesystem under bubblewrap (a tmpfs; /tmp is "
                            "another 16 MiB): all the job's files together")
    result_bytes: int = Field(4_000_000, ge=1024, description="cap on the JSON result a code/function job returns")
    open_files: int = Field(64, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
    processes: int = Field(16, ge=1, description="processes/threads of the job's uid (RLIMIT_NPROC; "
                           "held for a root caller only where the job drops to its own uid)")
    output_bytes: int = Field(1_000_000, ge=1024, description="cap on stdout and on stderr each; beyond it: killed")


class Job(BaseModel):
    """One unit of work. kind=code: exec `code`, `inputs` is a global, the global `result` is the value.
    kind=function: exec `code` as a module and call `function(*args, **kwargs)`; its return is the value.
    kind=program: run `argv` ("python" means the sandbox's interpreter) in /scratch; exit code 0 is ok."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["code", "function", "program"]
    code: str = Field("", description="snippet (kind=code) or module source (kind=function)")
    function: str | None = Field(None, description="name of the function to call (kind=function)")
    args: list[Any] = Field(default_factory=list, description="JSON positional arguments (kind=function)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="JSON keyword arguments (kind=function)")
    inputs: dict[str, Any] = Field(default_factory=dict, description="JSON global `inputs` (kind=code)")
    argv: list[str] = Field(default_factory=list, description="program and arguments (kind=program)")
    files: dict[str, str] = Field(default_factory=dict, description="relative path -> text, written into /scratch first")
    python_path: list[str] = Field(default_factory=list, description="absolute host directories of TRUSTED libraries "
                                   "the job imports (a verifier's package and its dependencies): bound read-only at "
                                   "the same path and put first on sys.path")
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _check(self) -> Job:
        if self.kind == "function" and not self.function:
            raise ValueError("a kind='function' job needs `function` (the name to call in `code`)")
        if self.kind == "program" and not self.argv:
            raise ValueError("a kind='program' job needs `argv`, e.g. ['python', 'prog.py']")
        if self.kind in ("code", "function") and not self.code.strip():
            raise ValueError(f"a kind={self.kind!r} job needs `code` (the source to run)")
        for d in self.python_path:
            if not Path(d).is_absolute() or ".." in Path(d).parts or not Path(d).is_dir():
                raise ValueError(f"python_path entry {d!r} must be an absolute path to an existing directory")
        for rel in self.files:
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts or not p.parts or rel.startswith("."):
                raise ValueError(f"job file {rel!r} must be a plain relative path inside /scratch (no '..', no leading '.')")
        return self


class RunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Status
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    isolation: Isolation
    error: str | None = Field(None, description="what went wrong, one line (exception, signal, limit)")
    exit_code: int | None = Field(None, description="exit status of the sandboxed process; negative = signal")


# --- the boot script (runs inside the sandbox, before the untrusted code) ------------------------------------------

# argv: job_file result_fd scratch_dir. It applies the limits, drops privileges when asked, writes the job's files (as
# the job's uid, under its limits), then runs the job. The value goes back as JSON on the inherited pipe `result_fd`, so
# the parent never opens a path the job could have replaced. It imports only
# builtin modules for programs (marshal for the trusted job file; json, whose import costs tens of ms, only to write a
# value back; the parent reads results as JSON, never marshal, since the job could forge the file) and runs "python prog.py" programs in
# this same interpreter, so a job pays for one interpreter start, not two.
_BOOT = r"""
import marshal, os, resource, sys
with open(sys.argv[1], "rb") as fh:
    job = marshal.load(fh)
result_fd = int(sys.argv[2]); os.chdir(sys.argv[3])
L = job["limits"]; MB = 1 << 20
for lim, v in ((resource.RLIMIT_CPU, (L["cpu_s"], L["cpu_s"] + 1)), (resource.RLIMIT_AS, (L["memory_mb"] * MB,) * 2),
               (resource.RLIMIT_FSIZE, (L["file_size_mb"] * MB,) * 2), (resource.RLIMIT_NOFILE, (L["open_files"],) * 2),
               (resource.RLIMIT_NPROC, (L["processes"],) * 2), (resource.RLIMIT_CORE, (0, 0))):
    resource.setrlimit(lim, v)
if job["uid"] is not None:
    os.setgroups([]); os.setgid(job["uid"]); os.setuid(job["uid"])
del lim, v, L, MB
sys.path[:0] = job["python_path"]
for rel, text in job["files"].items():
    if os.path.dirname(rel):
        os.makedirs(os.path.dirname(rel), exist_ok=True)
    with open(rel, "w", encoding="utf-8") as fh:
        fh.write(text)
if job["kind"] == "program":
    os.close(result_fd)
    argv = job["argv"]
    if argv[0] == "python" and len(argv) > 1 and not argv[1].startswith("-"):
        # `python prog.py args`: run it here, as the interpreter would (uncaught exceptions and SystemExit included)
        sys.argv = argv[1:]
        with open(argv[1], "rb") as fh:
            code = compile(fh.read(), argv[1], "exec")
        del fh, job, result_fd, argv, marshal, resource
        g = {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__}
        exec(code, g)
        sys.exit(0)
    argv = [sys.executable if i == 0 and a == "python" else a for i, a in enumerate(argv)]
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        print(f"sandbox: cannot run {argv[0]!r}: {exc}", file=sys.stderr); os._exit(127)
from _json import encode_basestring_ascii as _estr  # C, no `re`: `import json` costs ~25 ms per job


def _dumps(v):  # JSON text of v with json.dumps' rules (NaN/Infinity allowed; int/float/bool/None keys -> strings)
    if v is None or v is True or v is False:
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, str):
        return _estr(v)
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        return "NaN" if v != v else "Infinity" if v == float("inf") else "-Infinity" if v == -float("inf") \
            else float.__repr__(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_dumps(x) for x in v) + "]"
    if isinstance(v, dict):
        items = []
        for k, x in v.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")
            items.append(_estr(k if isinstance(k, str) else _dumps(k).strip('"')) + ": " + _dumps(x))
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"Object of type {type(v).__name__} is not JSON serializable")


out = {"status": "ok", "value": "null", "error": None}  # value: JSON text
try:
    g = {"__name__": "__main__" if job["kind"] == "code" else "sandboxed", "__builtins__": __builtins__}
    if job["kind"] == "code":
        g["inputs"] = job["inputs"]
        exec(compile(job["code"], "<snippet>", "exec"), g)
        value = g.get("result")
    else:
        exec(compile(job["code"], "<module>", "exec"), g)
        if not callable(g.get(job["function"])):
            raise NameError(f"no function {job['function']!r} defined by the code")
        value = g[job["function"]](*job["args"], **job["kwargs"])
    out["value"] = _dumps(value)  # checked here: a value that is not JSON is the job's error, reported as such
except MemoryError:
    out = {"status": "memory", "value": None, "error": "MemoryError: the address-space limit was reached"}
except SystemExit as exc:
    if exc.code not in (None, 0):
        out = {"status": "error", "value": None, "error": f"SystemExit({exc.code!r})"}
except BaseException as exc:
    import traceback
    traceback.print_exc()
    out = {"status": "error", "value": None, "error": f"{type(exc).__name__}: {exc}"[:2000]}
for stream in (sys.stdout, sys.stderr):  # os._exit skips the interpreter's flush: the job's prints come back
    try:
        stream.flush()
    except BaseException:
        pass
try:
    data = ('{"status": %s, "error": %s, "value": %s}' % (_dumps(out["status"]), _dumps(out["error"]),
                                                        out["value"] if out["status"] == "ok" else "null")).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(result_fd, view):]
except (OSError, ValueError) as exc:
    print(f"sandbox: cannot write the result: {exc}", file=sys.stderr); os._exit(70)
os._exit(0)
"""

# --- choosing the isolation --------------------------------------------------------------------------------------

_PROBE: dict[str, str | None] = {}  # PATH -> bwrap path, or "" when unusable
_WARNED = False
_UIDS = itertools.count()
_INSTALL = "install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"


def python_prefix() -> Path:
    """The interpreter's own installation (the venv's python is a symlink into it), bound read-only into the sandbox."""
    return Path(sys.base_prefix).resolve()


def interpreter() -> Path:
    return Path(os.path.realpath(sys.executable))


def find_bwrap() -> str | None:
    """Path of a working bwrap (probed once per PATH), or None."""
    key = os.environ.get("PATH", "")
    if key not in _PROBE:
        exe = shutil.which("bwrap", path=key)
        ok = ""
        if exe:
            probe = subprocess.run([exe, "--unshare-net", "--unshare-pid", "--ro-bind", "/usr", "/usr", "--symlink",
                                    "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--dev", "/dev",
                                    "/usr/bin/true"], check=False, capture_output=True, timeout=20)
            ok = exe if probe.returncode == 0 else ""
        _PROBE[key] = ok
    return _PROBE[key] or None


def _isolation(require_bwrap: bool, isolation: str) -> tuple[Isolation, str | None]:
    global _WARNED
    if isolation not in ("auto", "process"):
        raise ValueError(f"isolation must be 'auto' or 'process', got {isolation!r}")
    if isolation == "process":
        if require_bwrap:
            raise ValueError("isolation='process' contradicts require_bwrap=True: drop one of them")
        return "process", None
    exe = find_bwrap()
    if exe:
        return "bwrap", exe
    if require_bwrap:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is required (require_bwrap=True) but is not usable here: {_INSTALL}; "
                                 "or pass require_bwrap=False to fall back to a plain subprocess (much weaker isolation)")
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"sandbox: bubblewrap not found, untrusted code runs as a plain subprocess (isolation: process); "
                      f"{_INSTALL}", RuntimeWarning, stacklevel=3)
    return "process", None


_ROOT_WARNED = False
_RUNNABLE: dict[tuple[str, ...], str | None] = {}

# run by the interpreter a job would use, as root: drop to the uid given, then do what a job's boot and program do
_DROP_PROBE = r"""
import os, sys
uid = int(sys.argv[1])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
import _json, json, re, tempfile
for p in sys.argv[2:]:
    os.listdir(p)
"""


def _drops_root(python_path: list[str]) -> bool:
    """May a root caller's job in the process fallback drop to an unprivileged uid, as bubblewrap's does? Only where
    such a uid can still run it, which is tried once per interpreter and library path (cached for the process): a
    child of this interpreter drops to the highest uid this process's jobs use, imports what a job imports and lists
    the job's `python_path`. It fails where the uid cannot be taken (a user namespace whose map does not reach it, root
    without CAP_SETUID) or cannot read the interpreter (a Python under a private /root, 0700). Else the job runs as
    root, said once with the reason."""
    global _ROOT_WARNED
    python = str(interpreter())
    key = (python, *python_path)
    if key not in _RUNNABLE:
        uid = 200_000 + (os.getpid() % UID_BLOCKS) * 4096 + 4095
        try:
            r = subprocess.run([python, "-I", "-S", "-c", _DROP_PROBE, str(uid), *python_path], capture_output=True,
                               text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
            lines = r.stderr.strip().splitlines()
            _RUNNABLE[key] = None if r.returncode == 0 else (lines[-1] if lines else f"exit {r.returncode}")[:200]
        except (OSError, subprocess.SubprocessError) as exc:
            _RUNNABLE[key] = f"{type(exc).__name__}: {exc}"[:200]
    why = _RUNNABLE[key]
    if why is not None and not _ROOT_WARNED:
        _ROOT_WARNED = True
        warnings.warn(f"sandbox: the process fallback runs jobs as root here: a job cannot drop to an unprivileged uid "
                      f"under this Python ({python}) and its library folders ({why}); install bubblewrap ({_INSTALL}), "
                      "or run where a job can take an unprivileged uid and read this Python", RuntimeWarning, stacklevel=4)
    return why is None


def _job_uid() -> int:
    """A fresh unprivileged uid per job (root callers), so RLIMIT_NPROC counts only this job's processes: 4096 per
    process, by its pid modulo UID_BLOCKS (every uid below 2^31; modulo 4096, two processes whose pids were 4096
    apart, e.g. an experiment's arms side by side, shared uids and each other's process limit)."""
    return 200_000 + (os.getpid() % UID_BLOCKS) * 4096 + next(_UIDS) % 4096


UID_BLOCKS = (2**31 - 1 - 200_000) // 4096  # 524,239 blocks of 4096 uids from 200,000 up, all below 2^31


# --- running one job ---------------------------------------------------------------------------------------------

_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}


def _bwrap_argv(exe: str, limits: Limits, uid: int | None, job_file: Path, seccomp_fd: int | None,
                python_path: list[str] = ()) -> list[str]:
    prefix = python_prefix()
    argv = [exe, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv",
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(16 << 20), "--tmpfs", "/tmp",
            "--perms", "1777", "--size", str(limits.scratch_mb << 20), "--tmpfs", "/scratch",
            "--ro-bind", str(job_file), "/.job", "--chdir", "/scratch"]
    if uid is None:  # not root: a user namespace maps us to an unprivileged id, NPROC counts per namespace
        argv[1:1] = ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    if seccomp_fd is not None:
        argv[1:1] = ["--seccomp", str(seccomp_fd)]
    for tree in [prefix, *(Path(d).resolve() for d in python_path)]:
        if tree.is_relative_to("/usr") or (tree != prefix and tree.is_relative_to(prefix)):
            continue
        for parent in reversed(tree.parents[:-1]):  # bwrap would make missing parents 0700: unreadable once we drop
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", str(tree), str(tree)]
    for k, v in {**_ENV, "HOME": "/scratch", "TMPDIR": "/scratch"}.items():
        argv += ["--setenv", k, v]
    return argv + ["--"]


_SECCOMP: dict[str, bytes | None] = {}


def _seccomp(exe: str) -> bytes | None:
    """The seccomp program when this bwrap can load it (probed once), else None."""
    if exe not in _SECCOMP:
        prog = seccomp_program()
        if prog is not None:
            r, w = os.pipe()
            os.write(w, prog)
            os.close(w)
            try:
                probe = subprocess.run([exe, "--seccomp", str(r), "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib",
                                        "/lib", "--symlink", "usr/lib64", "/lib64", "--dev", "/dev", "/usr/bin/true"],
                                       check=False, capture_output=True, timeout=20, pass_fds=(r,))
                prog = prog if probe.returncode == 0 else None
            finally:
                os.close(r)
        _SECCOMP[exe] = prog
    return _SECCOMP[exe]


def protections(isolation: str = "auto") -> dict[str, Any]:
    """What a job run here is confined by, in words: isolation, seccomp, whole-job memory/process caps, disk cap."""
    mode = "process" if isolation == "process" else ("bwrap" if find_bwrap() else "process")
    cg = cgroup_support()
    seccomp = mode == "bwrap" and _seccomp(find_bwrap() or "") is not None
    return {
        "isolation": mode,
        "seccomp": seccomp if seccomp else ("no: the process fallback cannot load one" if mode == "process"
                                            else "no: this bwrap/kernel cannot load the filter"),
        "total_memory_and_processes": f"capped (cgroup {cg})" if cg in ("v1", "v2")
        else f"NOT capped: {cg}; per-process RLIMIT_AS and RLIMIT_NPROC only",
        "disk": "capped (/scratch tmpfs of scratch_mb, /tmp 16 MiB)" if mode == "bwrap"
        else "NOT capped: the process fallback writes to a host temp dir (RLIMIT_FSIZE per file only)",
    }


def _capture(proc: subprocess.Popen, limits: Limits, result_r: int) -> tuple[bytes, bytes, bytes, str | None]:
    """Read stdout, stderr and the result pipe until EOF or the deadline; kill the sandbox on timeout, on an output
    flood, or on a result beyond its cap. Reads are bounded: nothing the job sends can grow a buffer past its cap."""
    sel = selectors.DefaultSelector()
    res_f = os.fdopen(result_r, "rb", buffering=0)
    caps = {proc.stdout: ("flood", limits.output_bytes), proc.stderr: ("flood", limits.output_bytes),
            res_f: ("result", limits.result_bytes)}
    bufs: dict[Any, bytearray] = {f: bytearray() for f in caps}
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    deadline = time.monotonic() + limits.wall_s
    reason = None
    grace = None  # once the main process is gone, stragglers holding the pipes get 0.5 s
    try:
        while sel.get_map() and reason is None:
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if grace is None and proc.poll() is not None:
                grace = min(deadline, now + 0.5)
            if grace is not None and now >= grace:
                break
            for key, _ in sel.select(timeout=min((grace or deadline) - now, 0.2)):
                chunk = key.fileobj.read(65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                kind, cap = caps[key.fileobj]
                bufs[key.fileobj] += chunk[: cap + 1 - len(bufs[key.fileobj])]
                if len(bufs[key.fileobj]) > cap:
                    reason = kind
                    break
    finally:
        sel.close()
        if reason or proc.poll() is None:
            _kill(proc)
        _kill(proc)  # stragglers of a finished job (fallback mode: the same process group)
        proc.wait()
        for f in bufs:
            f.close()
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), bytes(bufs[res_f]), reason


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _decode(b: bytes, cap: int) -> str:
    return b[:cap].decode("utf-8", errors="replace")


def run(job: Job, *, require_bwrap: bool = False, isolation: str = "auto") -> RunResult:
    """Run one job under the best isolation available (see the module docstring). Never raises for anything the job
    does (its failures, its output, a forged or hostile result): those are results.

    isolation="process" forces the plain-subprocess fallback (tests, benchmarks); require_bwrap=True refuses to run
    without bubblewrap (raises SandboxUnavailable saying how to install it)."""
    mode, exe = _isolation(require_bwrap, isolation)
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="evotrainer-sbx-"))
    cg = None
    fds: list[int] = []
    try:
        scratch = root / "scratch"  # the working directory of the process fallback (bwrap mounts a tmpfs instead)
        scratch.mkdir()
        uid = _job_uid() if os.geteuid() == 0 and (mode == "bwrap" or _drops_root(job.python_path)) else None
        if uid is not None and mode != "bwrap":  # the fallback's working folder: the job writes its files as its uid,
            os.chown(scratch, uid, uid)  # and reaches it by its absolute path too (HOME, TMPDIR, __file__): the folder
            root.chmod(0o711)  # above may be passed through, not listed; the job spec in it stays root's alone
        job_file = root / "job"
        job_file.write_bytes(marshal.dumps({**job.model_dump(mode="json"), "uid": uid}))
        job_file.chmod(0o600)
        result_r, result_w = os.pipe()
        fds += [result_r, result_w]
        python = str(interpreter())
        pass_fds = [result_w]
        if mode == "bwrap":
            prog = _seccomp(exe)
            seccomp_fd = None
            if prog is not None:
                seccomp_path = root / "seccomp.bpf"
                seccomp_path.write_bytes(prog)
                seccomp_fd = os.open(seccomp_path, os.O_RDONLY)
                fds.append(seccomp_fd)
                pass_fds.append(seccomp_fd)
            argv = _bwrap_argv(exe, job.limits, uid, job_file, seccomp_fd, job.python_path) + [
                python, "-I", "-S", "-c", _BOOT, "/.job", str(result_w), "/scratch"]
            env, cwd = {}, None
        else:
            argv = [python, "-I", "-S", "-c", _BOOT, str(job_file), str(result_w), str(scratch)]
            env, cwd = {**_ENV, "HOME": str(scratch), "TMPDIR": str(scratch)}, str(scratch)
        cg = JobCgroup.create(job.limits.memory_mb, job.limits.processes + 4)  # + bwrap's own processes
        proc = subprocess.Popen(cg.wrap(argv) if cg else argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True, close_fds=True,
                                pass_fds=pass_fds)
        for fd in fds[1:]:  # the parent keeps only the read end of the result pipe
            os.close(fd)
        fds = fds[:1]
        try:
            out, err, raw, reason = _capture(proc, job.limits, result_r)
        finally:
            fds = []  # _capture closed the read end
        oom = cg.oom_killed() if cg is not None else False
        res = _result(job, mode, proc.returncode, out, err, reason, raw, oom)
        res.duration_s = round(time.perf_counter() - t0, 4)
        return res
    finally:
        for fd in fds:
            os.close(fd)
        if cg is not None:
            cg.kill_all()
            cg.remove()
        shutil.rmtree(root, ignore_errors=True)


SIGNAL_MAX = max(signal.valid_signals())  # 64 on Linux: real-time signals included


def _signal_of(code: int, mode: str) -> int | None:
    """The signal that ended a job, from its exit status; None for an ordinary exit. bwrap reports a signalled child
    as 128 + signal, so there a status past 128 + SIGNAL_MAX is the job's own exit code (`os._exit(200)`: before, it
    was read as signal 72, and naming that raised out of the runner, failing a whole batch of scorings)."""
    if code < 0:
        return -code
    if mode == "bwrap" and 128 < code <= 128 + SIGNAL_MAX:
        return code - 128
    return None


def _signal_name(sig: int) -> str:
    """SIGKILL for 9; a real-time signal (no name of its own in `signal.Signals`) by its number."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"number {sig}"


_STATUSES = ("ok", "error", "timeout", "memory", "killed")


MAX_RESULT_DEPTH = 64  # a forged result nested deeper would break whoever walks it on a deeper stack


def _depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value`, walked without recursion (a forged one may be ~1,000 deep)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if deepest > MAX_RESULT_DEPTH:
                return deepest
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_result(raw: bytes) -> dict[str, Any]:
    """The boot's result object from the bytes the job side sent. Raises ValueError for anything else (bad UTF-8, bad
    or deeply nested JSON, a wrong shape): the job can forge this channel, so nothing in it is trusted."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict) or set(data) != {"status", "error", "value"}:
        raise ValueError("not a result object {status, error, value}")
    if _depth(data["value"]) > MAX_RESULT_DEPTH:  # deeper than any value the boot encodes (`enc` stops at 40)
        raise ValueError(f"result nested deeper than {MAX_RESULT_DEPTH} levels")
    if data["status"] not in _STATUSES or not (data["error"] is None or isinstance(data["error"], str)):
        raise ValueError(f"bad status or error field: {str(data['status'])[:50]!r}")
    return {"status": data["status"], "value": data["value"],
            "error": None if data["error"] is None else data["error"][:2000]}


def _result(job: Job, mode: Isolation, code: int, out: bytes, err: bytes, reason: str | None, raw: bytes,
            oom: bool) -> RunResult:
    cap = job.limits.output_bytes
    base = {"stdout": _decode(out, cap), "stderr": _decode(err, cap), "isolation": mode, "exit_code": code}
    if reason == "timeout":
        return RunResult(status="timeout", error=f"{WALL_CLOCK} of {job.limits.wall_s}s reached: killed", **base)
    if reason == "flood":
        return RunResult(status="killed", error=f"output exceeded {cap} bytes: killed", **base)
    if reason == "result":
        return RunResult(status="error", error=f"result exceeded {job.limits.result_bytes} bytes: killed", **base)
    sig = _signal_of(code, mode)
    if sig == signal.SIGXCPU:
        return RunResult(status="timeout", error=f"CPU limit of {job.limits.cpu_s}s reached (SIGXCPU)", **base)
    if oom and (code != 0 or job.kind == "program" or not raw):
        return RunResult(status="memory", error=f"the job's processes together exceeded {job.limits.memory_mb} MiB "
                         "(cgroup): killed", **base)
    if job.kind == "program":
        if code == 0:
            return RunResult(status="ok", **base)
        if "MemoryError" in base["stderr"][-4000:]:
            return RunResult(status="memory", error="MemoryError: the address-space limit was reached", **base)
        if sig is not None:
            return RunResult(status="killed", error=f"killed by signal {_signal_name(sig)}", **base)
        return RunResult(status="error", error=f"exit code {code}", **base)
    if raw and code == 0:
        try:
            data = parse_result(raw)
        except ValueError as exc:
            return RunResult(status="error", error=f"unreadable or non-JSON result: {exc}", **base)
        return RunResult(status=data["status"], value=data["value"], error=data["error"], **base)
    if sig is not None:
        return RunResult(status="killed", error=f"killed by signal {_signal_name(sig)}", **base)
    if "MemoryError" in base["stderr"][-4000:]:
        return RunResult(status="memory", error="MemoryError: the address-space limit was reached", **base)
    return RunResult(status="error", error=f"the code exited (code {code}) before returning a value", **base)


# --- conveniences and the batch mode -----------------------------------------------------------------------------


def run_code(code: str, inputs: dict[str, Any] | None = None, *, limits: Limits | None = None,
             files: dict[str, str] | None = None, require_bwrap: bool = False, isolation: str = "auto") -> RunResult:
    """exec a snippet; `inputs` is a global; whatever the snippet assigns to `result` is the value."""
    job = Job(kind="code", code=code, inputs=inputs or {}, files=files or {}, limits=limits or Limits())
    return run(job, require_bwrap=require_bwrap, isolation=isolation)


def run_function(source: str | Path, function: str, args: list[Any] | None = None,
                 kwargs: dict[str, Any] | None = None, *, limits: Limits | None = None,
                 require_bwrap: bool = False, isolation: str = "auto") -> RunResult:
    """Load `source` (text, or a Path read here, in the parent) as a module and call `function(*args, **kwargs)`."""
    code = Path(source).read_text(encoding="utf-8") if isinstance(source, Path) else source
    job = Job(kind="function", code=code, function=function, args=args or [], kwargs=kwargs or {},
              limits=limits or Limits())
    return run(job, require_bwrap=require_bwrap, isolation=isolation)


def run_program(argv: list[str], *, files: dict[str, str] | None = None, limits: Limits | None = None,
                require_bwrap: bool = False, isolation: str = "auto") -> RunResult:
    """Run a program in /scratch (files written there first); "python" as argv[0] is the sandbox interpreter."""
    job = Job(kind="program", argv=argv, files=files or {}, limits=limits or Limits())
    return run(job, require_bwrap=require_bwrap, isolation=isolation)


def run_many(jobs: list[Job], workers: int | None = None, *, require_bwrap: bool = False,
             isolation: str = "auto") -> list[RunResult]:
    """Run jobs on a pool of `workers` threads, each job in its own sandbox; results in input order. The default,
    2 x CPU count, keeps the cores busy while jobs start up (short jobs are bound by interpreter start latency)."""
    workers = workers or 2 * (os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    _isolation(require_bwrap, isolation)  # fail or warn once, up front
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda j: run(j, require_bwrap=require_bwrap, isolation=isolation), jobs))
