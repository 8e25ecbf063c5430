"""The source a cache key names, as this process imported it: `source_digest(files)` hashes the files (or folders) at
their first call and keeps that hash for the process. A process keeps running the code it imported, so a file edited
while it runs (an overnight run, a bench's reused worker) must not move what it makes to the edited code's key (an
outside review: it did, and the next run on the fixed code loaded an old-code warm start and held-out reading as its
own). `harness.tasks` takes both digests below when it is imported (it imports nothing from here but this module).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAW_CODE = ("harness/tasks", "harness/seeds.py")  # `harness.tasks.drawn`: what a built-in family's draw runs
WARM_START_CODE = ("policies", *DRAW_CODE, "harness/policy_glue.py")  # `harness.warmstart`
# what a held-out reading runs beyond that: the sandbox that scores a program, the evaluation's own decoding settings
# (`harness.evalcache`; an outside review found both outside its key)
READING_CODE = ("sandbox", "harness/evaluation.py")


@functools.cache
def source_digest(code: tuple[str, ...], root: Path = ROOT) -> str:
    """Hash of the source files (or the `.py` files of the folders) `code` names under `root`, as first read."""
    h = hashlib.sha256()
    for rel in code:
        p = root / rel
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()
