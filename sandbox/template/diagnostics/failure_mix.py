"""Example diagnostic: which failure type dominates the probe rollouts?

A diagnostic is one file in `diagnostics/` defining `diagnose(rollouts) -> dict`. It runs in the sandbox runner
(no network, no files outside its scratch directory, standard library only) and receives the rollouts as a list of
plain dicts with at least: `valid` (bool), `failure` (str or None), `reward` (float), `slices` (dict of str -> str).

It returns {"findings": [...], "metrics": {...}}:
- a finding is a dict with `code` (short name; the loop prefixes `evolved.<file>.`), `severity` (info|warn|critical),
  `count`, `rate` (0..1), optional `slice` ({"size": "5"}), `message`, and optional `knobs` it suggests;
- metrics are plain numbers, recorded with the stage.

Evolved diagnostics may only add findings or vetoes; they never change how held-out results are scored.
"""

from collections import Counter


def diagnose(rollouts):
    n = len(rollouts)
    failures = Counter(r["failure"] for r in rollouts if not r["valid"] and r.get("failure"))
    metrics = {"n": n, "failure_rate": (sum(failures.values()) / n) if n else 0.0}
    findings = []
    if failures:
        code, count = failures.most_common(1)[0]
        rate = count / n
        metrics["dominant_failure_rate"] = rate
        if rate >= 0.2:
            findings.append({
                "code": "dominant_failure",
                "severity": "warn" if rate < 0.5 else "critical",
                "count": count,
                "rate": rate,
                "message": f"{code} causes {count} of {n} rollouts to fail",
            })
    return {"findings": findings, "metrics": metrics}
