#!/usr/bin/env bash
# The actor pipeline on the household default (`examples/household-grpo.toml`): sync (k = 0)
# against async (`rollout.max_staleness = 1`), rollout log-prob reuse
# (`optimizer.reuse_rollout_logprobs = true`), and the bank actor's checkpoint snapshot
# (`cairn-bench bank-actor`). Every variant writes the data pool (sent by the optimizer, off
# the step's path; scripts/bench/pool.sh measures the write). See BENCHMARKS.md, "The actor
# pipeline".
#
#   scripts/bench/pipeline.sh                      # 3 variants x 2 rounds of 20 steps (~26 min, 2 cores)
#   scripts/bench/pipeline.sh --steps 30 --rounds 3 --variants sync,async
#   scripts/bench/pipeline.sh --full --rounds 0    # only the whole main job, at k = 1 and k = 0
#   scripts/bench/pipeline.sh --full-variants async --rounds 0   # the whole main job at k = 1
#   scripts/bench/pipeline.sh --start-round 3 --rounds 1   # one more round, named r3 (odd: in order)
#   scripts/bench/pipeline.sh --summary-only       # redo the tables from the run directories
#
# Variants: sync (the default config), async (max_staleness = 1), reuse
# (reuse_rollout_logprobs = true). Runs are sequential;
# round r plays the variants in order, round r + 1 in reverse, so slow drift of the machine's
# load falls on every variant alike; ratios are taken within a round. Every run is a fresh
# `cairn train --no-resume` (warm start, RL steps, held-out evaluations) in its own directory.
# OMP_WAIT_POLICY defaults to PASSIVE (see BENCHMARKS.md, "Threads and libgomp"): on a shared
# 2-core machine, and with two threads driving libtorch at k = 1, spinning waiters make the
# wall clock measure the scheduler. Results: OUT/results.md and OUT/results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=20
rounds=2
start_round=1
variants="sync,async,reuse"
full=0
full_variants="async,sync"
out=target/bench/pipeline
build=1
summary_only=0
source scripts/bench/args.sh
while [[ $# -gt 0 ]]; do
    case "$1" in
        --steps) value "$@"; steps="$2"; shift 2 ;;
        --rounds) value "$@"; rounds="$2"; shift 2 ;;
        --start-round) value "$@"; start_round="$2"; shift 2 ;;
        --variants) value "$@"; variants="$2"; shift 2 ;;
        --full) full=1; shift ;;
        --full-variants) full=1; value "$@"; full_variants="$2"; shift 2 ;;
        --out) value "$@"; out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --summary-only) summary_only=1; build=0; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

source scripts/env.sh
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
if [[ $build == 1 ]]; then
    cargo build --release -p cairn -p cairn-grpo -p cairn-household -p cairn-bench
fi
cairn=target/release/cairn
mkdir -p "$out"

# config VARIANT RUN_DIR: the default config with run.dir set and the variant's key added.
config() {
    local variant="$1" dir="$2"
    "$cairn" config | python3 -c '
import sys
variant, run_dir = sys.argv[1], sys.argv[2]
extra = {
    "sync": None,
    "async": ("[rollout]", "max_staleness = 1"),
    "reuse": ("[optimizer]", "reuse_rollout_logprobs = true"),
}[variant]
out, section = [], None
for line in sys.stdin.read().splitlines():
    if line.startswith("["):
        section = line.strip()
    if section == "[run]" and line.startswith("dir = "):
        line = "dir = \"%s\"" % run_dir
    out.append(line)
    if extra and line.strip() == extra[0]:
        out.append(extra[1])
print("\n".join(out))
' "$variant" "$dir"
}

