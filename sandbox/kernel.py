"""Whole-job limits the kernel enforces for the sandbox runner: a seccomp filter and a control group per job.

    from sandbox.kernel import seccomp_program, JobCgroup, cgroup_support
    bpf = seccomp_program()            # bytes for `bwrap --seccomp FD`, or None on an architecture we do not know
    cg = JobCgroup.create(memory_mb=512, pids=64)   # None when no writable cgroup hierarchy (cgroup_support() says why)
    argv = cg.wrap(argv)               # the job's first process joins the group before it execs; children inherit it
    ...; cg.kill_all(); cg.oom_killed(); cg.remove()

**seccomp.** A classic-BPF program (the format `seccomp_export_bpf` writes and `bwrap --seccomp` loads), written out
here rather than through libseccomp: its Python bindings are not on PyPI, and the filter is twenty instructions.
Refused with EPERM: creating or entering namespaces (`unshare`, `setns`, `clone` with CLONE_NEWUSER; `clone3`
answers ENOSYS so libc falls back to `clone`, whose flags the filter can read), mounting (`mount`, `umount2`,
`pivot_root`, `chroot` and the new mount API), `ptrace`, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring`, the
kernel keyring, module loading, `kexec`, `reboot`, `swapon/off`, `open_by_handle_at`, `acct`, `quotactl`. A syscall
from a foreign ABI (x32, i386 on x86_64) kills the process. Only x86_64 and aarch64 are known; elsewhere there is no
filter, and `seccomp_program()` returns None.

**cgroups.** One group per job under the caller's own group, in cgroup v2 (memory + pids controllers delegated) or v1
(the `memory` and `pids` hierarchies), whichever is writable. It caps the resident memory of the job's whole process
tree (swap off where the kernel allows), the number of its tasks, and lets the runner kill every process of the job,
including ones that left its session or process group. Without a writable hierarchy (an unprivileged container)
`JobCgroup.create` returns None and `cgroup_support()` names what is missing: the limits are then per process only
(RLIMIT_AS, RLIMIT_NPROC).
"""

from __future__ import annotations

import errno
import itertools
import os
import platform
import signal
import struct
import time
from pathlib import Path

# --- seccomp --------------------------------------------------------------------------------------------------------

_LD_W_ABS, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_ALLOW, _KILL_PROCESS = 0x7FFF0000, 0x80000000
_CLONE_NEWUSER = 0x10000000


def _errno(e: int) -> int:
    return 0x00050000 | e


# audit arch, x32 bit (syscalls at or above it are refused), and the numbers of the syscalls refused / inspected
_ARCH = {
    "x86_64": (0xC000003E, 0x40000000, {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ptrace": 101, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250, "add_key": 248,
        "request_key": 249, "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
        "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168, "open_by_handle_at": 304, "acct": 163,
        "quotactl": 179, "iopl": 172, "ioperm": 173,
    }, 56, 435),
    "aarch64": (0xC00000B7, None, {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ptrace": 117, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219, "add_key": 217,
        "request_key": 218, "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "reboot": 142, "swapon": 224, "swapoff": 225, "open_by_handle_at": 265, "acct": 89,
        "quotactl": 60,
    }, 220, 435),
}
REFUSED = tuple(sorted(_ARCH["x86_64"][2]))


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter as `struct sock_filter[]` bytes (little-endian), or None for an architecture not in the table."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        return None
    audit, x32, refused, clone, clone3 = _ARCH[machine]
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, 4),                      # A = seccomp_data.arch
        (_JEQ, 1, 0, audit),
        (_RET, 0, 0, _KILL_PROCESS),               # a foreign ABI (i386 on x86_64)
        (_LD_W_ABS, 0, 0, 0),                      # A = seccomp_data.nr
    ]
    if x32 is not None:
        prog += [(_JGE, 0, 1, x32), (_RET, 0, 0, _KILL_PROCESS)]
    prog += [(_JEQ, 0, 1, clone3), (_RET, 0, 0, _errno(errno.ENOSYS))]
    for nr in refused.values():
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, _errno(errno.EPERM))]
    prog += [
        (_JEQ, 0, 3, clone),
        (_LD_W_ABS, 0, 0, 16),                     # A = low 32 bits of args[0] (the clone flags)
        (_JSET, 0, 1, _CLONE_NEWUSER),
        (_RET, 0, 0, _errno(errno.EPERM)),
        (_RET, 0, 0, _ALLOW),
    ]
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


# --- cgroups --------------------------------------------------------------------------------------------------------

