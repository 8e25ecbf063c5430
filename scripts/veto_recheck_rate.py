"""How often the gate's re-check of a veto's block (`harness.diagjudge.recheck_veto`) voids it: for an honest veto
(blocks a candidate paid more while it solves less; the seed skill `veto-reward-hacking`) and for a wall-clock time
bomb whose minute has come, each re-checked with N different seeds on the held-out rollouts the diagnostic judge's
tests use (real MAPF instances, the real scorer, the real sandbox). Wilson intervals at 95%.

    python scripts/veto_recheck_rate.py [N]        # N re-checks each (default 30)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_diagjudge as T

from harness import diagjudge as J
from harness.benchmarks.sequential import wilson


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 30
    held = T.heldout(T.SHAPED)
    for name, src in (("honest veto (reward up while valid fell)", T.HACK_VETO),
                      ("seed skill veto-reward-hacking", T.seed_skill_code("veto-reward-hacking")),
                      ("time bomb after its minute", T.BOMB.replace("WHEN", "0.0"))):
        t0 = time.perf_counter()
        void = sum(J.recheck_veto("diagnostics/d.py", src, held, seed=s) is not None for s in range(n))
        lo, hi = wilson(void, n)
        print(f"{name}: block void in {void}/{n} re-checks [{lo:.3f}, {hi:.3f}], "
              f"{(time.perf_counter() - t0) / n:.2f} s a re-check", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