# run VARIANT NAME [STEPS]: one `cairn train`, with the arrival time of every metrics line.
run() {
    local variant="$1" name="$2" n="${3:-}"
    local dir="$out/$name"
    rm -rf "$dir"
    mkdir -p "$dir.meta"
    config "$variant" "$dir" > "$dir.meta/config.toml"
    local args=(train "$dir.meta/config.toml" --no-resume)
    [[ -n $n ]] && args+=(--steps "$n")
    echo "== $name ($variant) $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "$variant" > "$dir.meta/variant"
    cut -d' ' -f1-3 /proc/loadavg > "$dir.meta/load_start"
    /usr/bin/time -v -o "$dir.meta/time.txt" "$cairn" "${args[@]}" \
        > "$dir.meta/stdout.log" 2> "$dir.meta/stderr.log" &
    local pid=$! seen=0 lines
    : > "$dir.meta/arrivals"
    while kill -0 "$pid" 2> /dev/null; do
        lines=$(wc -l 2> /dev/null < "$dir/metrics.jsonl" || echo 0)
        if [[ $lines != "$seen" ]]; then
            echo "$(date +%s.%N) $lines" >> "$dir.meta/arrivals"
            seen=$lines
        fi
        sleep 0.5
    done
    wait "$pid" || { echo "run $name failed; see $dir.meta/stderr.log" >&2; return 1; }
    cut -d' ' -f1-3 /proc/loadavg > "$dir.meta/load_end"
}