_SEQ = itertools.count()


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, fstype, options) of every cgroup mount."""
    out = []
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                out.append((parts[1], parts[2], parts[3].split(",")))
    except OSError:
        pass
    return out


def _own_groups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's group path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in (ctrls.split(",") if ctrls else [""]):
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _writable_dir(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK)


def _hierarchies() -> tuple[str, dict[str, Path]] | str:
    """('v2', {'': base}) or ('v1', {'memory': base, 'pids': base}), or a sentence saying why neither is usable."""
    mounts, own = _mounts(), _own_groups()
    for point, fstype, _ in mounts:
        if fstype != "cgroup2":
            continue
        base = Path(point) / own.get("", "/").lstrip("/")
        try:
            ctrls = (base / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if "memory" in ctrls and _writable_dir(base):
            return "v2", {"": base}
    v1: dict[str, Path] = {}
    for point, fstype, opts in mounts:
        if fstype == "cgroup":
            for ctrl in ("memory", "pids"):
                if ctrl in opts and ctrl in own:
                    base = Path(point) / own[ctrl].lstrip("/")
                    if _writable_dir(base):
                        v1[ctrl] = base
    if "memory" in v1:
        return "v1", v1
    return ("no writable cgroup hierarchy with a memory controller (cgroup v2 with memory delegated, or a writable "
            "v1 memory hierarchy); an unprivileged container usually has neither")


def cgroup_support() -> str:
    """'v2', 'v1', or a sentence saying why the job's total memory cannot be capped here."""
    found = _hierarchies()
    return found if isinstance(found, str) else found[0]


class JobCgroup:
    """One control group holding one job's process tree. Create with `JobCgroup.create(...)`."""

    def __init__(self, version: str, dirs: dict[str, Path], memory_bytes: int) -> None:
        self.version, self.dirs, self.memory_bytes = version, dirs, memory_bytes

    @classmethod
    def create(cls, memory_mb: int, pids: int) -> JobCgroup | None:
        found = _hierarchies()
        if isinstance(found, str):
            return None
        version, bases = found
        name = f"evotrainer-job-{os.getpid()}-{next(_SEQ)}"
        dirs: dict[str, Path] = {}
        mem = memory_mb << 20
        try:
            for ctrl, base in bases.items():
                d = base / name
                d.mkdir()
                dirs[ctrl] = d
            if version == "v2":
                d = dirs[""]
                (d / "memory.max").write_text(str(mem))
                _try_write(d / "memory.swap.max", "0")
                _try_write(d / "pids.max", str(pids))
            else:
                m = dirs["memory"]
                (m / "memory.limit_in_bytes").write_text(str(mem))
                _try_write(m / "memory.memsw.limit_in_bytes", str(mem))
                _try_write(m / "memory.swappiness", "0")
                if "pids" in dirs:
                    (dirs["pids"] / "pids.max").write_text(str(pids))
        except OSError:
            cls(version, dirs, mem).remove()
            return None
        return cls(version, dirs, mem)

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def wrap(self, argv: list[str]) -> list[str]:
        """argv prefixed so that its first process joins this group before exec (so every child is born inside)."""
        script = 'for f in "$@"; do case "$f" in --) shift; break;; esac; echo $$ > "$f" || exit 125; shift; done; ' \
                 'exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *self.procs_files, "--", *argv]

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out.update(int(x) for x in Path(f).read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(out)

    def kill_all(self, wait_s: float = 2.0) -> None:
        """SIGKILL every process in the group (those that escaped the session or process group too)."""
        if self.version == "v2" and _try_write(self.dirs[""] / "cgroup.kill", "1"):
            self._wait_empty(wait_s)
            return
        deadline = time.monotonic() + wait_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def _wait_empty(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.01)

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer (or the limit) stopped something in this group."""
        try:
            if self.version == "v2":
                for line in (self.dirs[""] / "memory.events").read_text().splitlines():
                    k, v = line.split()
                    if k in ("oom_kill", "oom_group_kill") and int(v) > 0:
                        return True
                return False
            m = self.dirs["memory"]
            for line in (m / "memory.oom_control").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v) > 0
            return int((m / "memory.failcnt").read_text()) > 0  # older kernels: the limit was hit at least once
        except (OSError, ValueError, KeyError):
            return False

    def peak_bytes(self) -> int | None:
        f = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        d = self.dirs["" if self.version == "v2" else "memory"]
        try:
            return int((d / f).read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _try_write(p: Path, text: str) -> bool:
    try:
        p.write_text(text)
        return True
    except OSError:
        return False
