#!/usr/bin/env python3
"""How much each scaffold method's knowledge was used, from recorded runs (docs/scaffolds.md).

    python3 scripts/scaffolds_report.py runs/scaffolds/edge-seed1 runs/scaffolds/pats-seed1 ...

Reads each run's data pool (`pool.sqlite`, read-only; docs/pool.md) and prints, per run: the share of training trajectories that started with injected text (or got
it at a later turn), their success against the plain trajectories of the same groups, and the
number of groups where both kinds played. Only the standard library is used.
"""
import os
import sqlite3
import sys
import urllib.parse


def trajectories(run):
    """(group id, injected at some turn, success) per training trajectory of the run."""
    path = os.path.join(run, "pool.sqlite")
    if not os.path.exists(path):
        sys.exit(f"{run}: no data pool (pool.sqlite); train the run with cairn train first")
    db = sqlite3.connect(f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT e.group_id, max(json_extract(v.json, '$.inject') != ''), e.success "
        "FROM episodes e JOIN turns t ON t.episode = e.id JOIN variants v ON v.id = t.variant "
        "WHERE e.source IN ('rollout', 'gateway') GROUP BY e.id ORDER BY e.id"
    ).fetchall()
    db.close()
    return [(g, bool(i), bool(s)) for g, i, s in rows]


def rate(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main(runs):
    print("| run | trajectories | with knowledge | success with | success without (same groups) | mixed groups |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        ts = trajectories(run)
        if not ts:
            sys.exit(f"{run}: the data pool holds no training trajectory")
        groups = {}
        for g, injected, success in ts:
            groups.setdefault(g, []).append((injected, success))
        mixed = [v for v in groups.values() if any(i for i, _ in v) and not all(i for i, _ in v)]
        with_k = [s for v in mixed for i, s in v if i]
        without = [s for v in mixed for i, s in v if not i]
        share = sum(1 for _, i, _ in ts if i) / len(ts)
        print(
            f"| {os.path.basename(run.rstrip('/'))} | {len(ts)} | {share:.1%} | "
            f"{rate(with_k):.1%} | {rate(without):.1%} | {len(mixed)} |"
        )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