if [[ $summary_only == 0 ]]; then
    if [[ $full == 1 ]]; then
        IFS=, read -r -a flist <<< "$full_variants"
        for v in "${flist[@]}"; do run "$v" "full-$v"; done
    fi
    IFS=, read -r -a list <<< "$variants"
    for ((r = start_round; r < start_round + rounds; r++)); do
        order=("${list[@]}")
        if ((r % 2 == 0)); then
            order=()
            for ((i = ${#list[@]} - 1; i >= 0; i--)); do order+=("${list[$i]}"); done
        fi
        for v in "${order[@]}"; do run "$v" "$v-r$r" "$steps"; done
    done
    # The bank actor's checkpoint snapshot, timed directly.
    if [[ -x target/release/cairn-bench ]]; then
        echo "== bank-actor"
        target/release/cairn-bench bank-actor --repeats 20 \
            --dir "$out/bank-actor" > "$out/bank-actor.json"
    fi
fi

python3 - "$out" << 'EOF'
import json, os, re, statistics, sys
out = sys.argv[1]

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def load(name):
    d = os.path.join(out, name)
    meta = d + ".meta"
    rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    rl = [r for r in rows if r.get("phase") == "rl"]
    v = lambda k: [r.get(k) for r in rl]
    evals = {}
    if os.path.exists(os.path.join(d, "eval.jsonl")):
        for l in open(os.path.join(d, "eval.jsonl")):
            e = json.loads(l)
            evals[e["label"]] = e["success_rate"]
    # Wall clock per RL step: arrival times of the RL metrics lines (checkpoints included).
    arrivals = [tuple(map(float, l.split())) for l in open(os.path.join(meta, "arrivals"))]
    first_rl = len(rows) - len(rl) + 1
    t = [ts for ts, n in arrivals if n >= first_rl]
    wall_step = (t[-1] - t[0]) / (len(rl) - 1) if len(rl) > 1 and len(t) > 1 else None
    time_txt = open(os.path.join(meta, "time.txt")).read()
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", time_txt)
    parts = [float(p) for p in m.group(1).split(":")] if m else []
    wall = sum(p * 60 ** i for i, p in enumerate(reversed(parts))) if parts else None
    cpu = sum(float(re.search(p + r": (\S+)", time_txt).group(1))
              for p in (r"User time \(seconds\)", r"System time \(seconds\)"))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_txt).group(1))
    step = med(v("step_time_s")); roll = med(v("rollout_time_s")); train = med(v("train_time_s"))
    # step - rollout - train: ℓ_old / ℓ_ref scoring, signals, metrics (k = 0 only: at k = 1
    # the step's rollout ran during the previous step and step_time_s is the wait plus this).
    other = med([s - r - tr for s, r, tr in zip(v("step_time_s"), v("rollout_time_s"),
                                                v("train_time_s")) if None not in (s, r, tr)])
    if any(x for x in v("staleness/max")):
        other = None
    return dict(name=name, variant=open(os.path.join(meta, "variant")).read().strip(),
                steps=len(rl), step_s=step, rollout_s=roll, train_s=train, other_s=other,
                wall_step_s=wall_step, wall_s=wall, cpu_s=cpu, rss_mib=rss / 1024,
                mismatch_mean=med(v("logprob_mismatch/mean_abs")),
                mismatch_max=max([x for x in v("logprob_mismatch/max_abs") if x is not None],
                                 default=None),
                mismatch_tokens=med(v("logprob_mismatch/tokens")),
                staleness_mean=med(v("staleness/mean")),
                rows_dropped=sum(x or 0 for x in v("staleness/rows_dropped")),
                rows=med(v("rows/count")),
                success_train=med(v("success_rate")),
                evals=evals,
                load=open(os.path.join(meta, "load_start")).read().split()[0] + "→" +
                     (open(os.path.join(meta, "load_end")).read().split()[0]
                      if os.path.exists(os.path.join(meta, "load_end")) else "?"))

names = sorted(n[:-5] for n in os.listdir(out) if n.endswith(".meta")
               and os.path.exists(os.path.join(out, n, "time.txt")))
runs = {}
for n in names:
    try:
        runs[n] = load(n)
    except Exception as e:  # an unfinished run: report and skip
        print(f"skipping {n}: {e}", file=sys.stderr)

def f(x, d=3):
    if x is None:
        return "—"
    return f"{x:.{d}g}" if abs(x) < 1000 else f"{x:.0f}"

def pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"

lines = ["| run | load | RL steps | rows / step | step s | rollout s | train s | step − rollout − train s | wall s / step | run wall s | CPU s | peak RSS MiB | ℓ_old mismatch mean / max | held-out success |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
for n, r in runs.items():
    ev = " → ".join(pct(x) for x in r["evals"].values())
    mm = "—" if r["mismatch_mean"] is None else f'{r["mismatch_mean"]:.2g} / {r["mismatch_max"]:.2g}'
    lines.append(f'| {n} | {r["load"]} | {r["steps"]} | {f(r["rows"], 4)} | {f(r["step_s"])} | {f(r["rollout_s"])} | {f(r["train_s"])} | '
                 f'{f(r["other_s"])} | {f(r["wall_step_s"])} | {f(r["wall_s"])} | {f(r["cpu_s"])} | {f(r["rss_mib"])} | {mm} | {ev} |')

# Ratios within a round, against that round's sync run.
ratio_lines = ["", "| variant / sync (same round) | step s | wall s / step | train s | step − rollout − train s | rounds |", "|---|---:|---:|---:|---:|---:|"]
by_round = {}
for n, r in runs.items():
    m = re.match(r"(\w+)-r(\d+)$", n)
    if m:
        by_round.setdefault(m.group(2), {})[m.group(1)] = r
ratios = {}
for rnd, vs in by_round.items():
    base = vs.get("sync")
    if not base:
        continue
    for v, r in vs.items():
        if v == "sync":
            continue
        for k in ("step_s", "wall_step_s", "train_s", "other_s"):
            if r[k] is not None and base[k]:
                ratios.setdefault(v, {}).setdefault(k, []).append(r[k] / base[k])
full = {n[5:]: r for n, r in runs.items() if n.startswith("full-")}
if "sync" in full:
    for v, r in full.items():
        if v != "sync":
            for k in ("step_s", "wall_step_s", "train_s", "other_s"):
                if r[k] is not None and full["sync"][k]:
                    ratios.setdefault(f"full {v}", {}).setdefault(k, []).append(r[k] / full["sync"][k])
for v, ks in ratios.items():
    cell = lambda k: "—" if k not in ks else (
        f"**{statistics.median(ks[k]):.3f}×** ({min(ks[k]):.3f}–{max(ks[k]):.3f})")
    ratio_lines.append(f'| {v} | {cell("step_s")} | {cell("wall_step_s")} | {cell("train_s")} | '
                       f'{cell("other_s")} | {len(ks["step_s"])} |')

bank = os.path.join(out, "bank-actor.json")
bank_lines = []
if os.path.exists(bank):
    b = json.loads(open(bank).read())
    bank_lines = ["", f'bank actor ({b["repeats"]} round trips): CheckpointBank (empty bank) '
                  f'{1e3 * b["checkpoint_bank_empty_median_s"]:.2f} ms (median)']
text = "\n".join(lines + ratio_lines + bank_lines) + "\n"
open(os.path.join(out, "results.md"), "w").write(text)
json.dump({"runs": runs, "ratios": ratios}, open(os.path.join(out, "results.json"), "w"), indent=1)
print(text)
EOF
