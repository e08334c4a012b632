#!/usr/bin/env python3
"""Tool calls and accuracy of search-qa runs, from their data pools (`cairn pool export`).

For each run directory: the held-out evaluations (success rate and search calls per episode,
after the warm start and after RL) and the training rollouts of the last half of the RL steps
(success rate and search calls per trajectory, tools-on and tool-free slots apart, and the
refused searches of tool-free slots). Runs are grouped by method (the directory name before
`-s<seed>`), with mean ± sample std over seeds.

    python3 plugins/search-qa/scripts/report.py runs/search-qa-compare/*-s?
"""

import argparse
import collections
import json
import re
import statistics
import subprocess


def export(cairn, run, **filters):
    args = [cairn, "pool", "export", run, "--format", "batch"]
    for key, value in filters.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["rows"] if out.strip() else []


def trajectories(rows):
    """(tools on?, success, search calls, refused searches) per trajectory."""
    by = collections.defaultdict(list)
    for r in rows:
        by[r["trajectory_id"]].append(r)
    out = []
    for turns in by.values():
        out.append((turns[0]["variant"].get("tools_enabled", True),
                    any(t["success"] for t in turns),
                    sum(t["tool_calls"] for t in turns),
                    sum(1 for t in turns if t["info"].get("refused_tool_call"))))
    return out


def rate(items, index):
    return sum(i[index] for i in items) / len(items) if items else float("nan")


def summarise(cairn, run):
    metrics = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    rl = [m for m in metrics if m["phase"] == "rl"]
    steps = len(rl)
    s = {}
    for label in ["after_warm_start", "after_rl"]:
        t = trajectories(export(cairn, run, source=f"eval:{label}"))
        s[f"{label}/accuracy"] = rate(t, 1)
        s[f"{label}/searches"] = rate(t, 2)
    late = []
    for step in range(steps // 2, steps):
        late += trajectories(export(cairn, run, source="rollout", step_min=step, step_max=step))
    on = [t for t in late if t[0]]
    off = [t for t in late if not t[0]]
    s["train/accuracy_tools_on"] = rate(on, 1)
    s["train/searches_tools_on"] = rate(on, 2)
    if off:
        s["train/accuracy_tool_free"] = rate(off, 1)
        s["train/refused_tool_free"] = rate(off, 3)
    s["steps"] = steps
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--cairn", default="target/debug/cairn")
    p.add_argument("--json", action="store_true", help="one JSON line per run")
    args = p.parse_args()
    by_method = collections.defaultdict(list)
    for run in args.runs:
        s = summarise(args.cairn, run)
        if args.json:
            print(json.dumps({"run": run, **s}))
        method = re.sub(r"-s\d+$", "", run.rstrip("/").split("/")[-1])
        by_method[method].append(s)
    keys = ["after_warm_start/accuracy", "after_rl/accuracy", "after_rl/searches",
            "train/accuracy_tools_on", "train/searches_tools_on", "train/accuracy_tool_free",
            "train/refused_tool_free"]
    print("| method | seeds | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for method, runs in by_method.items():
        cells = []
        for k in keys:
            values = [r[k] for r in runs if k in r]
            if not values:
                cells.append("—")
            elif len(values) == 1:
                cells.append(f"{values[0]:.3f}")
            else:
                cells.append(f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}")
        print(f"| {method} | {len(runs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
