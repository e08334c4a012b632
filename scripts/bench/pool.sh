#!/usr/bin/env bash
# The data pool's costs on the default job (examples/household-grpo.toml): a short run of it
# (its RL steps write the pool as `cairn train` always does), then `cairn-bench pool`
# rewrites its steps into a scratch pool (timed, against the run's median `step_time_s`), reports the pool's size per 1,000 RL steps (extrapolated linearly from
# the short run: each step writes the same kind of rows), and times queries over 10^6
# synthetic turn rows. See docs/pool.md; results: OUT/pool.json.
#
#   scripts/bench/pool.sh                 # 10 RL steps, release build
#   scripts/bench/pool.sh --steps 20 --rows 2000000
#   scripts/bench/pool.sh --profile dev   # the (optimised) dev build, no release build
#   scripts/bench/pool.sh --run RUN_DIR   # measure a run already trained (no training here),
#                                         # e.g. `cairn train --steps 20 --run-dir RUN_DIR`
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=10
rows=1000000
profile=release
out=target/bench/pool
run=
source scripts/bench/args.sh
while [[ $# -gt 0 ]]; do
    case "$1" in
        --steps) value "$@"; steps="$2"; shift 2 ;;
        --rows) value "$@"; rows="$2"; shift 2 ;;
        --profile) value "$@"; profile="$2"; shift 2 ;;
        --out) value "$@"; out="$2"; shift 2 ;;
        --run) value "$@"; run="$2"; shift 2 ;;
        *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
source scripts/env.sh
if [[ $profile == release ]]; then
    cargo build --release -p cairn -p cairn-bench -p cairn-household -p cairn-grpo
    bin=target/release
else
    cargo build -p cairn -p cairn-bench -p cairn-household -p cairn-grpo
    bin=target/debug
fi
mkdir -p "$out"
if [[ -z $run ]]; then
    run="$out/run"
    # The default job with its run directory moved, fewer RL steps, and a 20-task evaluation
    # (evaluations do not write training rows; they only cost time here).
    "$bin/cairn" config | python3 -c '
import re, sys
run, steps = sys.argv[1], sys.argv[2]
text = sys.stdin.read()
text = re.sub(r"(?m)^dir = .*$", f"dir = \"{run}\"", text, count=1)
text = re.sub(r"(?m)^steps = .*$", f"steps = {steps}", text, count=1)
text = re.sub(r"(?m)^tasks = 200$", "tasks = 20", text, count=1)
print(text, end="")
    ' "$run" "$steps" > "$out/config.toml"
    echo "== cairn train ($steps RL steps of the default job)"
    "$bin/cairn" train "$out/config.toml" --no-resume
fi
echo "== cairn-bench pool"
"$bin/cairn-bench" pool --run "$run" --rows "$rows" --dir "$out/scratch" | tee "$out/pool.json"
