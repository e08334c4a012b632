#!/usr/bin/env bash
# The extra cost per RL step of teacher re-scoring (sdar, icsd, opid, ucob) against the base
# step of the estimator under them (grpo, gigpo), measured in one run of alternating rounds.
# See BENCHMARKS.md, "Teacher re-scoring".
#
#   scripts/bench/teacher.sh                          # 6 variants x 2 rounds of 4 RL steps (~25 min, 2 cores)
#   scripts/bench/teacher.sh --steps 6 --rounds 3 --variants grpo,sdar --threads 1
#   scripts/bench/teacher.sh --summary-only           # redo the table from OUT/*.json
#
# Options: --steps N (measured RL steps a run, default 4), --rounds R (2), --variants LIST
# (grpo,sdar,icsd,gigpo,opid,ucob), --threads T (libtorch threads, 2), --out DIR
# (target/bench/teacher), --no-build, --summary-only.
#
# Each variant is the household config of the self-distillation demonstration
# (scripts/self_distillation.py: the main job's config with the algorithm section replaced)
# run by `cairn-bench pipeline --backend torch`: the real trainer, actors and plugin `.so`s,
# with every backend call and plugin call timed. Round r plays the variants in order, round
# r + 1 in reverse; ratios are taken within a round. Per step: `wall_s`, `signals_s` (the
# algorithm's `signals`, which holds its teacher passes through `Host::score`), `score_s`
# (every backend `score` / `score_top_k`: ℓ_old and teacher passes), `generate_calls` and
# `backend_s` (rollout and reflection generation, scoring, the update). The first RL step of a
# run (no skills in the bank yet, lazy allocations) is left out of the medians.
# Results: OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=4
rounds=2
threads=2
variants="grpo,sdar,icsd,gigpo,opid,ucob"
out=target/bench/teacher
build=1
summary_only=0
source scripts/bench/args.sh
while [[ $# -gt 0 ]]; do
    case "$1" in
        --steps) value "$@"; steps="$2"; shift 2 ;;
        --rounds) value "$@"; rounds="$2"; shift 2 ;;
        --variants) value "$@"; variants="$2"; shift 2 ;;
        --threads) value "$@"; threads="$2"; shift 2 ;;
        --out) value "$@"; out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --summary-only) summary_only=1; build=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

source scripts/env.sh
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
if [[ $build == 1 ]]; then
    cargo build --release -p cairn-bench -p cairn-grpo -p cairn-gigpo -p cairn-household \
        -p cairn-sdar -p cairn-icsd -p cairn-opid -p cairn-ucob
fi
mkdir -p "$out"
if [[ $summary_only == 0 ]]; then
    # The household configs (seed 1); steps are the benchmark's own.
    python3 scripts/self_distillation.py configs --own-tokenizer --only household "$out/configs" "$steps" 1 > /dev/null
    IFS=, read -r -a names <<< "$variants"
    for ((r = 1; r <= rounds; r++)); do
        order=("${names[@]}")
        if ((r % 2 == 0)); then
            order=()
            for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
        fi
        for v in "${order[@]}"; do
            cfg="$out/configs/household/$v-seed1.toml"
            [[ -f $cfg ]] || { echo "unknown variant \`$v\` (no $cfg)" >&2; exit 2; }
            echo "== round $r: $v"
            target/release/cairn-bench pipeline --backend torch --config "$cfg" \
                --steps "$((steps + 1))" --threads "$threads" --run-dir "$out/runs/$v-r$r" \
                < /dev/null > "$out/$v-r$r.json" 2> "$out/$v-r$r.log" \
                || { echo "failed: see $out/$v-r$r.log" >&2; exit 1; }
        done
    done
fi
python3 - "$out" <<'PY' | tee "$out/results.md"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
base = {"sdar": "grpo", "icsd": "grpo", "opid": "gigpo", "ucob": "gigpo"}
runs = {}
for path in sorted(glob.glob(os.path.join(out, "*-r*.json"))):
    name, r = re.match(r"(.+)-r(\d+)\.json$", os.path.basename(path)).groups()
    try:
        steps = json.load(open(path))["steps"][1:]   # the first step allocates
    except (ValueError, KeyError) as e:
        sys.exit(f"{path}: not a `cairn-bench pipeline` result ({e!r}); rerun that variant")
    if steps:
        runs.setdefault(int(r), {})[name] = steps
if not runs:
    sys.exit(f"no results in {out} (expected VARIANT-rN.json files from a run of this script)")
def med(steps, key):
    return statistics.median(s[key] for s in steps)
print("| variant | base | rounds | step wall (s) | `signals` (s) | `score` (s) | score calls | generate calls | backend (s) | rows | step / base step | extra s per step |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
names = sorted({n for rr in runs.values() for n in rr}, key=lambda n: ("grpo", "gigpo", "sdar", "icsd", "opid", "ucob").index(n) if n in ("grpo", "gigpo", "sdar", "icsd", "opid", "ucob") else 9)
for n in names:
    rows = [rr[n] for rr in runs.values() if n in rr]
    b = base.get(n)
    ratios, extra = [], []
    for rr in runs.values():
        if n in rr and b in rr:
            ratios.append(med(rr[n], "wall_s") / med(rr[b], "wall_s"))
            extra.append(med(rr[n], "wall_s") - med(rr[b], "wall_s"))
    m = lambda key: statistics.median(med(s, key) for s in rows)
    ratio = f"{statistics.median(ratios):.2f}× ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios else "—"
    ex = f"{statistics.median(extra):+.2f}" if extra else "—"
    print(f"| {n} | {b or '—'} | {len(rows)} | {m('wall_s'):.2f} | {m('signals_s'):.3f} | {m('score_s'):.3f} | {m('score_calls'):.0f} | {m('generate_calls'):.0f} | {m('backend_s'):.2f} | {m('rows'):.0f} | {ratio} | {ex} |")
PY
