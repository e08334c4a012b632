#!/usr/bin/env python3
"""How much each scaffold method's knowledge was used, from recorded runs (docs/scaffolds.md).

    python3 scripts/scaffolds_report.py runs/scaffolds/edge-seed1 runs/scaffolds/pats-seed1 ...

Reads each run's `trajectories/step-*.json` (recorded with `run.record_trajectories`) and
prints, per run: the share of training trajectories that started with injected text (or got
it at a later turn), their success against the plain trajectories of the same groups, and the
number of groups where both kinds played. Only the standard library is used.
"""
import glob
import json
import os
import sys


def trajectories(run):
    """(group id, injected at some turn, success) per training trajectory of the run."""
    out = []
    for path in sorted(glob.glob(os.path.join(run, "trajectories", "step-*.json"))):
        with open(path) as f:
            rows = json.load(f)["rows"]
        by_traj = {}
        for r in rows:
            t = by_traj.setdefault(r["trajectory_id"], [r["group_id"], False, r["success"]])
            if r["variant"]["inject"]:
                t[1] = True
        out.extend(by_traj.values())
    return out


def rate(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main(runs):
    print("| run | trajectories | with knowledge | success with | success without (same groups) | mixed groups |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        ts = trajectories(run)
        if not ts:
            sys.exit(f"{run}: no recorded trajectories (was run.record_trajectories on?)")
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
